#!/usr/bin/env bash
# Issue 37's many-core figures in one command, for a machine lent for a few
# minutes (a GPU machine's 16 host cores, docs/benchmarks.md "Scaling over
# threads"): thread scaling of bench-serve (with where each decode step's
# time goes) and bench-attention, the `1b` preset's decode step against its
# bounds, SmolLM2 at 16 threads under each wait and binding policy, a step's
# products in a region each against one region, this build against an
# earlier one (BASE_BIN), the int8 tiles on AMX-INT8 against AVX512-VNNI,
# the layers in teams against
# a region per piece, products' column chunks shared between the threads or
# not, the team's own barrier or OpenMP's, prefill's products on oneDNN
# against OpenBLAS and
# dot_tiles, and pagedattn serve against llama-server on SmolLM2.
#
#   scripts/cpu_scaling_device.sh --bundle [DIR]
#       Here, after a Release build: copies build/release/tools/pagedattn,
#       build/release/bench/pagedattn_bench_quant and the shared libraries
#       they load (xz-compressed; the device image lacks most), llama-server
#       builds with their libraries (LLAMA_BINS, folders of llama-server and
#       its lib*.so*, tried in order on the device until one serves:
#       default build/peers/llama-bin-{avx512,avx2}: the Sapphire Rapids
#       build never answered on the lent Xeon, and oneDNN's library leaves
#       no room for it; see
#       bench/peers/README.md) and SmolLM2 packed by bench/peers/gguf_tile.py
#       into DIR (default build/cpu-bundle), under the 64 MiB a call carries.
#       SMOLLM2 names the GGUF file (default: the test model,
#       scripts/get_test_model.sh). BASE_BIN names an earlier build's
#       pagedattn to carry as well, for the `ab` part. With GPU_CHECK=1, build/gpu-bundle
#       (`scripts/gpu_check.sh --bundle`) goes along too. MOE names
#       mixture-of-experts GGUF files (separated by spaces) to carry packed
#       as well (MOE_FRACTION, default 0.005, of their rows: the files of
#       bench/peers/README.md, build/peers/moe-Q4_K_M.gguf at Qwen3-30B-A3B's
#       layer shapes and build/peers/ds-Q4_K_M.gguf at DeepSeek-V2-Lite's
#       with latent attention, pack to about 8 MiB each; fewer LLAMA_BINS
#       may then be needed).
#   scripts/cpu_scaling_device.sh [DIR]
#       There, from the repository root: unpacks DIR, runs everything, writes
#       $OUT/results.tar.gz (each run's output) and $OUT/summary.md.
#       SCALING_THREADS (default 2,4,8,16) and STREAMS (default "1 64") change
#       the thread counts and the comparison's concurrency levels. Where DIR
#       holds the GPU bundle, the CUDA check (scripts/gpu_check.sh) runs last,
#       into $OUT/gpu, in what is left of DEADLINE seconds (default 570) since
#       the start: one lease of a GPU machine serves both. PARTS (default
#       "ab amx scaling-smollm2 scaling-small 1b policies paths regions teams sharing barrier attention
#       moe onednn llama")
#       runs only the parts it names; `moe` runs where the bundle holds MoE
#       files.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--bundle" ]; then
  set -e
  bundle=${2:-build/cpu-bundle}
  read -r -a llamas <<<"${LLAMA_BINS:-build/peers/llama-bin-avx512 build/peers/llama-bin-avx2}"
  rm -rf "$bundle" && mkdir -p "$bundle"
  xz -T0 -6 -c build/release/tools/pagedattn >"$bundle/pagedattn.xz"
  xz -T0 -6 -c build/release/bench/pagedattn_bench_quant >"$bundle/bench_quant.xz"
  if [ -n "${BASE_BIN:-}" ]; then xz -T0 -6 -c "$BASE_BIN" >"$bundle/pagedattn-base.xz"; fi
  # Everything but the C library, which the machine has (and must match its
  # kernel and loader).
  ldd build/release/tools/pagedattn build/release/bench/pagedattn_bench_quant \
    "${llamas[0]}/llama-server" | awk '/=> \// {print $3}' |
    grep -v -E '/lib(c|m|dl|pthread|rt)\.so' | grep -v "${llamas[0]}" | sort -u |
    xargs tar -chf - --transform 's,.*/,lib/,' 2>/dev/null | xz -T0 -6 >"$bundle/lib.tar.xz"
  for dir in "${llamas[@]}"; do
    tar -chf - -C "$dir" llama-server $(cd "$dir" && ls lib*.so.0 libllama-server-impl.so) |
      xz -T0 -6 >"$bundle/$(basename "$dir").tar.xz"
    basename "$dir" >>"$bundle/llama-order.txt"  # the order to try them in
  done
  python3 bench/peers/gguf_tile.py pack "${SMOLLM2:-$(scripts/get_test_model.sh)}" \
    "$bundle/smollm2.pack" --fraction "${SMOLLM2_FRACTION:-0.2}"
  moe_index=0
  for moe_file in ${MOE:-}; do
    moe_index=$((moe_index + 1))
    python3 bench/peers/gguf_tile.py pack "$moe_file" "$bundle/moe$moe_index.pack" \
      --fraction "${MOE_FRACTION:-0.005}"
  done
  if [ "${GPU_CHECK:-0}" = 1 ]; then
    tar -cf - -C build gpu-bundle | xz -T0 -6 >"$bundle/gpu-bundle.tar.xz"
  fi
  du -sh "$bundle"
  if [ "$(du -sb "$bundle" | cut -f1)" -gt $((64 << 20)) ]; then
    echo "cpu_scaling_device: $bundle is over the 64 MiB a call carries (fewer LLAMA_BINS," \
      "or a smaller SMOLLM2_FRACTION)" >&2
    exit 1
  fi
  exit 0
fi

bundle=${1:-build/cpu-bundle}
out=${OUT:-build/cpu-scaling}
work=$(mktemp -d)  # the unpacked bundle and every run's output
results=$work/results
mkdir -p "$out" "$results"
summary=$out/summary.md
say() { echo "$@" | tee -a "$summary"; }
# streams_workload N FILE: a bench-serve trace of N requests of 128 + 128
# tokens, all at once.
streams_workload() {
  python3 -c "import json, sys; n = int(sys.argv[1]); print(''.join(json.dumps({'prompt_len': 128, 'output_len': 128, 'n': 1}) + '\n' for _ in range(n)), end='')" \
    "$1" >"$2"
}
# say_run LABEL FILE: a bench-serve run's throughput, decode step and its
# phases on one line of the summary.
say_run() {
  say "$1: $(grep -E 'output tokens/s|decode steps|of which|layer teams|pagedattn: int8' "$2" | tr -s ' ' | tr '\n' ';')"
}
: >"$summary"

mkdir -p "$work/bundle/lib"
tar -xJf "$bundle/lib.tar.xz" -C "$work/bundle"
python3 bench/peers/gguf_tile.py unpack "$bundle/smollm2.pack" "$work/bundle/smollm2.gguf"
moe_models=()
for moe_pack in "$bundle"/moe*.pack; do
  [ -f "$moe_pack" ] || continue
  moe_models+=("$work/bundle/$(basename "$moe_pack" .pack).gguf")
  python3 bench/peers/gguf_tile.py unpack "$moe_pack" "${moe_models[-1]}"
done
export LD_LIBRARY_PATH="$work/bundle/lib"
bin="$work/bundle/pagedattn"
xz -dc "$bundle/pagedattn.xz" >"$bin"
chmod +x "$bin"
base_bin=""
if [ -f "$bundle/pagedattn-base.xz" ]; then
  base_bin="$work/bundle/pagedattn-base"
  xz -dc "$bundle/pagedattn-base.xz" >"$base_bin"
  chmod +x "$base_bin"
fi
bench_quant="$work/bundle/pagedattn_bench_quant"
xz -dc "$bundle/bench_quant.xz" >"$bench_quant"
chmod +x "$bench_quant"
model="$work/bundle/smollm2.gguf"

say "# Many-core run, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
lscpu >"$results/lscpu.txt"
say '```'
grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node|L3|MHz' "$results/lscpu.txt" | tee -a "$summary"
OPENBLAS_VERBOSE=2 "$bin" --help 2>&1 | grep -i core | tee -a "$summary"  # the kernels OpenBLAS chose
grep -o -w -E 'amx_tile|amx_bf16|amx_int8|avx512_fp16|avx512_bf16|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ' |
  tee -a "$summary"
say '```'

step() {  # title command...: one part, its time and its status
  local title=$1 start=$SECONDS
  shift
  echo "== $title" >&2
  "$@"
  say "- $title: exit $?, $((SECONDS - start)) s"
  # What came back so far, should a later part run out of time.
  tar -czf "$out/results.tar.gz" -C "$(dirname "$results")" results
}

run_scaling() {  # name limit flags...: bench/scaling.sh over the thread counts
  local name=$1 limit=$2
  shift 2
  timeout "$limit" bench/scaling.sh --pagedattn "$bin" --threads "${SCALING_THREADS:-2,4,8,16}" \
    --out "$results/$name" --plot "$results/$name.png" "$@" >"$results/$name.md"
  local status=$?
  cat "$results/$name.md" >>"$summary"
  cp "$results/$name.png" "$out/" 2>/dev/null
  return $status
}
run_1b() {
  OMP_NUM_THREADS=16 timeout 60 "$bin" bench-serve --model 1b --workload alpaca-like \
    --num-requests 16 --probes --json "$results/1b-16.json" >"$results/1b-16.txt" 2>&1
  local status=$?
  grep -E 'output tokens/s|decode steps|of which|bounds|roofline' "$results/1b-16.txt" >>"$summary"
  return $status
}
# SmolLM2 at 16 threads: the default (spin, then sleep; threads adapt to
# others' use), --pin-threads, passive waiting (every thread, asleep
# between regions) and active waiting (every thread spinning between regions).
run_policies() {
  local flags=(--model "$model" --workload alpaca-like --num-requests 64)
  for policy in default pinned passive active; do
    case $policy in
      default) OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" ;;
      pinned) OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" --pin-threads ;;
      passive) OMP_WAIT_POLICY=passive OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" ;;
      active) OMP_WAIT_POLICY=active OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" ;;
    esac >"$results/policy-$policy.txt" 2>&1
    say_run "policy $policy" "$results/policy-$policy.txt"
  done
}
# SmolLM2 at 16 threads on each product path: the default (int8
# activations in decode steps of 8 or more sequences where they time
# faster, PAGEDATTN_LOG_PRODUCT_PATHS=1 printing the timing), f32 throughout
# (--exact-products), bf16 products for batches (--bf16-products), int8
# activations in every step (--int8-activations): which fast path pays on
# this CPU; then prefill attention by default against --exact-products.
run_paths() {
  local flags=(--model "$model" --workload alpaca-like --num-requests 64) path
  for path in default --exact-products --bf16-products --int8-activations; do
    local extra=()
    [ "$path" = default ] || extra=("$path")
    PAGEDATTN_LOG_PRODUCT_PATHS=1 \
    OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" "${extra[@]}" \
      >"$results/path$path.txt" 2>&1
    say_run "path $path" "$results/path$path.txt"
  done
  # Prefill attention by default (bf16 tiles, AMX where present, where timed
  # faster) against f32 products, 512 queries over 4,096 keys of f16 K/V.
  local hd line
  for hd in 128 64; do
    line=""
    for path in default --exact-products; do
      extra=()
      [ "$path" = default ] || extra=("$path")
      OMP_NUM_THREADS=16 timeout 30 "$bin" bench-attention --no-check --no-probe --mode prefill \
        --kv-dtype f16 --head-dim "$hd" --kv-len 4096 --q-len 512 --seconds 1 "${extra[@]}" \
        >"$results/prefill$hd$path.txt" 2>&1
      line="$line $path: $(grep -o -E 'median [0-9.]+ ms' "$results/prefill$hd$path.txt");"
    done
    say "prefill attention, head dim $hd, 16 threads:$line"
  done
}
# A decode step's 120 layer products (SmolLM2's shapes, Q4_1), a parallel
# region per product against one region with a barrier after each
# (BM_LayerProducts): whether fusing a layer's regions pays on this many cores.
run_regions() {
  local threads
  local list=${SCALING_THREADS:-2,4,8,16}
  for threads in 1 ${list//,/ }; do
    OMP_NUM_THREADS=$threads timeout 40 "$bench_quant" --benchmark_filter=LayerProducts \
      --benchmark_min_time=0.2 >"$results/regions-$threads.txt" 2>&1
    say "regions, $threads threads: $(grep -o -E 'rows:[0-9]+/one_region:[01] +[0-9.]+ ms' \
      "$results/regions-$threads.txt" | tr -s ' ' | tr '\n' ';')"
  done
}
# SmolLM2 at 16 threads, its layers in teams (the default: one region a
# step, attention and the LM head included) against a region per product,
# norm and RoPE and the cache's own attention (PAGEDATTN_TEAMS=0),
# alternated twice; then once more in deterministic mode (Python LLM's
# default), whose steps run in teams too.
run_teams() {
  local flags=(--model "$model" --workload alpaca-like --num-requests 64) round teams mode
  for mode in default deterministic; do
    local extra=()
    [ "$mode" = deterministic ] && extra=(--deterministic)
    for round in 1 2; do
      [ "$mode" = deterministic ] && [ "$round" = 2 ] && break
      for teams in 0 1; do
        local out="$results/teams$teams-$mode-$round.txt"
        PAGEDATTN_TEAMS=$teams OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" \
          "${extra[@]}" >"$out" 2>&1
        say_run "teams $teams, $mode, round $round" "$out"
      done
    done
  done
}
# At 16 threads, a decode product's threads taking the chunks of a slower
# thread's columns (the default) against each keeping its own
# (PAGEDATTN_SHARE_CHUNKS=0), alternated twice on SmolLM2 and once on the
# `1b` preset: what the barriers' waits lose to the threads' unequal speed.
run_sharing() {
  local round share
  for round in 1 2; do
    for share in 0 1; do
      local out="$results/share$share-$round.txt"
      PAGEDATTN_SHARE_CHUNKS=$share OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve \
        --model "$model" --workload alpaca-like --num-requests 64 >"$out" 2>&1
      say_run "share chunks $share, SmolLM2, round $round" "$out"
    done
  done
  for share in 0 1; do
    PAGEDATTN_SHARE_CHUNKS=$share OMP_NUM_THREADS=16 timeout 60 "$bin" bench-serve --model 1b \
      --workload alpaca-like --num-requests 16 >"$results/share$share-1b.txt" 2>&1
    say_run "share chunks $share, 1b" "$results/share$share-1b.txt"
  done
}
# At 2 to 16 threads, a team's own barrier (core/team.h, the default)
# against OpenMP's (PAGEDATTN_TEAM_BARRIER=0): BM_TeamBarrier's us per
# piece; the busiest of 16 threads in SmolLM2's o and down products, 4-column
# granules against whole int8 groups with left-over rows cut
# (BM_Int8BusiestThread, one core); one of 16 threads' share of a SmolLM2
# layer's int8 products with cold weights, with and without asking for the
# next chunk's first group (BM_Int8LayerShare, one core); then SmolLM2 at
# 16 threads, 64 requests and one stream, alternated twice.
# alternate_settings NAME TRACE LABEL VAR VALUE...: SmolLM2 at 16 threads
# with VAR set to each VALUE in turn, two rounds: 64 alpaca-like requests,
# then the trace TRACE (LABEL in the summary).
alternate_settings() {
  local name=$1 trace=$2 label=$3 var=$4 round value out
  shift 4
  for round in 1 2; do
    for value in "$@"; do
      out="$results/$name-${value:-none}-$round"
      env "$var=$value" OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve --model "$model" \
        --workload alpaca-like --num-requests 64 >"$out.txt" 2>&1
      say_run "$var=$value, SmolLM2, 64 requests, round $round" "$out.txt"
      env "$var=$value" OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve --model "$model" \
        --workload "$trace" >"$out-trace.txt" 2>&1
      say_run "$var=$value, SmolLM2, $label, round $round" "$out-trace.txt"
    done
  done
}
run_barrier() {
  local threads
  for threads in 2 4 8 16; do
    OMP_NUM_THREADS=$threads timeout 30 "$bench_quant" --benchmark_filter=BM_TeamBarrier \
      --benchmark_min_time=0.3 2>/dev/null | grep -E '^BM_' >>"$summary"
  done
  OMP_NUM_THREADS=1 timeout 30 "$bench_quant" --benchmark_min_time=0.1 \
    --benchmark_filter='BM_Int8BusiestThread/q5_0/.*/rows:(12|32)/threads:16' 2>/dev/null |
    grep -E '^BM_' >>"$summary"
  OMP_NUM_THREADS=1 timeout 60 "$bench_quant" --benchmark_min_time=0.1 --benchmark_repetitions=3 \
    --benchmark_enable_random_interleaving=true --benchmark_report_aggregates_only=true \
    --benchmark_filter='BM_Int8LayerShare/q5_0/.*/threads:16' 2>/dev/null | grep -E '_median' >>"$summary"
  streams_workload 1 "$results/one-stream.jsonl"
  alternate_settings barrier "$results/one-stream.jsonl" "one stream" PAGEDATTN_TEAM_BARRIER 0 1
}
# The int8 tiles on AMX-INT8 against AVX512-VNNI (where the CPU has AMX):
# their products on one thread (BM_Int8TileKind, Q4_1 and Q5_0), then
# SmolLM2 at 16 threads, 64 requests and 32 streams, with amx_int8 switched
# off and on, alternated twice.
run_amx() {
  OMP_NUM_THREADS=1 timeout 60 "$bench_quant" --benchmark_min_time=0.1 \
    --benchmark_filter='BM_Int8TileKind/(q4_1|q5_0)/.*/rows:(8|16|64)/' 2>/dev/null |
    grep -E '^BM_' >>"$summary"
  streams_workload 32 "$results/amx-s32.jsonl"
  alternate_settings amx "$results/amx-s32.jsonl" "32 streams" PAGEDATTN_DISABLE_FEATURES amx_int8 ""
}
# The bundle's pagedattn against an earlier build of it (BASE_BIN at
# --bundle) at 16 threads, alternated twice: SmolLM2 at 64 requests, one
# stream and 8 streams, and the `1b` preset at 16 requests.
run_ab() {
  [ -n "$base_bin" ] || { say "ab: the bundle holds no base binary (BASE_BIN=... at --bundle)"; return 0; }
  local round side streams exe
  for streams in 1 8; do
    streams_workload "$streams" "$results/ab-s$streams.jsonl"
  done
  for round in 1 2; do
    for side in base head; do
      exe=$bin
      [ "$side" = base ] && exe=$base_bin
      OMP_NUM_THREADS=16 timeout 30 "$exe" bench-serve --model "$model" --workload alpaca-like \
        --num-requests 64 >"$results/ab-$side-$round.txt" 2>&1
      say_run "$side, SmolLM2, 64 requests, round $round" "$results/ab-$side-$round.txt"
      for streams in 1 8; do
        OMP_NUM_THREADS=16 timeout 30 "$exe" bench-serve --model "$model" \
          --workload "$results/ab-s$streams.jsonl" >"$results/ab-$side-s$streams-$round.txt" 2>&1
        say_run "$side, SmolLM2, $streams streams, round $round" "$results/ab-$side-s$streams-$round.txt"
      done
      [ "$round" = 1 ] || continue
      OMP_NUM_THREADS=16 timeout 60 "$exe" bench-serve --model 1b --workload alpaca-like \
        --num-requests 16 >"$results/ab-$side-1b.txt" 2>&1
      say_run "$side, 1b" "$results/ab-$side-1b.txt"
    done
  done
}
# Each mixture-of-experts file: 1 and 32 streams of 128 + 128 tokens on 2
# and 16 threads (every thread takes a share of all the experts' columns),
# then both at 16 threads in teams and with a region per piece (latent
# attention's absorbed form runs in the team).
run_moe() {
  [ ${#moe_models[@]} -gt 0 ] || { say "moe: the bundle holds no MoE file (MOE=... at --bundle)"; return 0; }
  local model name streams threads teams
  for streams in 1 32; do
    streams_workload "$streams" "$results/moe-s$streams.jsonl"
  done
  for model in "${moe_models[@]}"; do
    name=$(basename "$model" .gguf)
    for streams in 1 32; do
      for threads in 2 16; do
        OMP_NUM_THREADS=$threads timeout 60 "$bin" bench-serve --model "$model" \
          --workload "$results/moe-s$streams.jsonl" >"$results/$name-s$streams-t$threads.txt" 2>&1
        say_run "$name, $streams streams, $threads threads" "$results/$name-s$streams-t$threads.txt"
      done
    done
    for streams in 1 32; do
      for teams in 0 1; do
        PAGEDATTN_TEAMS=$teams OMP_NUM_THREADS=16 timeout 60 "$bin" bench-serve --model "$model" \
          --workload "$results/moe-s$streams.jsonl" >"$results/$name-s$streams-teams$teams.txt" 2>&1
        say_run "$name, $streams streams, 16 threads, teams $teams" "$results/$name-s$streams-teams$teams.txt"
      done
    done
  done
}
# One short sequence's decode attention over 1-16 threads: latent attention
# (DeepSeek-V2-Lite's 16 heads, V3's 128) and 32 x 8 heads of 128, whose one
# tile plan_attention cuts into a part per thread (chunks down to 64 keys)
# and whose merges go out in row blocks; then SmolLM2's alpaca-like decode
# step (12 sequences of about 80 keys, 9 x 3 heads of 64), whose attention
# in the model hardly shrinks from 4 to 16 threads: the kernel alone. Last,
# issue 37's item 4 at 16 threads: long-context f16 decode against the paged
# read probe in the same minutes, and the kernel's rate from cache (the
# share of the stream it keeps follows from the two: docs/benchmarks.md,
# "What decode keeps of the stream").
run_attention() {
  local shape t line index=0 list=${SCALING_THREADS:-2,4,8,16}
  for shape in "--heads 16x1 --head-dim 576 --mla 512 --kv-dtype bf16 --kv-len 384 --batch 1" \
    "--heads 128x1 --head-dim 576 --mla 512 --kv-dtype bf16 --kv-len 384 --batch 1" \
    "--heads 32x8 --head-dim 128 --kv-dtype f16 --kv-len 1000 --batch 1" \
    "--heads 9x3 --head-dim 64 --kv-dtype f16 --kv-len 80 --batch 12"; do
    line=""
    index=$((index + 1))
    for t in 1 ${list//,/ }; do
      timeout 20 "$bin" bench-attention $shape --threads "$t" --no-probe \
        --seconds 0.5 >"$results/attention$index-$t.txt" 2>&1
      line="$line $t: $(grep -o -E 'median [0-9.]+ ms' "$results/attention$index-$t.txt");"
    done
    say "attention, $shape:$line"
  done
  timeout 60 "$bin" bench-attention --batch 16 --kv-len 4096 --threads 16 --seconds 4 \
    --interleave-probe 4 --no-check >"$results/attention-stream.txt" 2>&1
  timeout 30 "$bin" bench-attention --hot --batch 16 --kv-len 256 --threads 16 --seconds 2 \
    --no-probe --no-check >"$results/attention-hot.txt" 2>&1
  say "attention, f16 32x8 b16 x 4k, 16 threads: $(grep -o -E 'median [0-9.]+%' "$results/attention-stream.txt");" \
    "from cache (b16 x 256): $(grep -o -E 'K\+V read: [0-9.]+ GB/s' "$results/attention-hot.txt")"
}
# Prefill's products on oneDNN (f32, and bf16 on AMX tiles where the CPU
# has them) against OpenBLAS and dot_tiles (PAGEDATTN_ONEDNN=0), one thread
# (BM_Batch, 16-2,048 rows), then SmolLM2's 2,000-token first token at 16
# threads, exact and with --bf16-products (whose line carries the bf16
# routes' timing on this CPU, Bf16Routes).
run_onednn() {
  local onednn flags=(--model "$model" --workload "$results/prefill2k.jsonl") extra
  python3 -c 'import json; print("".join(json.dumps({"prompt_len": 2000, "output_len": 1, "n": 1, "arrival": t}) + "\n" for t in (0, 2, 4)), end="")' \
    >"$results/prefill2k.jsonl"
  for onednn in 1 0; do
    OMP_NUM_THREADS=1 PAGEDATTN_ONEDNN=$onednn timeout 60 "$bench_quant" --benchmark_min_time=0.1 \
      --benchmark_filter='BM_Batch/(q4_k|q8_0)/.*/rows:(16|32|64|128|256|512|2048)/path:(0|2)' \
      >"$results/onednn$onednn-batch.txt" 2>&1
    say "BM_Batch, oneDNN $onednn: $(grep -o -E 'q[48]_[0k]/out:[0-9]+/in:[0-9]+/rows:[0-9]+/path:[02] +[0-9.]+ us' \
      "$results/onednn$onednn-batch.txt" | tr -s ' ' | tr '\n' ';')"
    for extra in "" --bf16-products; do
      PAGEDATTN_ONEDNN=$onednn OMP_NUM_THREADS=16 timeout 30 "$bin" bench-serve "${flags[@]}" $extra \
        >"$results/onednn$onednn$extra.txt" 2>&1
      say "first token, oneDNN $onednn ${extra:-exact}: $(grep -E "TTFT|prefill's|bf16 products on" "$results/onednn$onednn$extra.txt" | tr -s ' ' | tr '\n' ';')"
    done
  done
}
# The first llama-server build that starts and answers on this CPU.
pick_llama() {
  local name archive dir port pid
  for name in $(cat "$bundle/llama-order.txt"); do
    archive=$bundle/$name.tar.xz
    dir=$work/bundle/$name
    mkdir -p "$dir" && tar -xJf "$archive" -C "$dir"
    port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
    LD_LIBRARY_PATH=$dir:$work/bundle/lib "$dir/llama-server" -m "$model" --port "$port" -t 16 \
      -c 2048 >"$results/$(basename "$dir").log" 2>&1 &
    pid=$!
    if python3 - "$port" <<'PY'; then
import json, sys, time, urllib.request
url = f"http://127.0.0.1:{sys.argv[1]}"
for _ in range(60):
    try:
        urllib.request.urlopen(url + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.5)
body = json.dumps({"prompt": "Hello", "max_tokens": 4}).encode()
req = urllib.request.Request(url + "/v1/completions", body, {"Content-Type": "application/json"})
urllib.request.urlopen(req, timeout=30).read()
PY
      kill "$pid"; wait "$pid" 2>/dev/null
      llama=$dir
      say "- llama-server: $(basename "$dir") serves here"
      return 0
    fi
    kill "$pid" 2>/dev/null; wait "$pid" 2>/dev/null
    say "- llama-server: $(basename "$dir") does not serve here ($(tail -c 200 "$results/$(basename "$dir").log" | tr '\n' ' '))"
  done
  return 1
}
run_llama() {
  pick_llama || return 1
  LD_LIBRARY_PATH=$llama:$work/bundle/lib PAGEDATTN="$bin" STREAMS="${STREAMS:-1 64}" \
    RESULTS_DIR="$results/llama" timeout 120 bench/serve/compare_llama_server.sh "$model" \
    "$llama/llama-server" 16 1 >"$results/llama.md" 2>"$results/llama.log"
  local status=$?
  cat "$results/llama.md" >>"$summary"
  return $status
}
# PARTS picks some parts by name (default: all, in this order).
parts=" ${PARTS:-ab amx scaling-smollm2 scaling-small 1b policies paths regions teams sharing barrier attention moe onednn llama} "
part() { [[ $parts == *" $1 "* ]]; }
part ab && step "this build against BASE_BIN's, 16 threads, SmolLM2 and 1b" run_ab
part amx && step "int8 tiles on AMX-INT8 or AVX512-VNNI: one thread's products, SmolLM2 at 16 threads" \
  run_amx
part scaling-smollm2 && step "scaling, SmolLM2 tiled (bench/scaling.sh)" \
  run_scaling scaling-smollm2 75 --model "$model" --workload alpaca-like --num-requests 64
part scaling-small && step "scaling, small preset (bench/scaling.sh)" run_scaling scaling 60
part 1b && step "1b preset, 16 threads (bench-serve --probes)" run_1b
part policies && step "SmolLM2, 16 threads: default, --pin-threads, passive and active waiting" \
  run_policies
part paths && step "SmolLM2, 16 threads: default, --exact-products, --bf16-products, --int8-activations; prefill attention" \
  run_paths
part regions && step "layer products: a region each or one for all (BM_LayerProducts)" run_regions
part teams && step "SmolLM2, 16 threads: layers in teams or a region per piece" run_teams
part sharing && step "SmolLM2 and 1b, 16 threads: products' chunks shared or not" run_sharing
part barrier && step "the team's own barrier or OpenMP's: BM_TeamBarrier 2-16 threads, SmolLM2 at 16" \
  run_barrier
part attention && step "decode attention, one sequence and SmolLM2's step, 1-16 threads (bench-attention)" \
  run_attention
part moe && step "MoE files (tiled): 2 and 16 threads, 1 and 32 streams; teams at 16" run_moe
part onednn && step "prefill's products: oneDNN against OpenBLAS and dot_tiles" run_onednn
part llama && step "serve against llama-server, 16 threads, SmolLM2 tiled" run_llama

if [ -f "$bundle/gpu-bundle.tar.xz" ]; then
  mkdir -p build && tar -xJf "$bundle/gpu-bundle.tar.xz" -C build
  left=$((${DEADLINE:-570} - SECONDS - 5))
  if ((left > 30)); then
    step "CUDA check (scripts/gpu_check.sh, ${left} s left)" \
      env OUT="$out/gpu" timeout "$left" scripts/gpu_check.sh build/gpu-bundle
  else
    say "- CUDA check: skipped, ${left} s left"
  fi
fi
cat "$summary"
