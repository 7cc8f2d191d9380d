#!/usr/bin/env bash
# Runs every libFuzzer harness of fuzz/ (preset `sanitize`: clang, ASan + UBSan)
# for a share of a time budget, starting from its seed corpus in
# fuzz/corpus/<harness>/. Fails on the first crash, leak, sanitizer report or
# broken invariant; the reproducer is left in build/sanitize/fuzz-artifacts/.
#   scripts/fuzz.sh [total_seconds]   (default 60; e.g. 3600 for a long run)
# New inputs that widen coverage go to build/sanitize/fuzz-corpus/<harness>/ (not the
# repository); copy interesting small ones into fuzz/corpus/ by hand.
set -euo pipefail
cd "$(dirname "$0")/.."
total_seconds=${1:-60}

harnesses=()
for dir in fuzz/corpus/*/; do harnesses+=("$(basename "$dir")"); done

cmake --preset sanitize >/dev/null
cmake --build --preset sanitize -j "$(nproc)" --target "${harnesses[@]}"
seconds_each=$(( total_seconds / ${#harnesses[@]} ))
(( seconds_each >= 1 )) || seconds_each=1

export OMP_NUM_THREADS=1  # the harnesses use small shapes; threads only add noise
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:suppressions=$PWD/tests/ubsan.supp
mkdir -p build/sanitize/fuzz-artifacts
for name in "${harnesses[@]}"; do
  echo "== fuzz $name for ${seconds_each}s"
  work_corpus=build/sanitize/fuzz-corpus/$name
  mkdir -p "$work_corpus"
  max_len=512
  [ "$name" = fuzz_gguf ] && max_len=131072  # whole small model files (its seeds are ~30-80 KB)
  build/sanitize/fuzz/"$name" -max_total_time="$seconds_each" -max_len="$max_len" -timeout=20 \
    -rss_limit_mb=2048 -print_final_stats=1 -artifact_prefix=build/sanitize/fuzz-artifacts/"$name"- \
    "$work_corpus" fuzz/corpus/"$name" 2>&1 | grep -v "^#[0-9]" || { echo "fuzz: $name failed" >&2; exit 1; }
done
echo "fuzz: every harness ran without a failure"
