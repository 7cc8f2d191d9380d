#!/usr/bin/env bash
# Times two or more builds of `pagedattn bench-attention` on one shape,
# alternating run by run, so that a host whose speed drifts (other tenants,
# shared AMX units) slows every build alike; prints each build's median time
# and its speed-up over the first build, round by round (median and range).
# Tighter: `pagedattn bench-attention --shims A,B` alternates the builds'
# kernels call by call in one process (docs/benchmarks.md, "Building and
# running"); this script remains for builds whose public structs differ.
#
#   bench/compare_builds.sh ROUNDS "PAGEDATTN_A PAGEDATTN_B ..." BENCH_OPTIONS...
#
# e.g. a build of the commit before a change against the build after it:
#   bench/compare_builds.sh 6 "build/shims/before/tools/pagedattn build/release/tools/pagedattn" \
#     --mode prefill --q-len 512 --kv-len 4096 --kv-dtype bf16 --bf16-products
# Each run times calls for SECONDS_PER_RUN seconds (default 0.5), without
# the probes or the reference check.
set -euo pipefail

if [[ $# -lt 2 ]]; then
  echo "usage: $0 ROUNDS \"PAGEDATTN_A PAGEDATTN_B ...\" BENCH_OPTIONS..." >&2
  exit 2
fi
rounds=$1
read -r -a builds <<<"$2"
shift 2
seconds=${SECONDS_PER_RUN:-0.5}

for ((r = 0; r < rounds; ++r)); do
  line=""
  for i in "${!builds[@]}"; do
    ms=$("${builds[$i]}" bench-attention "$@" --seconds "$seconds" --no-probe --no-check |
      awk '/time per call: median/ {print $5}')
    line+=" $ms"
  done
  echo "$line"
done | python3 -c '
import statistics, sys
names = sys.argv[1:]
rounds = [[float(x) for x in line.split()] for line in sys.stdin if line.strip()]
for i, name in enumerate(names):
    times = [r[i] for r in rounds]
    speedups = sorted(r[0] / r[i] for r in rounds)
    print(f"{name}: median {statistics.median(times):.2f} ms; speed-up over the first build: "
          f"median {statistics.median(speedups):.3f}, range {speedups[0]:.3f}-{speedups[-1]:.3f}")
' "${builds[@]}"
