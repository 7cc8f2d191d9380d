#!/usr/bin/env bash
# Builds everything (Release) and runs the main job. Extra arguments go to the
# `pagedattn` tool (default: `bench-serve`, the continuous-batching engine
# serving a built-in workload; `demo` tours the cache).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
exec build/release/tools/pagedattn "${@:-bench-serve}"
