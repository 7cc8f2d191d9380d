#!/usr/bin/env python3
"""Projects tensor-parallel step times to N machines from measured inputs
only, and compares the projection with a measured two-host run
(docs/tensor_parallel.md, "Projection from measured inputs").

The inputs come from `scripts/two_host_run.sh --json FILE` (as root): the
single rank's prefill and decode step times on this machine, and for each
link (the bare veth pair, and tc-shaped rates) its ping-pong latency and
bandwidth, MPI_Allreduce at the step's message sizes, and the step times of
2 ranks over that link.

Model per step of T tokens, R of them sampled, on N machines (the split of
docs/tensor_parallel.md, "What is split"):
  compute(N)  = the busiest rank's multiply-adds: its query heads, KV heads
                (Hkv/N, or one copy when N > Hkv), MLP columns and attention,
                and its whole 128-row blocks of the LM head for the R rows;
                at the rate the single rank measured for that kind of step
  all-reduce  = 2 per layer of S = hidden x T x 4 bytes, ring algorithm with
                the measured latency a and bandwidth b:
                2 (N-1) x (a + S / (N b))
  all-gather  = 1 per step of the R x vocab logits (G bytes in all):
                (N-1) x (a + G / (N b))
  step(N)     = compute(N) + collectives (pagedattn does not overlap them)

  sudo scripts/two_host_run.sh --gbit 10,100 --json run.json
  python3 scripts/tensor_parallel_projection.py run.json
"""
import argparse
import json
import sys

# The synthetic presets of llama_preset() (src/engine/llama_config.cc):
# hidden, intermediate, layers, query heads, KV heads, head dim, vocab.
PRESETS = {
    "tiny": (256, 688, 4, 4, 2, 64, 1024),
    "small": (768, 2048, 12, 12, 4, 64, 32000),
    "1b": (2048, 8192, 16, 32, 8, 64, 128256),
}


LM_HEAD_BLOCK = 128  # vocabulary rows per block of the LM head's split (kColumnBlock)


def refusal(model, n):
    """Why pagedattn refuses `model` on n ranks (split_problems in
    src/engine/llama_shard.cc), or None."""
    h, inter, layers, hq, hkv, d, vocab = PRESETS[model]
    if hq % n:
        return f"refused: {hq} query heads not divisible by {n}"
    if hkv % n and n % hkv:
        return f"refused: {hkv} KV heads and {n} ranks do not divide one another"
    if inter % n:
        return f"refused: intermediate size {inter} not divisible by {n}"
    return None


def lm_head_rows(vocab, n):
    """The most vocabulary rows any of n ranks multiplies (vocab_slice)."""
    blocks = -(-vocab // LM_HEAD_BLOCK)
    starts = [min(vocab, blocks * r // n * LM_HEAD_BLOCK) for r in range(n + 1)]
    return max(b - a for a, b in zip(starts, starts[1:]))


def step_shapes(run):
    """(name, tokens T, sampled rows R, mean keys per token) of the two steps
    the run timed: one prefill of B x P tokens, decode steps of B tokens."""
    b, p, o = run["requests"], run["prompt_len"], run["output_len"]
    return [("prefill", b * p, b, (p + 1) / 2), ("decode", b, b, p + o / 2)]


def macs(model, n, tokens, sampled, keys):
    """(layers, LM head) multiply-adds of one step on the busiest of n ranks."""
    h, inter, layers, hq, hkv, d, vocab = PRESETS[model]
    q, kv = hq // n, max(1, hkv // n)
    per_token = layers * (h * (q + 2 * kv) * d + q * d * h + 3 * h * inter // n + 2 * q * d * keys)
    return tokens * per_token, sampled * lm_head_rows(vocab, n) * h


def ring_all_reduce_s(n, message_bytes, latency_s, bytes_per_s):
    return 2 * (n - 1) * (latency_s + message_bytes / (n * bytes_per_s))


def ring_all_gather_s(n, total_bytes, latency_s, bytes_per_s):
    return (n - 1) * (latency_s + total_bytes / (n * bytes_per_s))


def link_name(link):
    shaped = f"shaped to {link['gbit']:g} Gb/s" if link["gbit"] is not None else "unshaped veth"
    if link.get("latency_us_added"):
        shaped += f" + {link['latency_us_added']:g} us netem"
    return shaped


def projected_s(run, link, step, n):
    """(compute, collectives) seconds of `step` ("prefill" or "decode") on n
    ranks over `link`, from the single rank's measured rate."""
    h, inter, layers, hq, hkv, d, vocab = PRESETS[run["model"]]
    _, tokens, sampled, keys = next(s for s in step_shapes(run) if s[0] == step)
    rate = sum(macs(run["model"], 1, tokens, sampled, keys)) / run["single"][f"{step}_step_s"]
    latency_s, bytes_per_s = link["latency_us"] * 1e-6, link["bandwidth_gbit"] * 1e9 / 8
    compute = sum(macs(run["model"], n, tokens, sampled, keys)) / rate
    comm = 0.0 if n == 1 else (2 * layers * ring_all_reduce_s(n, h * tokens * 4, latency_s, bytes_per_s)
                               + ring_all_gather_s(n, sampled * vocab * 4, latency_s, bytes_per_s))
    return compute, comm


def report_link(run, link, machines):
    model = run["model"]
    print(f"\nlink: {link_name(link)}; measured ping-pong latency {link['latency_us']:.1f} us, "
          f"bandwidth {link['bandwidth_gbit']:.2f} Gb/s")
    print(f"{'step':<8} {'N':>2} {'compute ms':>11} {'comm ms':>8} {'projected ms':>13} "
          f"{'measured ms':>12} {'proj/meas':>9} {'speed-up':>9}")
    for step, tokens, sampled, keys in step_shapes(run):
        single_s = run["single"][f"{step}_step_s"]
        for n in machines:
            why = refusal(model, n)
            if why:
                print(f"{step:<8} {n:>2} {why}")
                continue
            compute, comm = projected_s(run, link, step, n)
            total = compute + comm
            measured = {1: single_s, 2: link[f"{step}_step_s"]}.get(n)
            versus = f"{measured * 1e3:>12.2f} {total / measured:>9.2f}" if measured else f"{'-':>12} {'-':>9}"
            print(f"{step:<8} {n:>2} {compute * 1e3:>11.2f} {comm * 1e3:>8.2f} {total * 1e3:>13.2f} "
                  f"{versus} {single_s / total:>8.2f}x")
        message = PRESETS[model][0] * tokens * 4
        modelled = ring_all_reduce_s(2, message, link["latency_us"] * 1e-6, link["bandwidth_gbit"] * 1e9 / 8)
        layer_macs, head_macs = macs(model, 1, tokens, sampled, keys)
        print(f"{'':<8}    all-reduce of {message / 1024:.0f} KiB on 2 ranks: ring model "
              f"{modelled * 1e6:.0f} us, measured {link['allreduce_us'].get(str(message), float('nan')):.0f} us; "
              f"LM head {100 * head_macs / (layer_macs + head_macs):.1f}% of 1 rank's MACs")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", help="JSON written by scripts/two_host_run.sh --json")
    p.add_argument("--machines", type=int, nargs="+", default=[1, 2, 4, 8])
    a = p.parse_args()
    with open(a.run) as f:
        run = json.load(f)
    if run["model"] not in PRESETS:
        sys.exit(f"tensor_parallel_projection: model '{run['model']}' is not one of {sorted(PRESETS)}")
    if any(n < 1 for n in a.machines):
        sys.exit(f"tensor_parallel_projection: --machines {a.machines} must all be >= 1")
    print(f"{run['model']}: {run['requests']} requests x ({run['prompt_len']} prompt + "
          f"{run['output_len']} output) tokens, 1 thread per rank; {run['machine']}, "
          f"{run['cpus']} CPUs, {run['date']}, load average {run['load_average']}")
    print("measured: 1 rank's step times, each link's latency and bandwidth, 2 ranks' step times;"
          " projected: N ranks from those")
    for link in run["links"]:
        report_link(run, link, a.machines)


if __name__ == "__main__":
    main()
