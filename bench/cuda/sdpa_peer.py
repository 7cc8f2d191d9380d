#!/usr/bin/env python3
"""Torch-only peers of bench_cuda.cc (pagedattn_bench_cuda), on the same GPU.

Measures, with the same timing method and output format as the C++ benchmark:

  torch_copy_d2d_2GiB          a device-to-device tensor copy (read + write counted),
                               the bandwidth reference of this script's frac_copy
  sdpa_decode_b<B>_k<L>        torch.nn.functional.scaled_dot_product_attention on
                               CONTIGUOUS bf16 K/V, 32 query heads x 8 KV heads
                               (enable_gqa=True), head_dim 128, q_len 1, at the
                               benchmark's three decode shapes; suffixes _flash,
                               _efficient, _cudnn force one SDPA backend
                               (a backend that refuses the shape prints an error)
  sdpa_prefill_*               causal bf16 prefill: 32 x 32 heads (MHA) and 32 x 8
                               heads at 1 x 4096 tokens, 32 x 8 heads at 8 x 1024
  torch_matmul_bf16_8192       torch.matmul of two 8192 x 8192 bf16 matrices: the
                               card's dense bf16 tensor-core rate as cuBLAS reaches it

Bytes and FLOPs are counted as bench_cuda.cc counts them:
  decode bytes = keys x kv_heads x (head_dim + v_head_dim) x 2 (K+V read once)
  FLOPs = 2 * qo_heads * (head_dim + v_head_dim) * pairs per sequence, pairs = kv_len
  for decode and q_len * kv_len - q_len^2 / 2 for causal prefill (FlashAttention's
  convention: 4 * q * kv * heads * d / 2); matmul FLOPs = 2 * n^3.

Timing: torch.cuda.Event on the current stream; 3 warm-up calls, 3 single calls
(median: single_ms), then samples of back-to-back calls (each at least 1 ms)
until there are >= 10 samples and >= 20 ms in all; ms = the median sample's time
per call. Every case is independent: a failure prints `case=<name> error="..."`
and the run goes on. Without torch or CUDA it says so and exits 0.

Usage: python3 sdpa_peer.py [--quick] [--json FILE] [--filter SUBSTR] [--budget S]
"""

import argparse
import contextlib
import json
import math
import statistics
import sys
import time

QO_HEADS, KV_HEADS, HEAD_DIM = 32, 8, 128
DECODE_SHAPES = [(8, 16384), (64, 8192), (256, 4096)]  # (batch, keys per sequence)
COPY_BYTES = 2 << 30
MATMUL_N = 8192


def attention_flops(batch, qo_heads, head_dim, v_head_dim, q_len, kv_len):
    pairs = kv_len if q_len == 1 else q_len * kv_len - q_len * q_len / 2.0
    return 2.0 * qo_heads * (head_dim + v_head_dim) * pairs * batch


class Runner:
    def __init__(self, torch, args):
        self.torch = torch
        self.args = args
        self.start = time.monotonic()
        self.copy_gbps = math.nan
        self.json = open(args.json, "w") if args.json else None
        if args.quick:
            self.min_samples, self.min_total_ms, self.min_sample_ms = 5, 5.0, 0.5
        else:
            self.min_samples, self.min_total_ms, self.min_sample_ms = 10, 20.0, 1.0

    def time_calls(self, fn):
        torch = self.torch
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        start = torch.cuda.Event(enable_timing=True)
        stop = torch.cuda.Event(enable_timing=True)

        def sample(calls):
            start.record()
            for _ in range(calls):
                fn()
            stop.record()
            stop.synchronize()
            return start.elapsed_time(stop)

        single_ms = statistics.median(sample(1) for _ in range(3))
        calls = int(min(max(math.ceil(self.min_sample_ms / max(single_ms, 1e-3)), 1), 1000))
        per_call, total_ms = [], 0.0
        while (len(per_call) < self.min_samples or total_ms < self.min_total_ms) and len(
            per_call
        ) < 200:
            ms = sample(calls)
            total_ms += ms
            per_call.append(ms / calls)
        return statistics.median(per_call), single_ms, len(per_call), calls

    def emit(self, record, text):
        print(text, flush=True)
        if self.json:
            self.json.write(json.dumps(record) + "\n")
            self.json.flush()

    def run(self, name, make, nbytes=0.0, flops=0.0, is_copy=False):
        """Times the callable that make() returns; reports it as case `name`."""
        if self.args.filter and self.args.filter not in name and not is_copy:
            return
        if time.monotonic() - self.start > self.args.budget:
            record = {"case": name, "skipped": "time budget"}
            self.emit(record, f'case={name} skipped="time budget"')
            return
        try:
            fn = make()
            ms, single_ms, samples, calls = self.time_calls(fn)
        except Exception as error:  # one case's failure must not end the run
            message = " ".join(str(error).split())[:400] or type(error).__name__
            self.emit(
                {"case": name, "error": message},
                f'case={name} error="{message.replace(chr(34), chr(39))}"',
            )
            return
        finally:
            fn = None
            self.torch.cuda.empty_cache()
        seconds = ms * 1e-3
        gbps = nbytes / seconds / 1e9 if nbytes > 0 else math.nan
        tflops = flops / seconds / 1e12 if flops > 0 else math.nan
        if is_copy:
            self.copy_gbps = gbps
        frac = gbps / self.copy_gbps if nbytes > 0 and self.copy_gbps > 0 else math.nan
        text = (
            f"case={name} ms={ms:.4f} GBps={gbps:.1f} TFLOPs={tflops:.3f} "
            f"frac_copy={frac:.3f} single_ms={single_ms:.4f} samples={samples} "
            f"calls_per_sample={calls}"
        )

        def number(value):
            return value if math.isfinite(value) else None

        record = {
            "case": name,
            "ms": ms,
            "GBps": number(gbps),
            "TFLOPs": number(tflops),
            "frac_copy": number(frac),
            "bytes": nbytes,
            "flops": flops,
        }
        record.update(single_ms=single_ms, samples=samples, calls_per_sample=calls)
        self.emit(record, text)


def sdpa_backends(torch):
    """(suffix, context factory) for the default choice and each forced backend."""
    backends = [("", contextlib.nullcontext)]
    try:
        from torch.nn.attention import SDPBackend, sdpa_kernel
    except ImportError:
        return backends
    for suffix, attr in [
        ("_flash", "FLASH_ATTENTION"),
        ("_efficient", "EFFICIENT_ATTENTION"),
        ("_cudnn", "CUDNN_ATTENTION"),
    ]:
        if hasattr(SDPBackend, attr):
            backend = getattr(SDPBackend, attr)
            backends.append((suffix, lambda backend=backend: sdpa_kernel(backend)))
    return backends


def sdpa_call(torch, q, k, v, causal, context):
    """A callable running SDPA with GQA (enable_gqa, or K/V expanded where it is missing)."""
    sdpa = torch.nn.functional.scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    try:
        with context():
            sdpa(q, k, v, is_causal=causal, enable_gqa=group > 1)
        gqa_kwargs = {"enable_gqa": group > 1}
    except TypeError:  # torch before 2.5: no enable_gqa
        k = k.repeat_interleave(group, dim=1)
        v = v.repeat_interleave(group, dim=1)
        gqa_kwargs = {}

    def call():
        with context():
            return sdpa(q, k, v, is_causal=causal, **gqa_kwargs)

    return call


def run_decode(runner, torch, backends):
    for batch, kv_len in DECODE_SHAPES:
        nbytes = batch * kv_len * KV_HEADS * (HEAD_DIM + HEAD_DIM) * 2.0
        flops = attention_flops(batch, QO_HEADS, HEAD_DIM, HEAD_DIM, 1, kv_len)
        tensors = {}

        def make_tensors(batch=batch, kv_len=kv_len):
            if not tensors:
                options = {"device": "cuda", "dtype": torch.bfloat16}
                tensors["q"] = torch.randn(batch, QO_HEADS, 1, HEAD_DIM, **options)
                tensors["k"] = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, **options)
                tensors["v"] = torch.randn(batch, KV_HEADS, kv_len, HEAD_DIM, **options)
            return tensors["q"], tensors["k"], tensors["v"]

        for suffix, context in backends:
            runner.run(
                f"sdpa_decode_b{batch}_k{kv_len}{suffix}",
                lambda context=context: sdpa_call(torch, *make_tensors(), False, context),
                nbytes=nbytes,
                flops=flops,
            )
        tensors.clear()
        torch.cuda.empty_cache()


def run_prefill(runner, torch, backends):
    shapes = [  # (name, batch, kv_heads, tokens, all backends?)
        ("mha32_b1_q4096", 1, QO_HEADS, 4096, True),
        ("gqa32x8_b1_q4096", 1, KV_HEADS, 4096, False),
        ("gqa32x8_b8_q1024", 8, KV_HEADS, 1024, False),
    ]
    for name, batch, kv_heads, tokens, every_backend in shapes:
        flops = attention_flops(batch, QO_HEADS, HEAD_DIM, HEAD_DIM, tokens, tokens)

        def make(batch=batch, kv_heads=kv_heads, tokens=tokens, context=contextlib.nullcontext):
            options = {"device": "cuda", "dtype": torch.bfloat16}
            q = torch.randn(batch, QO_HEADS, tokens, HEAD_DIM, **options)
            k = torch.randn(batch, kv_heads, tokens, HEAD_DIM, **options)
            v = torch.randn(batch, kv_heads, tokens, HEAD_DIM, **options)
            return sdpa_call(torch, q, k, v, True, context)

        for suffix, context in backends if every_backend else backends[:1]:
            runner.run(
                f"sdpa_prefill_{name}{suffix}",
                lambda make=make, context=context: make(context=context),
                flops=flops,
            )


def run_matmul(runner, torch):
    def make():
        a = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(MATMUL_N, MATMUL_N, device="cuda", dtype=torch.bfloat16)
        return lambda: torch.matmul(a, b, out=out)

    runner.run(f"torch_matmul_bf16_{MATMUL_N}", make, flops=2.0 * MATMUL_N**3)


def run_copy(runner, torch):
    def make():
        src = torch.ones(COPY_BYTES, device="cuda", dtype=torch.uint8)
        dst = torch.empty_like(src)
        return lambda: dst.copy_(src)

    runner.run("torch_copy_d2d_2GiB", make, nbytes=2.0 * COPY_BYTES, is_copy=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer samples")
    parser.add_argument("--json", help="also write every result as a JSON line to FILE")
    parser.add_argument("--filter", default="", help="only cases whose name contains this")
    parser.add_argument("--budget", type=float, default=60.0, help="no case starts after S s")
    args = parser.parse_args()
    try:
        import torch
    except Exception as error:
        print(f"# torch not available ({error}); no peer measurements")
        return 0
    if not torch.cuda.is_available():
        print(f"# torch {torch.__version__} sees no CUDA device; no peer measurements")
        return 0
    properties = torch.cuda.get_device_properties(0)
    print(
        "# torch peers of pagedattn_bench_cuda; bytes / FLOP formulas as there: decode bytes = "
        "keys x kv_heads x (head_dim + v_head_dim) x 2; FLOPs = 2 * qo_heads * (head_dim + "
        "v_head_dim) * pairs, pairs = kv_len (decode), q*kv - q^2/2 (causal prefill); "
        "frac_copy against torch_copy_d2d_2GiB"
    )
    print(
        f'device name="{properties.name}" sm_count={properties.multi_processor_count} '
        f"cc={properties.major}.{properties.minor} torch={torch.__version__} "
        f"cuda={torch.version.cuda} cudnn={torch.backends.cudnn.version()}",
        flush=True,
    )
    runner = Runner(torch, args)
    if runner.json:
        runner.json.write(
            json.dumps(
                {
                    "case": "device",
                    "name": properties.name,
                    "sm_count": properties.multi_processor_count,
                    "cc": f"{properties.major}.{properties.minor}",
                    "torch": torch.__version__,
                    "cuda": torch.version.cuda,
                }
            )
            + "\n"
        )
    backends = sdpa_backends(torch)
    torch.manual_seed(0)
    run_copy(runner, torch)
    run_decode(runner, torch, backends)
    run_prefill(runner, torch, backends)
    run_matmul(runner, torch)
    print(f"summary seconds={time.monotonic() - runner.start:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
