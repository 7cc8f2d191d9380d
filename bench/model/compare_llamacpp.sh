#!/usr/bin/env bash
# Side by side on one GGUF file: pagedattn against llama.cpp, interleaved.
#   bench/model/compare_llamacpp.sh MODEL.gguf LLAMA_CPP_BIN_DIR [rounds]
# LLAMA_CPP_BIN_DIR holds llama-bench and llama-batched-bench, built outside
# this repository (docs/benchmarks.md says how). Three measurements, each
# round running pagedattn then llama.cpp:
#   decode   single stream, 128 new tokens (pagedattn generate; llama-bench tg128)
#   prefill  a 512-token prompt (bench-serve, 1 request; llama-bench pp512)
#   batch32  32 sequences x (prompt 128, output 128) at once: output tokens
#            over the whole run (bench-serve; llama-batched-bench -npl 32)
set -euo pipefail
model=$1 llama=$2 rounds=${3:-2}
tool=$(dirname "$0")/../../build/release/tools/pagedattn
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
line = lambda p, o: json.dumps({"prompt_len": p, "output_len": o, "n": 1, "arrival": 0}) + "\n"
open(f"{w}/batch32.jsonl", "w").write(line(128, 128) * 32)
open(f"{w}/prefill512.jsonl", "w").write(line(512, 1))
PY
prompt="Write a long story about a robot who learns to paint, with many details."
for round in $(seq "$rounds"); do
  echo "== round $round"
  "$tool" generate --model "$model" --prompt "$prompt" --max-tokens 128 --ignore-eos 2>&1 >/dev/null |
    sed 's/^/pagedattn decode: /'
  "$llama/llama-bench" -m "$model" -t 2 -p 0 -n 128 -r 1 2>/dev/null | grep tg128 | sed 's/^/llama.cpp decode: /'
  "$tool" bench-serve --model "$model" --workload "$work/prefill512.jsonl" | grep -E "TTFT" |
    sed 's/^/pagedattn prefill512: /'
  "$llama/llama-bench" -m "$model" -t 2 -p 512 -n 0 -r 1 2>/dev/null | grep pp512 | sed 's/^/llama.cpp prefill: /'
  "$tool" bench-serve --model "$model" --workload "$work/batch32.jsonl" --max-num-seqs 32 |
    grep -E "output tokens/s|steps" | sed 's/^/pagedattn batch32: /'
  "$llama/llama-batched-bench" -m "$model" -t 2 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32 2>/dev/null |
    grep -E "^\|\s+128" | sed 's/^/llama.cpp batch32: /'
done
