#!/usr/bin/env python3
"""Plots a `pagedattn bench-serve --json FILE` run: KV pages in use, running
batch size and output throughput over time, as one PNG.

    python3 -m pip install matplotlib      # from PyPI
    scripts/plot_bench.py run.json -o docs/bench_serve.png
"""
import argparse
import json

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def throughput(times, tokens, window=1.0):
    """Output tokens/s over a sliding window of `window` seconds."""
    out, start = [], 0
    for i, t in enumerate(times):
        while times[start] < t - window:
            start += 1
        span = t - times[start]
        out.append((tokens[i] - tokens[start]) / span if span > 0 else 0.0)
    return out


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("-o", "--output", default="bench_serve.png")
    args = parser.parse_args()
    with open(args.json_file) as f:
        run = json.load(f)
    tl, s = run["timeline"], run["summary"]
    t = tl["time_s"]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(t, tl["pages_in_use"], label="pages in use")
    axes[0].axhline(s["num_pages"], color="gray", linestyle="--", label="KV pages")
    axes[0].set_ylabel("KV pages")
    axes[0].legend(loc="upper right")
    axes[1].plot(t, tl["running_seqs"], color="tab:orange")
    axes[1].set_ylabel("running sequences")
    axes[2].plot(t, throughput(t, tl["output_tokens"]), color="tab:green")
    axes[2].set_ylabel("output tokens/s")
    axes[2].set_xlabel("time (s)")
    info = run["run"]
    fig.suptitle(
        f"pagedattn bench-serve: model {info['model']}, {info['workload']}, "
        f"{info['requests']} requests\nKV efficiency {100 * s['kv_efficiency']:.1f}%, "
        f"{s['preemptions']:.0f} preemptions",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(args.output, dpi=100)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
