#!/usr/bin/env bash
# Builds and runs every test: Release (GCC), downstream C++ and pure-C projects
# built against the installed package, the Python package (pytest), the unit
# tests again under ASan + UBSan, a clang Release build with its tests, and
# each libFuzzer harness for a bounded time (scripts/fuzz.sh, 60 s in all).
# Tests over the real test model (SmolLM2-135M-Instruct, fetched from PyPI by
# scripts/get_test_model.sh) find it through PAGEDATTN_TEST_MODEL.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)
PAGEDATTN_TEST_MODEL=$(scripts/get_test_model.sh)
export PAGEDATTN_TEST_MODEL

echo "== Release build and tests"
cmake --preset release >/dev/null
cmake --build --preset release -j "$jobs"
ctest --preset release -j "$jobs"

echo "== install + downstream find_package(pagedattn) example"
prefix=$(mktemp -d)
trap 'rm -rf "$prefix"' EXIT
cmake --install build/release --prefix "$prefix" >/dev/null
cmake -S examples/downstream -B build/downstream -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/downstream
build/downstream/downstream_example
cmake -S examples/downstream_c -B build/downstream_c -G Ninja -DCMAKE_PREFIX_PATH="$prefix" >/dev/null
cmake --build build/downstream_c
build/downstream_c/downstream_c_example

echo "== Python package: pip install . (one Release build of the library) + pytest"
scripts/test_python.sh

echo "== ASan + UBSan build and tests"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
# The SmolLM2 end-to-end tests run in the Release and clang builds; under ASan
# their ~10^11 multiply-adds would take most of CI's time.
ctest --preset asan -j "$jobs" -LE pagedattn_realmodel_tests

echo "== clang Release build and tests"
cmake --preset clang-release >/dev/null
cmake --build --preset clang-release -j "$jobs"
ctest --preset clang-release -j "$jobs"

echo "== libFuzzer harnesses (clang, ASan + UBSan): the seed corpora, then 60 s of fuzzing"
scripts/fuzz.sh 60
