#!/usr/bin/env bash
# Issue 37's many-core figures in one command, for a machine lent for a few
# minutes (a GPU machine's 16 host cores, docs/benchmarks.md "Scaling over
# threads"): thread scaling of bench-serve and bench-attention, the `1b`
# preset's decode step against its bounds, and pagedattn serve against
# llama-server on SmolLM2.
#
#   scripts/cpu_scaling_device.sh --bundle [DIR]
#       Here, after a Release build: copies build/release/tools/pagedattn,
#       the shared libraries it loads (xz-compressed; the device image lacks
#       most), llama-server with its libraries from LLAMA_BUILD (default
#       build/peers/llama-build-spr, a build with GGML_NATIVE=OFF for the
#       device's CPU, docs/benchmarks.md says how) and SmolLM2 packed by
#       bench/peers/gguf_tile.py into DIR (default build/cpu-bundle), under
#       the 64 MiB a call carries. SMOLLM2 names the GGUF file (default: the
#       test model, scripts/get_test_model.sh). Where build/gpu-bundle exists
#       (`scripts/gpu_check.sh --bundle`), it goes along too.
#   scripts/cpu_scaling_device.sh [DIR]
#       There, from the repository root: unpacks DIR, runs everything, writes
#       $OUT/results.tar.gz (each run's output) and $OUT/summary.md.
#       SCALING_THREADS (default 1,2,4,8,16) and STREAMS (default "1 16 64")
#       change the thread counts and the comparison's concurrency levels.
#       Where DIR holds the GPU bundle, the CUDA check (scripts/gpu_check.sh)
#       runs last, into $OUT/gpu, in what is left of DEADLINE seconds
#       (default 570) since the start: one lease of a GPU machine serves both.
set -uo pipefail
cd "$(dirname "$0")/.."

if [ "${1:-}" = "--bundle" ]; then
  set -e
  bundle=${2:-build/cpu-bundle}
  llama=${LLAMA_BUILD:-build/peers/llama-build-spr}
  rm -rf "$bundle" && mkdir -p "$bundle"
  xz -T0 -6 -c build/release/tools/pagedattn >"$bundle/pagedattn.xz"
  # Everything but the C library, which the machine has (and must match its
  # kernel and loader).
  ldd build/release/tools/pagedattn "$llama/bin/llama-server" | awk '/=> \// {print $3}' |
    grep -v -E '/lib(c|m|dl|pthread|rt)\.so' | grep -v "$llama" | sort -u |
    xargs tar -chf - --transform 's,.*/,lib/,' 2>/dev/null | xz -T0 -6 >"$bundle/lib.tar.xz"
  tar -chf - -C "$llama/bin" llama-server $(cd "$llama/bin" && ls lib*.so.0 libllama-server-impl.so 2>/dev/null) |
    xz -T0 -6 >"$bundle/llama.tar.xz"
  python3 bench/peers/gguf_tile.py pack "${SMOLLM2:-$(scripts/get_test_model.sh)}" \
    "$bundle/smollm2.pack" --fraction "${SMOLLM2_FRACTION:-0.25}"
  if [ -d build/gpu-bundle ]; then
    tar -cf - -C build gpu-bundle | xz -T0 -6 >"$bundle/gpu-bundle.tar.xz"
  fi
  du -sh "$bundle"
  exit 0
fi

bundle=${1:-build/cpu-bundle}
out=${OUT:-build/cpu-scaling}
results=$(mktemp -d)/results
mkdir -p "$out" "$results"
summary=$out/summary.md
say() { echo "$@" | tee -a "$summary"; }
: >"$summary"

mkdir -p /tmp/cpu-bundle/lib /tmp/cpu-bundle/llama
tar -xJf "$bundle/lib.tar.xz" -C /tmp/cpu-bundle
tar -xJf "$bundle/llama.tar.xz" -C /tmp/cpu-bundle/llama
python3 bench/peers/gguf_tile.py unpack "$bundle/smollm2.pack" /tmp/cpu-bundle/smollm2.gguf
export LD_LIBRARY_PATH=/tmp/cpu-bundle/lib:/tmp/cpu-bundle/llama
bin=/tmp/cpu-bundle/pagedattn
xz -dc "$bundle/pagedattn.xz" >"$bin"
chmod +x "$bin" /tmp/cpu-bundle/llama/llama-server

say "# Many-core run, $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
lscpu >"$results/lscpu.txt"
say '```'
grep -E 'Model name|^CPU\(s\)|Thread|Core|Socket|NUMA node|L3|MHz' "$results/lscpu.txt" | tee -a "$summary"
grep -o -w -E 'amx_tile|amx_bf16|amx_int8|avx512_fp16|avx512_bf16|avx512_vnni' /proc/cpuinfo | sort -u | tr '\n' ' ' |
  tee -a "$summary"
say '```'

step() {  # title command...: one part, its time and its status
  local title=$1 start=$SECONDS
  shift
  echo "== $title" >&2
  "$@"
  say "- $title: exit $?, $((SECONDS - start)) s"
}

run_scaling() {  # name limit flags...: bench/scaling.sh over the thread counts
  local name=$1 limit=$2
  shift 2
  timeout "$limit" bench/scaling.sh --pagedattn "$bin" --threads "${SCALING_THREADS:-1,2,4,8,16}" \
    --out "$results/$name" --plot "$results/$name.png" "$@" >"$results/$name.md"
}
run_1b() {
  OMP_NUM_THREADS=16 timeout 90 "$bin" bench-serve --model 1b --workload alpaca-like --num-requests 16 \
    --probes --json "$results/1b-16.json" >"$results/1b-16.txt" 2>&1
}
run_llama() {
  PAGEDATTN="$bin" STREAMS="${STREAMS:-1 16 64}" RESULTS_DIR="$results/llama" \
    timeout 150 bench/serve/compare_llama_server.sh /tmp/cpu-bundle/smollm2.gguf \
    /tmp/cpu-bundle/llama/llama-server 16 2 >"$results/llama.md" 2>"$results/llama.log"
}
step "scaling, small preset (bench/scaling.sh)" run_scaling scaling 150
step "scaling, SmolLM2 tiled (bench/scaling.sh)" run_scaling scaling-smollm2 150 \
  --model /tmp/cpu-bundle/smollm2.gguf --workload alpaca-like --num-requests 64
step "1b preset, 16 threads (bench-serve --probes)" run_1b
step "serve against llama-server, 16 threads, SmolLM2 tiled" run_llama

for f in scaling.md scaling-smollm2.md llama.md; do
  say ""
  cat "$results/$f" >>"$summary"
done
say ""
grep -E 'output tokens/s|decode steps|bounds|roofline' "$results/1b-16.txt" >>"$summary"
cp "$results/scaling.png" "$results/scaling-smollm2.png" "$out/" 2>/dev/null
tar -czf "$out/results.tar.gz" -C "$(dirname "$results")" results
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
