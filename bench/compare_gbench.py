#!/usr/bin/env python3
"""Times two builds of a Google Benchmark binary (e.g. pagedattn_bench_quant
before and after a change) round by round, alternating which runs first, so
that a host whose speed drifts from minute to minute slows both alike; prints
each benchmark's median time per build and the median (and quartiles) of the
per-round ratios before / after (> 1: the second build is faster).

    bench/compare_gbench.py ROUNDS BEFORE AFTER FILTER [MIN_TIME]

e.g. bench/compare_gbench.py 8 before/bench/pagedattn_bench_quant \\
       build/release/bench/pagedattn_bench_quant 'BM_Batch/q4_k/.*/rows:(4|32)/path:(5|6)$' 0.15
"""
import json
import statistics
import subprocess
import sys


def run(binary, pattern, min_time):
    out = subprocess.run([binary, "--benchmark_filter=" + pattern, "--benchmark_min_time=" + min_time,
                          "--benchmark_format=json"], capture_output=True, text=True, check=True).stdout
    return {b["name"]: b["real_time"] for b in json.loads(out)["benchmarks"] if "error_occurred" not in b}


def main():
    if len(sys.argv) < 5:
        sys.exit(__doc__)
    rounds, before, after, pattern = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    min_time = sys.argv[5] if len(sys.argv) > 5 else "0.1"
    times = {}
    for r in range(rounds):
        for binary in ((before, after) if r % 2 == 0 else (after, before)):
            for name, t in run(binary, pattern, min_time).items():
                times.setdefault(name, {before: [], after: []})[binary].append(t)
    print(f"{'benchmark':78s} {'before':>9s} {'after':>9s}  before / after (quartiles)")
    for name, t in times.items():
        ratios = sorted(b / a for b, a in zip(t[before], t[after]))
        quartile = lambda q: ratios[min(len(ratios) - 1, int(q * len(ratios)))]
        print(f"{name:78s} {statistics.median(t[before]):9.2f} {statistics.median(t[after]):9.2f}  "
              f"{statistics.median(ratios):.3f} ({quartile(0.25):.3f}-{quartile(0.75):.3f})")


if __name__ == "__main__":
    main()
