#!/usr/bin/env python3
"""The report of bench/scaling.sh: one row per thread count from its runs'
outputs (serve-N.json from `bench-serve --probes --json`, attention-N.txt
from `bench-attention --no-probe`), as a Markdown table; with --plot a PNG of
the decode step time against threads with its roofline bound (matplotlib,
imported only then).

    python3 bench/scaling_report.py DIR 1 2 4 [--plot scaling.png] [--check 3]

Each step is set against its bounds at the same thread count: memory (the
weights plus the K/V the step reads / the read-bandwidth probe) and compute
(its FLOPs / the widest fp32 FMA probe). "of roofline" is max(bounds) / step
time: 100% is a step at the bound. A model whose weights fit in the L3 cache
(the tiny preset) can pass 100%: the read probe measures DRAM.
"""
import argparse
import json
import os
import re
import sys
import time


def machine_line():
    """CPU model, CPUs and load average: what the figures depend on."""
    info = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first CPU's block is enough
                info[key.strip()] = value.strip()
        with open("/proc/loadavg") as f:
            load = " ".join(f.read().split()[:3])
    except OSError:
        load = "unknown"
    # A virtual machine may name the CPU vaguely ("AMD EPYC"): the family
    # and model then say which generation it is.
    cpu = info.get("model name", "unknown CPU")
    if "cpu family" in info:
        cpu += f" (family {info['cpu family']}, model {info.get('model', '?')})"
    return (f"{cpu}, {os.cpu_count()} CPUs, load average {load}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")


def attention_figures(path):
    """(median ms per call, K+V GB/s, shape line) of a bench-attention run."""
    with open(path) as f:
        text = f.read()
    ms = re.search(r"time per call: median ([0-9.]+) ms", text)
    gbps = re.search(r"K\+V read: ([0-9.]+) GB/s", text)
    shape = re.search(r"^shape: (.*)$", text, re.M)
    if not ms or not gbps:
        raise SystemExit(f"scaling: no timing in {path}")
    # The shape without its thread count (the table's rows have that).
    shape = re.sub(r", [0-9]+ threads$", "", shape.group(1)) if shape else ""
    return float(ms.group(1)), float(gbps.group(1)), shape


def load_rows(folder, counts):
    rows = []
    for n in counts:
        with open(os.path.join(folder, f"serve-{n}.json")) as f:
            run = json.load(f)
        r, s = run["roofline"], run["summary"]
        if r["read_gbps"] is None:
            raise SystemExit(f"scaling: serve-{n}.json has no probe figures "
                             "(bench-serve without --probes?)")
        if r["roofline_fraction"] is None:
            raise SystemExit(f"scaling: serve-{n}.json has no step of decodes alone to set "
                             "against the bounds (a workload of prompts only?)")
        att_ms, att_gbps, shape = attention_figures(
            os.path.join(folder, f"attention-{n}.txt"))
        rows.append({
            "threads": n,
            "json_threads": r["threads"],
            "tokens_per_s": s["output_tokens_per_s"],
            "step_ms": 1e3 * r["decode_step_s"],
            "tokens_per_step": r["decode_tokens_per_step"],
            "memory_ms": 1e3 * r["memory_bound_s"],
            "compute_ms": 1e3 * r["compute_bound_s"],
            "fraction": r["roofline_fraction"],
            "read_gbps": r["read_gbps"],
            "fma_gflops": r["fma_gflops"],
            "attention_ms": att_ms,
            "attention_gbps": att_gbps,
            "attention_share": att_gbps / r["read_gbps"],
            "model": run["run"]["model"],
            "workload": run["run"]["workload"],
            "requests": run["run"]["requests"],
            "weight_bytes": r["weight_bytes"],
            "matmul_flops_per_token": r["matmul_flops_per_token"],
            "shape": shape,
            # Absent in the JSON of builds before the step profile.
            "phases_ms": {k: 1e3 * v for k, v in r.get("decode_step_phases_s", {}).items()},
            "team_wait_ms": 1e3 * r.get("decode_step_team_wait_s", 0.0),
            "team_wait_phases_ms": {k: 1e3 * v for k, v in
                                    r.get("decode_step_team_wait_phases_s", {}).items()},
        })
    base = rows[0]["tokens_per_s"]
    for row in rows:
        row["speedup"] = row["tokens_per_s"] / base if base > 0 else 0.0
    return rows


def print_table(rows, out):
    first = rows[0]
    print(f"Thread scaling: {machine_line()}", file=out)
    print(f"bench-serve: model {first['model']} ({first['weight_bytes'] / 1e6:.1f} MB of "
          f"weights read per step, {first['matmul_flops_per_token'] / 1e6:.1f} MFLOP per token "
          f"in the matrices), {first['workload']}, {first['requests']} requests; "
          f"bench-attention: {first['shape']}", file=out)
    if first["threads"] != 1:
        print("(speedup is over the first thread count run)", file=out)
    print(file=out)
    print("| threads | output tok/s | speedup | decode step ms | tokens/step | read probe GB/s "
          "| memory bound ms | FMA probe GFLOP/s | compute bound ms | of roofline "
          "| attention GB/s | attention % of read probe |", file=out)
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|", file=out)
    for r in rows:
        print(f"| {r['threads']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f} "
              f"| {r['step_ms']:.3f} | {r['tokens_per_step']:.1f} | {r['read_gbps']:.1f} "
              f"| {r['memory_ms']:.3f} | {r['fma_gflops']:.1f} | {r['compute_ms']:.3f} "
              f"| {100 * r['fraction']:.1f}% | {r['attention_gbps']:.2f} "
              f"| {100 * r['attention_share']:.1f}% |", file=out)
    for r in rows:
        # The engine steps on fewer threads while other processes use the
        # CPUs (engine::StepThreads): that row measured fewer than asked.
        if r["json_threads"] != r["threads"]:
            print(f"\n{r['threads']} threads: bench-serve's engine stepped on "
                  f"{r['json_threads']} at the end (other processes were using the CPUs): "
                  "measure on a quiet machine", file=out)


def print_phases(rows, out):
    """Where each count's decode step goes: a phase whose time stays as threads
    are added is what stops the step from scaling."""
    names = list(rows[0]["phases_ms"])
    if not names:
        return
    print(file=out)
    print("Where the decode step goes, ms (products, attention and the LM head of the "
          "forward pass; the rest of it: norms, RoPE, activations, residuals; outside the "
          "model: scheduling, planning, sampling; within the forward pass: each layer "
          "team thread's wait at the barriers after its pieces, in all and by the phase of "
          "the piece):", file=out)
    print(file=out)
    # The waits by the phase of the piece they followed (builds before it: none).
    waits = list(rows[0].get("team_wait_phases_ms", {}))
    print("| threads | step | " + " | ".join(n.replace("_", " ") for n in names) +
          " | waits in teams |" +
          "".join(f" waits after {n.replace('_', ' ')} |" for n in waits), file=out)
    print("|---:|---:|" + "---:|" * (len(names) + 1 + len(waits)), file=out)
    for r in rows:
        print(f"| {r['threads']} | {r['step_ms']:.3f} | " +
              " | ".join(f"{r['phases_ms'].get(n, 0.0):.3f}" for n in names) +
              f" | {r.get('team_wait_ms', 0.0):.3f} |" +
              "".join(f" {r['team_wait_phases_ms'].get(n, 0.0):.3f} |" for n in waits),
              file=out)


def check(rows, max_fraction):
    """Messages for figures that are not positive, or steps past the limit. A
    run on fewer threads than asked (a busy machine) is noted in the table,
    not refused: the figures are still the engine's own."""
    problems = []
    for r in rows:
        for key in ("tokens_per_s", "step_ms", "tokens_per_step", "memory_ms", "compute_ms",
                    "fraction", "read_gbps", "fma_gflops", "attention_gbps"):
            if not r[key] > 0:
                problems.append(f"{r['threads']} threads: {key} = {r[key]} is not positive")
        if r["fraction"] > max_fraction:
            problems.append(f"{r['threads']} threads: the step is at {r['fraction']:.2f} of its "
                            f"roofline, above {max_fraction}")
    return problems


def plot(rows, path):
    try:
        import matplotlib
    except ImportError:
        print(f"scaling: no matplotlib in {sys.executable}: {path} not written "
              "(scripts/plot_bench.py says how to install it)", file=sys.stderr)
        return
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    threads = [r["threads"] for r in rows]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.5))
    left.plot(threads, [r["step_ms"] for r in rows], "o-", label="decode step (measured)")
    left.plot(threads, [max(r["memory_ms"], r["compute_ms"]) for r in rows], "k-",
              label="roofline: max(bounds)")
    left.plot(threads, [r["memory_ms"] for r in rows], "--", color="tab:red",
              label="bytes / read probe")
    left.plot(threads, [r["compute_ms"] for r in rows], ":", color="tab:purple",
              label="FLOPs / FMA probe")
    left.set_ylabel("ms per decode step")
    left.set_yscale("log")
    # Plain numbers: a log axis's powers of ten hide the few values it spans.
    left.yaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    left.yaxis.set_minor_formatter(matplotlib.ticker.ScalarFormatter())
    right.plot(threads, [r["tokens_per_s"] for r in rows], "o-", color="tab:green",
               label="measured")
    base = rows[0]["tokens_per_s"] / rows[0]["threads"]
    right.plot(threads, [base * n for n in threads], "--", color="gray",
               label="linear in threads")
    right.set_ylabel("output tokens/s")
    for ax in (left, right):
        ax.set_xscale("log", base=2)
        ax.set_xticks(threads)
        ax.set_xticklabels([str(n) for n in threads])
        ax.set_xlabel("threads (OMP_NUM_THREADS)")
        ax.legend(fontsize=8)
    first = rows[0]
    fig.suptitle(f"pagedattn bench-serve: model {first['model']}, {first['workload']}, "
                 f"{first['requests']} requests", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"scaling: wrote {path}", file=sys.stderr)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("threads", nargs="+", type=int)
    parser.add_argument("--plot", metavar="FILE.png")
    parser.add_argument("--check", type=float, metavar="MAX_FRACTION",
                        help="fail unless every figure is positive and every step is at "
                             "most this fraction of its roofline")
    args = parser.parse_args()
    rows = load_rows(args.folder, args.threads)
    print_table(rows, sys.stdout)
    print_phases(rows, sys.stdout)
    if args.plot:
        plot(rows, args.plot)
    if args.check is not None:
        problems = check(rows, args.check)
        for p in problems:
            print(f"scaling: {p}", file=sys.stderr)
        return 1 if problems else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
