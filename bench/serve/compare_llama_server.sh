#!/usr/bin/env bash
# End to end over HTTP: `pagedattn serve` against llama.cpp's llama-server on
# one GGUF file, both driven by the same client (pagedattn bench-serve --url).
#   bench/serve/compare_llama_server.sh MODEL.gguf LLAMA_SERVER_BIN [threads] [rounds]
# LLAMA_SERVER_BIN is llama-server, built outside this repository
# (docs/benchmarks.md says how). Both servers get `threads` CPU threads
# (default 2), as many sequences at once as the most streams (STREAMS, default
# "1 8 32"), 512 tokens of context per sequence, 2048 tokens per batch and the
# same KV room: 512 tokens of f16 K/V per sequence (llama-server -c 16384 for
# 32; pagedattn 360 MiB for 32 = 16384 tokens of SmolLM2-135M's 30 layers x 3
# KV heads x 64; set PAGEDATTN_KV_MIB for another model).
# For each concurrency (STREAMS) and round, bench-serve runs the same
# trace (2 x streams requests, at least 4, of 128 prompt tokens and 128 output
# tokens, ignore_eos; new random prompts per round and concurrency) against
# pagedattn, then llama-server; then a table of
# output tokens/s and TTFT p50/p99 with the ratios pagedattn / llama-server.
# PAGEDATTN and PAGEDATTN_SERVE name the pagedattn binaries of the client and
# the server (default: this tree's build/release/tools/pagedattn);
# PAGEDATTN_SERVE_FLAGS adds flags to `pagedattn serve` (e.g. --bf16-products).
# RESULTS_DIR, when set, keeps each run's bench-serve table and --json there.
# PAGEDATTN_CPU_LOCK, when set, names a file each concurrency level (both
# servers) holds with `flock -x` (other jobs on the machine stay out of the
# timings).
set -euo pipefail
model=$1 llama_server=$2 threads=${3:-2} rounds=${4:-1}
read -r -a streams <<<"${STREAMS:-1 8 32}"
seqs=$(printf '%s\n' "${streams[@]}" | sort -n | tail -1)
root=$(cd "$(dirname "$0")/../.." && pwd)
tool=${PAGEDATTN:-$root/build/release/tools/pagedattn}  # the client, bench-serve --url
server=${PAGEDATTN_SERVE:-$tool}                           # the binary that runs `serve`
work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  wait 2>/dev/null || true
  if [ -n "${RESULTS_DIR:-}" ]; then mkdir -p "$RESULTS_DIR" && cp "$work"/*.json "$work"/*.txt "$RESULTS_DIR"/ 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
http_get() {  # url: its body on stdout; fails unless the answer is 2xx within 5 s
  python3 -c 'import sys, urllib.request
sys.stdout.write(urllib.request.urlopen(sys.argv[1], timeout=5).read().decode())' "$1" 2>/dev/null
}
wait_healthy() {  # port name log
  for _ in $(seq 600); do
    http_get "http://127.0.0.1:$1/health" >/dev/null && return 0
    sleep 0.5
  done
  echo "compare_llama_server: $2 did not come up; its log:" >&2
  tail -20 "$3" >&2
  exit 1
}
# One exclusive hold per concurrency level covers both servers' runs (fd 9,
# opened after the servers start so that they do not inherit it).
lock() { if [ -n "${PAGEDATTN_CPU_LOCK:-}" ]; then exec 9>>"$PAGEDATTN_CPU_LOCK"; flock -x 9; fi; }
unlock() { if [ -n "${PAGEDATTN_CPU_LOCK:-}" ]; then flock -u 9; exec 9>&-; fi; }

p_port=$(free_port)
OMP_NUM_THREADS=$threads "$server" serve --model "$model" --host 127.0.0.1 --port "$p_port" \
  --max-num-seqs "$seqs" --max-model-len 512 --max-batched-tokens 2048 \
  --kv-memory-mib "${PAGEDATTN_KV_MIB:-$((360 * seqs / 32))}" ${PAGEDATTN_SERVE_FLAGS:-} >"$work/pagedattn.log" 2>&1 &
pids+=($!)
l_port=$(free_port)
"$llama_server" -m "$model" --host 127.0.0.1 --port "$l_port" -t "$threads" -tb "$threads" \
  -np "$seqs" -c $((512 * seqs)) -b 2048 --cont-batching >"$work/llama.log" 2>&1 &
pids+=($!)
wait_healthy "$p_port" "pagedattn serve" "$work/pagedattn.log"
wait_healthy "$l_port" llama-server "$work/llama.log"

python3 - "$work" "${streams[@]}" <<'PY'
import json, sys
line = lambda p, o: json.dumps({"prompt_len": p, "output_len": o}) + "\n"
for c in map(int, sys.argv[2:]):
    open(f"{sys.argv[1]}/c{c}.jsonl", "w").write(line(128, 128) * max(4, 2 * c))
open(f"{sys.argv[1]}/warmup.jsonl", "w").write(line(16, 8))
PY

metrics() {  # file: pagedattn serve's counters
  http_get "http://127.0.0.1:$p_port/metrics" >"$1" || : >"$1"
}
bench() {  # name port concurrency round
  [ "$1" = pagedattn ] && metrics "$work/metrics-c$3-r$4.before"
  # Prompts of their own per round and concurrency (the two servers get the
  # same ones): llama-server keeps each slot's last prompt (cache_prompt, on
  # by default) and would serve a repeated one from it, where pagedattn
  # serve runs without prefix caching.
  "$tool" bench-serve --url "http://127.0.0.1:$2" --concurrency "$3" --seed $((1000 * $4 + $3)) \
    --workload "$work/c$3.jsonl" --json "$work/$1-c$3-r$4.json" >"$work/$1-c$3-r$4.txt" 2>/dev/null ||
    { echo "compare_llama_server: bench-serve against $1 failed:" >&2; cat "$work/$1-c$3-r$4.txt" >&2; exit 1; }
  [ "$1" = pagedattn ] && metrics "$work/metrics-c$3-r$4.after"
  return 0
}
for port in "$p_port" "$l_port"; do
  "$tool" bench-serve --url "http://127.0.0.1:$port" --workload "$work/warmup.jsonl" >/dev/null 2>&1
done
for round in $(seq "$rounds"); do
  for c in "${streams[@]}"; do
    echo "round $round, $c streams" >&2
    lock
    bench pagedattn "$p_port" "$c" "$round"
    bench llama "$l_port" "$c" "$round"
    unlock
  done
done

echo "# pagedattn serve vs llama-server: $(basename "$model"), $threads threads, 128 prompt + 128 output tokens"
python3 - "$work" "$rounds" "${streams[@]}" <<'PY'
import json, statistics, sys
work, rounds = sys.argv[1], int(sys.argv[2])
streams = [int(c) for c in sys.argv[3:]]
def fig(name, c, key):
    return statistics.median(json.load(open(f"{work}/{name}-c{c}-r{r}.json"))["summary"][key]
                             for r in range(1, rounds + 1))
print(f"{'streams':>7} | {'tok/s pagedattn':>15} {'llama':>8} {'ratio':>6} | "
      f"{'TTFT p50 ms':>11} {'llama':>8} {'ratio':>6} | {'TTFT p99 ms':>11} {'llama':>8} {'ratio':>6}")
for c in streams:
    p, l = (fig(n, c, "output_tokens_per_s") for n in ("pagedattn", "llama"))
    row = f"{c:>7} | {p:>15.1f} {l:>8.1f} {p / l:>6.2f}"
    for key in ("ttft_p50_s", "ttft_p99_s"):
        p, l = (fig(n, c, key) * 1e3 for n in ("pagedattn", "llama"))
        row += f" | {p:>11.1f} {l:>8.1f} {p / l:>6.2f}"
    print(row)
# pagedattn serve's /metrics over each run: the engine thread's time in
# step() (callbacks included) T, of which in the model M, and the HTTP
# threads' work H. HTTP + scheduling = (T - M + H) / T.
def counters(path):
    out = {}
    for line in open(path):
        if line.startswith("pagedattn_") and " " in line:
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out
print("\nHTTP + scheduling, share of pagedattn's step time (/metrics deltas, median of rounds):")
for c in streams:
    shares = []
    for r in range(1, rounds + 1):
        a, b = (counters(f"{work}/metrics-c{c}-r{r}.{x}") for x in ("before", "after"))
        d = lambda k: b.get(k, 0.0) - a.get(k, 0.0)
        t = d("pagedattn_engine_thread_step_seconds_total")
        if t > 0:
            shares.append((t - d("pagedattn_engine_model_seconds_total")
                           + d("pagedattn_http_handler_seconds_total")) / t)
    print(f"{c:>7} streams: " + (f"{statistics.median(shares) * 100:.2f} %" if shares else "n/a"))
PY
