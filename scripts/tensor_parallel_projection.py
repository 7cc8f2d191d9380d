#!/usr/bin/env python3
"""Projects tensor-parallel step times to N machines from one measured
single-rank step (docs/tensor_parallel.md, "A projection to 8 machines").

Model per step of T tokens, R of them sampled, on N machines:
  compute(N)   = replicated + split / N   (split: every layer's matrix
                 products and attention; replicated: the LM head's rows),
                 both at the measured single-rank rate (MACs per second)
  all-reduce   = 2 per layer of S = hidden x T x 4 bytes, ring algorithm:
                 2 (N-1)/N x S / bandwidth + 2 (N-1) x latency
  step(N)      = compute(N) + all-reduces (no overlap of the two)

  python3 scripts/tensor_parallel_projection.py --step-ms 95 --tokens 32 --sampled 32
"""
import argparse

PRESETS = {  # hidden, intermediate, layers, query heads, KV heads, head dim, vocab
    "small": (768, 2048, 12, 12, 4, 64, 32000),
    "smollm2-135m": (576, 1536, 30, 9, 3, 64, 49152),
}


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="small", choices=sorted(PRESETS))
    p.add_argument("--step-ms", type=float, required=True, help="measured model time of one step, 1 rank")
    p.add_argument("--tokens", type=int, required=True, help="tokens in the step (T)")
    p.add_argument("--sampled", type=int, required=True, help="rows through the LM head (R)")
    p.add_argument("--context", type=int, default=256, help="mean keys attended per token")
    p.add_argument("--gbit", type=float, default=100.0, help="link bandwidth, Gb/s")
    p.add_argument("--latency-us", type=float, nargs="+", default=[2.0, 20.0],
                   help="per-hop latency of one ring step (RDMA ~2, kernel TCP ~20)")
    p.add_argument("--machines", type=int, nargs="+", default=[1, 2, 4, 8])
    a = p.parse_args()
    h, inter, layers, hq, hkv, d, vocab = PRESETS[a.model]
    per_token = layers * (h * (hq + 2 * hkv) * d + hq * d * h + 3 * h * inter + 2 * hq * d * a.context)
    split = a.tokens * per_token
    replicated = a.sampled * vocab * h
    step = a.step_ms / 1e3
    rate = (split + replicated) / step
    bandwidth = a.gbit / 8 * 1e9
    message = h * a.tokens * 4
    print(f"{a.model}: T = {a.tokens}, R = {a.sampled}, measured {a.step_ms:.1f} ms = "
          f"{rate / 1e9:.1f} GMAC/s; LM head {100 * replicated / (split + replicated):.1f}% of MACs; "
          f"all-reduce message {message / 1024:.0f} KiB, {2 * layers} per step")
    print(f"{'N':>3} {'latency':>8} {'compute ms':>11} {'comm ms':>8} {'step ms':>8} {'comm %':>7} {'speed-up':>9}")
    for alpha in a.latency_us:
        for n in a.machines:
            compute = (replicated + split / n) / rate
            comm = 0.0 if n == 1 else 2 * layers * (2 * (n - 1) / n * message / bandwidth + 2 * (n - 1) * alpha * 1e-6)
            total = compute + comm
            print(f"{n:>3} {alpha:>6.0f}us {compute * 1e3:>11.2f} {comm * 1e3:>8.2f} {total * 1e3:>8.2f} "
                  f"{100 * comm / total:>6.1f}% {step / total:>8.2f}x")


if __name__ == "__main__":
    main()
