#!/usr/bin/env bash
# Side by side on one GGUF file: pagedattn against llama.cpp, interleaved.
#   bench/model/compare_llamacpp.sh MODEL.gguf LLAMA_CPP_BIN_DIR [rounds [FLAG...]]
# LLAMA_CPP_BIN_DIR holds llama-bench and llama-batched-bench, built outside
# this repository (docs/benchmarks.md says how). Three measurements, each
# round running pagedattn then llama.cpp:
#   decode   single stream, 128 new tokens (pagedattn generate; llama-bench tg128)
#   prefill  a 512-token prompt (bench-serve: TTFT p50 of 3 prompts run one
#            at a time; llama-bench pp512, after its warm-up)
#   batch32  32 sequences x (prompt 128, output 128) at once: output tokens
#            over the whole run (bench-serve; llama-batched-bench -npl 32)
# FLAGs go to each pagedattn run (e.g. --bf16-products, --int8-activations).
set -euo pipefail
model=$1 llama=$2 rounds=${3:-2}
flags=("${@:4}")
tool=$(dirname "$0")/../../build/release/tools/pagedattn
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 - "$work" <<'PY'
import json, sys
w = sys.argv[1]
line = lambda p, o, t=0: json.dumps({"prompt_len": p, "output_len": o, "n": 1, "arrival": t}) + "\n"
open(f"{w}/batch32.jsonl", "w").write(line(128, 128) * 32)
# Three prompts 2 s apart, each alone in the engine: TTFT p50 is a warm one,
# as llama-bench times pp512 after a warm-up run.
open(f"{w}/prefill512.jsonl", "w").write("".join(line(512, 1, t) for t in (0, 2, 4)))
PY
prompt="Write a long story about a robot who learns to paint, with many details."
for round in $(seq "$rounds"); do
  echo "== round $round"
  "$tool" generate "${flags[@]}" --model "$model" --prompt "$prompt" --max-tokens 128 --ignore-eos 2>&1 >/dev/null |
    sed 's/^/pagedattn decode: /'
  "$llama/llama-bench" -m "$model" -t 2 -p 0 -n 128 -r 1 2>/dev/null | grep tg128 | sed 's/^/llama.cpp decode: /'
  "$tool" bench-serve "${flags[@]}" --model "$model" --workload "$work/prefill512.jsonl" | grep -E "TTFT" |
    sed 's/^/pagedattn prefill512: /'
  "$llama/llama-bench" -m "$model" -t 2 -p 512 -n 0 -r 1 2>/dev/null | grep pp512 | sed 's/^/llama.cpp prefill: /'
  "$tool" bench-serve "${flags[@]}" --model "$model" --workload "$work/batch32.jsonl" --max-num-seqs 32 |
    grep -E "output tokens/s|steps" | sed 's/^/pagedattn batch32: /'
  "$llama/llama-batched-bench" -m "$model" -t 2 -c 16384 -b 2048 -ub 512 -npp 128 -ntg 128 -npl 32 2>/dev/null |
    grep -E "^\|\s+128" | sed 's/^/llama.cpp batch32: /'
done
