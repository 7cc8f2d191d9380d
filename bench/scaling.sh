#!/usr/bin/env bash
# Thread scaling in one command: `pagedattn bench-serve` and `pagedattn
# bench-attention` at each thread count of a list, each decode step set
# against this machine's bounds at that thread count (the roofline: weight
# and KV bytes read / the read-bandwidth probe, FLOPs / the FMA probe, from
# bench-serve --probes), as a Markdown table on stdout and, with matplotlib,
# a PNG (docs/benchmarks.md, "Scaling over threads").
#
#   bench/scaling.sh [--threads 1,2,4,8,16] [--model PRESET|FILE.gguf]
#                    [--workload NAME|FILE.jsonl] [--num-requests N]
#                    [--serve-args "FLAGS"] [--attention-args "FLAGS"]
#                    [--pagedattn PATH] [--out DIR] [--plot FILE.png] [--quick]
#                    [--check MAX_FRACTION]
#
# Thread counts above this machine's CPUs (nproc) are skipped, with a note:
# more threads than cores measure the scheduler, not the library. The list
# can also come from SCALING_THREADS. --out keeps every run's output there
# (serve-N.json, serve-N.txt, attention-N.txt, report.md); by default a
# temporary folder that is removed at the end. --plot needs matplotlib in
# PYTHON (default python3; see scripts/plot_bench.py for a virtual
# environment); the table needs the standard library only. --quick: CI-sized
# runs (bench-serve --quick, the probes' short form, a short attention
# shape). --check fails (status 1) unless every figure is positive and each
# step is at most MAX_FRACTION of its roofline (the test suite runs it).
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
threads=${SCALING_THREADS:-1,2,4,8,16}
model=small
workload=alpaca-like
num_requests=48
serve_args=""
attention_args=""
pagedattn=$root/build/release/tools/pagedattn
out=""
plot=""
quick=false
check=""

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
  exit 2
}
while [[ $# -gt 0 ]]; do
  case $1 in
    --threads) threads=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --workload) workload=$2; shift 2 ;;
    --num-requests) num_requests=$2; shift 2 ;;
    --serve-args) serve_args=$2; shift 2 ;;
    --attention-args) attention_args=$2; shift 2 ;;
    --pagedattn) pagedattn=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --plot) plot=$2; shift 2 ;;
    --quick) quick=true; shift ;;
    --check) check=$2; shift 2 ;;
    -h | --help) usage ;;
    *) echo "scaling: unknown argument '$1'" >&2; usage ;;
  esac
done

if [[ ! -x $pagedattn ]]; then
  echo "scaling: no pagedattn binary at '$pagedattn' (--pagedattn)" >&2
  exit 2
fi
cpus=$(nproc)
counts=()
skipped=()
IFS=, read -r -a requested <<<"$threads"
for n in "${requested[@]}"; do
  if [[ ! $n =~ ^[1-9][0-9]*$ ]]; then
    echo "scaling: thread count '$n' is not a positive integer" >&2
    exit 2
  fi
  if ((n > cpus)); then skipped+=("$n"); else counts+=("$n"); fi
done
if ((${#skipped[@]} > 0)); then
  echo "scaling: skipping ${skipped[*]} threads: this machine has $cpus CPUs" >&2
fi
((${#counts[@]} > 0)) || { echo "scaling: no thread count left to run" >&2; exit 2; }

if [[ -z $out ]]; then
  out=$(mktemp -d)
  trap 'rm -rf "$out"' EXIT
else
  mkdir -p "$out"
fi

# The engine's workload; a decode shape for the attention kernel alone, with
# f16 K/V well beyond the L3 cache, as a served batch's is.
serve_flags=(--model "$model" --workload "$workload" --num-requests "$num_requests" --probes)
attention_flags=(--mode decode --batch 16 --kv-len 2048 --heads 32x8 --head-dim 128 --seconds 2)
if $quick; then
  serve_flags+=(--quick)
  attention_flags=(--mode decode --batch 4 --kv-len 1024 --heads 8x2 --head-dim 64 --seconds 0.2)
fi
read -r -a extra_serve <<<"$serve_args"
read -r -a extra_attention <<<"$attention_args"

for n in "${counts[@]}"; do
  echo "scaling: $n threads: bench-serve ${serve_flags[*]} ${extra_serve[*]}" >&2
  # The probes run in bench-serve, at the same thread count; bench-attention
  # skips its own (and the reference check): the report divides by those.
  OMP_NUM_THREADS=$n "$pagedattn" bench-serve "${serve_flags[@]}" "${extra_serve[@]}" \
    --json "$out/serve-$n.json" >"$out/serve-$n.txt" 2>/dev/null
  echo "scaling: $n threads: bench-attention ${attention_flags[*]} ${extra_attention[*]}" >&2
  OMP_NUM_THREADS=$n "$pagedattn" bench-attention "${attention_flags[@]}" "${extra_attention[@]}" \
    --threads "$n" --no-probe --no-check >"$out/attention-$n.txt"
done

report_args=("$out" "${counts[@]}")
[[ -n $plot ]] && report_args+=(--plot "$plot")
[[ -n $check ]] && report_args+=(--check "$check")
"${PYTHON:-python3}" "$root/bench/scaling_report.py" "${report_args[@]}" | tee "$out/report.md"
