#!/usr/bin/env bash
# Runs every libFuzzer harness of fuzz/ (preset `sanitize`: clang, ASan + UBSan)
# for a share of a wall-time budget, starting from its seed corpus in
# fuzz/corpus/<harness>/. The harnesses are single-threaded, so one runs per
# core (FUZZ_JOBS, default nproc): with H harnesses and J cores each gets
# total_seconds / ceil(H / J). Fails on any crash, leak, sanitizer report or
# broken invariant; the reproducer is left in build/sanitize/fuzz-artifacts/.
#   scripts/fuzz.sh [total_seconds]   (default 60; e.g. 3600 for a long run)
#   scripts/fuzz.sh --each SECONDS    every harness for SECONDS, whatever the cores
# New inputs that widen coverage go to build/sanitize/fuzz-corpus/<harness>/ (not the
# repository); copy interesting small ones into fuzz/corpus/ by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
total_seconds=${1:-60}
seconds_each=
if [ "$total_seconds" = --each ]; then seconds_each=${2:?"--each needs a number of seconds"}; fi
parallel=${FUZZ_JOBS:-$(nproc)}

harnesses=()
for dir in fuzz/corpus/*/; do harnesses+=("$(basename "$dir")"); done

cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$(nproc)" --target "${harnesses[@]}"
if [ -z "$seconds_each" ]; then
  rounds=$(( (${#harnesses[@]} + parallel - 1) / parallel ))
  seconds_each=$(( total_seconds / rounds ))
fi
(( seconds_each >= 1 )) || seconds_each=1

export OMP_NUM_THREADS=1  # the harnesses use small shapes; threads only add noise
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/ubsan.supp
logs=build/sanitize/fuzz-logs
mkdir -p build/sanitize/fuzz-artifacts "$logs"

# fuzz_one NAME: runs one harness into $logs/NAME.log; its exit status is the run's.
fuzz_one() {
  local name=$1 work_corpus=build/sanitize/fuzz-corpus/$1 max_len=512
  mkdir -p "$work_corpus"
  [ "$name" = fuzz_gguf ] && max_len=131072  # whole small model files (its seeds are ~30-80 KB)
  build/sanitize/fuzz/"$name" -max_total_time="$seconds_each" -max_len="$max_len" -timeout=20 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build/sanitize/fuzz-artifacts/"$name"- \
    "$work_corpus" fuzz/corpus/"$name" >"$logs/$name.log" 2>&1
}

echo "fuzz: ${#harnesses[@]} harnesses, $parallel at a time, ${seconds_each}s each"
declare -A pid_of
for name in "${harnesses[@]}"; do
  while (( $(jobs -rp | wc -l) >= parallel )); do wait -n || true; done
  fuzz_one "$name" &
  pid_of[$name]=$!
done
failed=()
for name in "${harnesses[@]}"; do
  status=0
  wait "${pid_of[$name]}" || status=$?
  echo "== fuzz $name (exit $status)"
  grep -v "^#[0-9]" "$logs/$name.log" || true
  (( status == 0 )) || failed+=("$name")
done
if (( ${#failed[@]} > 0 )); then
  echo "fuzz: failed: ${failed[*]} (inputs in build/sanitize/fuzz-artifacts/)" >&2
  exit 1
fi
echo "fuzz: every harness ran without a failure"
