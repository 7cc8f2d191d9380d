#!/usr/bin/env bash
# Builds everything (Release) and runs the main job. With no arguments: the
# test model (SmolLM2-135M-Instruct, fetched by scripts/get_test_model.sh)
# answers a chat prompt with `pagedattn generate`, then `pagedattn
# bench-serve` serves a workload on it through the continuous-batching engine.
# Extra arguments go to the `pagedattn` tool instead (`bench-serve`, `demo`,
# `generate --model FILE.gguf --prompt TEXT`, ...).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
cmake --preset release >/dev/null
cmake --build --preset release -j "$(nproc)"
tool=build/release/tools/pagedattn
[ $# -gt 0 ] && exec "$tool" "$@"
model=$(scripts/get_test_model.sh)
"$tool" generate --model "$model" --chat --max-tokens 96 \
  --prompt "Explain in two sentences why LLM servers page their KV cache."
exec "$tool" bench-serve --model "$model"
