#!/usr/bin/env python3
"""Plots a `pagedattn bench-serve --json FILE` run: KV pages in use, running
batch size and output throughput over time, as one PNG.

matplotlib is not part of the build. Debian's Python refuses a system-wide
`pip install` (PEP 668), so install it into a virtual environment (or, as
root, `apt-get install python3-matplotlib` and use python3):

    python3 -m venv build/plotenv && build/plotenv/bin/pip install matplotlib
    build/plotenv/bin/python scripts/plot_bench.py run.json -o docs/bench_serve.png

--check-legend exits with status 1 when a legend covers a plotted point
(the test suite runs it).
"""
import argparse
import json
import sys

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


def legend_overlaps(fig):
    """(y label, line label) pairs whose drawn path crosses a legend's box."""
    fig.canvas.draw()
    found = []
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is None:
            continue
        box = legend.get_window_extent()
        for line in ax.get_lines():
            path = line.get_transform().transform_path(line.get_path())
            if path.intersects_bbox(box, filled=False):
                found.append((ax.get_ylabel(), line.get_label()))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json_file")
    parser.add_argument("-o", "--output", default="bench_serve.png")
    parser.add_argument("--check-legend", action="store_true",
                        help="fail when a legend covers plotted data")
    args = parser.parse_args()
    with open(args.json_file) as f:
        run = json.load(f)
    tl, s = run["timeline"], run["summary"]
    t = tl["time_s"]
    fig, axes = plt.subplots(3, 1, figsize=(8, 8), sharex=True)
    axes[0].plot(t, tl["pages_in_use"], label="pages in use")
    axes[0].axhline(s["num_pages"], color="gray", linestyle="--", label="KV pages")
    axes[0].set_ylabel("KV pages")
    # Above the axes, not inside: the pages line runs along the top when the
    # pool is full, which is what a good run looks like.
    axes[0].legend(loc="lower right", bbox_to_anchor=(1.0, 1.0), ncol=2, frameon=False)
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
    if args.check_legend:
        overlaps = legend_overlaps(fig)
        for axis, label in overlaps:
            print(f"legend covers '{label}' in the '{axis}' plot", file=sys.stderr)
        return 1 if overlaps else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
