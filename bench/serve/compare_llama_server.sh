#!/usr/bin/env bash
# End to end over HTTP: `pagedattn serve` against llama.cpp's llama-server on
# one GGUF file, both driven by the same client (pagedattn bench-serve --url).
#   bench/serve/compare_llama_server.sh MODEL.gguf LLAMA_SERVER_BIN [threads] [rounds]
# LLAMA_SERVER_BIN is llama-server, built outside this repository
# (docs/benchmarks.md says how). Both servers get `threads` CPU threads
# (default 2), 32 sequences at once and room for 32 x 512 tokens of context.
# For each concurrency (1, 8, 32 streams) and round, bench-serve runs the same
# trace (2 x streams requests, at least 4, of 128 prompt tokens and 128 output
# tokens, ignore_eos) against pagedattn, then llama-server; then a table of
# output tokens/s and TTFT p50/p99 with the ratios pagedattn / llama-server.
# PAGEDATTN_CPU_LOCK, when set, names a file each measurement holds with
# `flock -x` (so that other jobs on the machine stay out of the timings).
set -euo pipefail
model=$1 llama_server=$2 threads=${3:-2} rounds=${4:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=${PAGEDATTN:-$root/build/release/tools/pagedattn}
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
wait_healthy() {  # port name log
  for _ in $(seq 600); do
    curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.5
  done
  echo "compare_llama_server: $2 did not come up; its log:" >&2
  tail -20 "$3" >&2
  exit 1
}
exclusive() {
  if [ -n "${PAGEDATTN_CPU_LOCK:-}" ]; then flock -x "$PAGEDATTN_CPU_LOCK" "$@"; else "$@"; fi
}

p_port=$(free_port)
OMP_NUM_THREADS=$threads "$tool" serve --model "$model" --host 127.0.0.1 --port "$p_port" \
  --max-num-seqs 32 --max-model-len 512 >"$work/pagedattn.log" 2>&1 &
pids+=($!)
l_port=$(free_port)
"$llama_server" -m "$model" --host 127.0.0.1 --port "$l_port" -t "$threads" -tb "$threads" \
  -np 32 -c $((512 * 32)) --cont-batching >"$work/llama.log" 2>&1 &
pids+=($!)
wait_healthy "$p_port" "pagedattn serve" "$work/pagedattn.log"
wait_healthy "$l_port" llama-server "$work/llama.log"

python3 - "$work" <<'PY'
import json, sys
line = lambda p, o: json.dumps({"prompt_len": p, "output_len": o}) + "\n"
for c in (1, 8, 32):
    open(f"{sys.argv[1]}/c{c}.jsonl", "w").write(line(128, 128) * max(4, 2 * c))
open(f"{sys.argv[1]}/warmup.jsonl", "w").write(line(16, 8))
PY

bench() {  # name port concurrency round
  exclusive "$tool" bench-serve --url "http://127.0.0.1:$2" --concurrency "$3" \
    --workload "$work/c$3.jsonl" --json "$work/$1-c$3-r$4.json" >"$work/$1-c$3-r$4.txt" 2>/dev/null ||
    { echo "compare_llama_server: bench-serve against $1 failed:" >&2; cat "$work/$1-c$3-r$4.txt" >&2; exit 1; }
}
for port in "$p_port" "$l_port"; do
  "$tool" bench-serve --url "http://127.0.0.1:$port" --workload "$work/warmup.jsonl" >/dev/null 2>&1
done
for round in $(seq "$rounds"); do
  for c in 1 8 32; do
    echo "round $round, $c streams" >&2
    bench pagedattn "$p_port" "$c" "$round"
    bench llama "$l_port" "$c" "$round"
  done
done

echo "# pagedattn serve vs llama-server: $(basename "$model"), $threads threads, 128 prompt + 128 output tokens"
python3 - "$work" "$rounds" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
def fig(name, c, key):
    return statistics.median(json.load(open(f"{work}/{name}-c{c}-r{r}.json"))["summary"][key]
                             for r in range(1, rounds + 1))
print(f"{'streams':>7} | {'tok/s pagedattn':>15} {'llama':>8} {'ratio':>6} | "
      f"{'TTFT p50 ms':>11} {'llama':>8} {'ratio':>6} | {'TTFT p99 ms':>11} {'llama':>8} {'ratio':>6}")
for c in (1, 8, 32):
    p, l = (fig(n, c, "output_tokens_per_s") for n in ("pagedattn", "llama"))
    row = f"{c:>7} | {p:>15.1f} {l:>8.1f} {p / l:>6.2f}"
    for key in ("ttft_p50_s", "ttft_p99_s"):
        p, l = (fig(n, c, key) * 1e3 for n in ("pagedattn", "llama"))
        row += f" | {p:>11.1f} {l:>8.1f} {p / l:>6.2f}"
    print(row)
PY
echo "# pagedattn serve /metrics (server overhead):"
curl -sf "http://127.0.0.1:$p_port/metrics" | grep -i overhead | grep -v '^#' || echo "(no overhead metric)"
