#!/usr/bin/env bash
# The CUDA backend's whole check on a machine with an NVIDIA GPU, in one
# command of a few minutes: every CUDA test, the kernel tests again under
# compute-sanitizer memcheck, the GPU benchmark beside torch's SDPA on the
# same card, and one summary at the end.
#
#   scripts/gpu_check.sh --bundle [DIR]
#       On any machine with nvcc and the project's build dependencies (this
#       repository's CI image): builds the CUDA test and benchmark programs
#       in build/release and copies them, with the shared libraries they
#       load that a bare GPU machine may lack, into DIR (default
#       build/gpu-bundle, well under 64 MiB).
#   scripts/gpu_check.sh [DIR]
#       From the repository root on the GPU machine: runs the programs of
#       DIR (default build/gpu-bundle); where DIR does not exist, first builds
#       them there with `cmake --preset release` (which needs the project's
#       build dependencies, see scripts/deps.sh).
#
# Results go to $OUT (or build/gpu-check) as gpu_check.log, tests.xml,
# bench.jsonl and sdpa.jsonl. The exit status is 0 only when every test ran
# and passed and memcheck found nothing.
set -uo pipefail
cd "$(dirname "$0")/.."

programs=(pagedattn_cuda_tests pagedattn_bench_cuda)
program_paths=(tests/cuda/pagedattn_cuda_tests bench/cuda/pagedattn_bench_cuda)

build_programs() {  # build_programs: the CUDA programs in build/release
  cmake --preset release -DPAGEDATTN_CUDA=ON >/dev/null &&
    cmake --build --preset release --target "${programs[@]}" -j "$(nproc)"
}

if [ "${1:-}" = "--bundle" ]; then
  bundle=${2:-build/gpu-bundle}
  set -e
  build_programs
  rm -rf "$bundle" && mkdir -p "$bundle/lib"
  for path in "${program_paths[@]}"; do cp "build/release/$path" "$bundle/"; done
  # The libraries a GPU image may not have (Highway, GCC's OpenMP and C++
  # runtimes); libc, libm and the CUDA driver come from that machine.
  for program in "${programs[@]}"; do
    ldd "$bundle/$program" | awk '/=> \// {print $3}' |
      grep -E 'lib(hwy|gomp|stdc\+\+|gcc_s)' | xargs -r -I{} cp -L {} "$bundle/lib/"
  done
  du -sh "$bundle"
  exit 0
fi

bundle=${1:-build/gpu-bundle}
out=${OUT:-build/gpu-check}
mkdir -p "$out"
log=$out/gpu_check.log
: >"$log"
say() { echo "$@" | tee -a "$log"; }

if [ ! -x "$bundle/pagedattn_cuda_tests" ]; then
  say "== no bundle in $bundle: building the CUDA programs here"
  if ! build_programs >>"$log" 2>&1; then
    say "build failed (see $log): run 'scripts/gpu_check.sh --bundle' on a machine with the"
    say "project's build dependencies and bring build/gpu-bundle along"
    exit 2
  fi
  bundle=build/gpu-bundle
  mkdir -p "$bundle"
  for path in "${program_paths[@]}"; do cp "build/release/$path" "$bundle/"; done
fi
export LD_LIBRARY_PATH="$PWD/$bundle/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"

say "== device"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee -a "$log"

say "== CUDA tests"
timeout 300 "$bundle/pagedattn_cuda_tests" --gtest_output="xml:$out/tests.xml" >>"$log" 2>&1
tests_status=$?
tests_line=$(grep -E '^\[  PASSED  \]|^\[  FAILED  \]|^\[  SKIPPED \] [0-9]' "$log" | tr '\n' ' ')
say "tests exit $tests_status: $tests_line"
# With a GPU only the test of planning without one may skip.
not_passed=$(grep -E '^\[  (FAILED|SKIPPED) \] Cuda[A-Za-z.]*$' "$log" | sort -u |
  grep -v 'CudaPlan.PlanningWithoutADeviceNeedsTheSmCount')
if [ -n "$not_passed" ]; then
  say "$not_passed"
  [ "$tests_status" -ne 0 ] || tests_status=4
fi

say "== compute-sanitizer memcheck (kernel tests)"
# Every kernel-launching suite, with the attention matrix's fixed cases
# rather than its 120 random ones (memcheck slows kernels many times over).
memcheck_filter='CudaAttention.EveryDtypeTripleMatchesReference:CudaAttention.LatentShapesMatchReference'
memcheck_filter+=':CudaAttention.SplitKvMatchesOnePass:CudaMergeStates.*:CudaDecodeKernel.*'
memcheck_filter+=':CudaAppendPagedKv.*:CudaCopyPages.*:CudaSwapPages.*:CudaApplyRope.*'
memcheck_filter+=':CudaKVCache.*:CudaOrtOp.*:CudaVllmOp.*'
sanitizer=$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)
timeout 300 "$sanitizer" --tool memcheck --error-exitcode 3 \
  "$bundle/pagedattn_cuda_tests" --gtest_filter="$memcheck_filter" >"$out/memcheck.log" 2>&1
memcheck_status=$?
say "memcheck exit $memcheck_status: $(grep -E 'ERROR SUMMARY' "$out/memcheck.log" | tail -n 1)"

say "== Python (pagedattn.cuda with torch)"
# The bundle cannot carry the Python module (it is built for the building
# machine's Python); where this machine's python3 imports an installed
# pagedattn with CUDA, its tests and the decode-loop example run.
python_status=skipped
if python3 -c 'import pagedattn.cuda' >/dev/null 2>&1; then
  timeout 300 python3 -m pytest -q -p no:cacheprovider python/tests/test_cuda.py >>"$log" 2>&1 &&
    timeout 120 python3 examples/python/cuda_decode_loop.py >>"$log" 2>&1
  python_status=$?
  say "python exit $python_status"
else
  say "python: not run (python3 here has no pagedattn built with CUDA: pip install . first)"
fi

say "== benchmark"
timeout 180 "$bundle/pagedattn_bench_cuda" --json "$out/bench.jsonl" 2>&1 | tee -a "$log"
if command -v python3 >/dev/null; then
  timeout 180 python3 bench/cuda/sdpa_peer.py --json "$out/sdpa.jsonl" 2>&1 | tee -a "$log"
fi

say "== summary"
say "tests: exit $tests_status; $tests_line"
say "memcheck: exit $memcheck_status"
say "python: $python_status"
cases=$(grep -E '^case=' "$log")
say "$cases"
[ "$tests_status" -eq 0 ] && [ "$memcheck_status" -eq 0 ]
