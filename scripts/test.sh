#!/usr/bin/env bash
# Builds and runs every test: Release, a downstream project built against the
# installed package, the Python package (pytest), then the unit tests again
# under ASan + UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
jobs=$(nproc)

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

echo "== Python package: pip install . (one Release build of the library) + pytest"
scripts/test_python.sh

echo "== ASan + UBSan build and tests"
cmake --preset asan >/dev/null
cmake --build --preset asan -j "$jobs"
ctest --preset asan -j "$jobs"
