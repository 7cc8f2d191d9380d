"""SmolLM2-135M-Instruct (GGUF, Q4_1) through pagedattn's Llama model against an
independent float64 NumPy implementation of the Llama architecture.

The reference dequantises the weights with the `gguf` package, undoes
llama.cpp's q/k row permutation (so it rotates with Hugging Face's
rotate_half, not with the interleaved pairs pagedattn uses on GGUF weights),
and runs the model in float64. pagedattn runs f32 activations over the same
(exact) weights; the tolerance below is justified in the test.
"""
import os
import pathlib
import subprocess

import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import pagedattn._core as core  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[2]


def model_path():
    path = os.environ.get("PAGEDATTN_TEST_MODEL")
    if not path:
        script = REPO / "scripts" / "get_test_model.sh"
        if not script.exists():
            pytest.skip("scripts/get_test_model.sh is missing")
        run = subprocess.run([str(script)], capture_output=True, text=True)
        if run.returncode != 0:
            pytest.skip("test model unavailable: " + run.stderr.strip()[-300:])
        path = run.stdout.strip().splitlines()[-1]
    return path


class ReferenceLlama:
    """float64 Llama forward pass from the GGUF file (Hugging Face conventions)."""

    def __init__(self, path):
        r = gguf.GGUFReader(path)
        field = lambda k: r.fields[k].contents()  # noqa: E731
        self.layers = int(field("llama.block_count"))
        self.heads = int(field("llama.attention.head_count"))
        self.kv_heads = int(field("llama.attention.head_count_kv"))
        self.hidden = int(field("llama.embedding_length"))
        self.head_dim = self.hidden // self.heads
        self.theta = float(field("llama.rope.freq_base"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        tensors = {t.name: t for t in r.tensors}

        def weight(name):
            t = tensors[name]
            return np.asarray(gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float64)

        def unpermute(w, heads):  # GGUF row 2i + s of a head is HF row i + s * head_dim / 2
            hd = self.head_dim
            return w.reshape(heads, hd // 2, 2, -1).swapaxes(1, 2).reshape(heads * hd, -1)

        self.embedding = weight("token_embd.weight")
        self.output = weight("output.weight") if "output.weight" in tensors else self.embedding
        self.final_norm = weight("output_norm.weight")
        self.blocks = []
        for i in range(self.layers):
            p = f"blk.{i}."
            self.blocks.append(dict(
                attn_norm=weight(p + "attn_norm.weight"),
                q=unpermute(weight(p + "attn_q.weight"), self.heads),
                k=unpermute(weight(p + "attn_k.weight"), self.kv_heads),
                v=weight(p + "attn_v.weight"),
                o=weight(p + "attn_output.weight"),
                ffn_norm=weight(p + "ffn_norm.weight"),
                gate=weight(p + "ffn_gate.weight"),
                up=weight(p + "ffn_up.weight"),
                down=weight(p + "ffn_down.weight"),
            ))

    def rms_norm(self, x, w):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + self.eps) * w

    def rope(self, x):  # x [n][heads][hd], rotate_half convention
        n, hd = x.shape[0], self.head_dim
        inv = self.theta ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)
        ang = np.arange(n, dtype=np.float64)[:, None] * inv[None, :]
        cos = np.concatenate([np.cos(ang)] * 2, axis=-1)[:, None, :]
        sin = np.concatenate([np.sin(ang)] * 2, axis=-1)[:, None, :]
        half = hd // 2
        rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rotated * sin

    def logits(self, tokens):
        n, hd = len(tokens), self.head_dim
        x = self.embedding[np.asarray(tokens)]
        mask = np.triu(np.full((n, n), -np.inf), k=1)
        group = self.heads // self.kv_heads
        for b in self.blocks:
            h = self.rms_norm(x, b["attn_norm"])
            q = self.rope((h @ b["q"].T).reshape(n, self.heads, hd))
            k = self.rope((h @ b["k"].T).reshape(n, self.kv_heads, hd))
            v = (h @ b["v"].T).reshape(n, self.kv_heads, hd)
            out = np.empty((n, self.heads, hd))
            for head in range(self.heads):
                s = q[:, head] @ k[:, head // group].T / np.sqrt(hd) + mask
                p = np.exp(s - s.max(axis=-1, keepdims=True))
                out[:, head] = (p / p.sum(axis=-1, keepdims=True)) @ v[:, head // group]
            x = x + out.reshape(n, -1) @ b["o"].T
            h = self.rms_norm(x, b["ffn_norm"])
            gate = h @ b["gate"].T
            x = x + ((gate / (1 + np.exp(-gate))) * (h @ b["up"].T)) @ b["down"].T
        return self.rms_norm(x, self.final_norm) @ self.output.T


@pytest.fixture(scope="module")
def smollm2():
    path = model_path()
    return path, ReferenceLlama(path), core.GgufModel(path)


def prompts(vocab):
    rng = np.random.default_rng(7)
    yield "random ids", [int(t) for t in rng.integers(0, vocab, 72)]
    # A fixed stretch of ordinary text ids: the ids of the vocabulary's common
    # word pieces 300..600 in a shuffled order, then repeated (induction).
    words = [int(t) for t in rng.permutation(np.arange(300, 600))[:40]]
    yield "repeated text", words + words
    yield "counting", [int(t) for t in np.arange(1000, 1096)]


# f32 activations over 30 layers: each product rounds a sum of up to 1536
# terms (~1e-7 relative per term), RMSNorm divides by the residual stream's
# RMS, softmax and SiLU add 1-ulp errors. Measured on this model: <= 1.1e-4
# absolute on logits up to ~37 with f32 K/V. The bound leaves 10x for other
# SIMD targets and BLAS kernels and still fails on any real mistake (a wrong
# RoPE pair, a transposed or mis-dequantised weight moves logits by > 1).
# f16 K/V rounds every key and value to 11 bits (relative 2^-12), which the
# attention scores carry into the logits: measured <= 6.0e-2 there; 0.25
# leaves 4x and is still far below a real mistake.
TOLERANCE = {"f32": 1e-3, "f16": 0.25}


def test_logits_match_a_float64_numpy_llama(smollm2):
    path, ref, model = smollm2
    for name, tokens in prompts(model.vocab_size):
        want = ref.logits(tokens)
        for kv_dtype, tolerance in TOLERANCE.items():
            got = model.logits(tokens, kv_dtype=kv_dtype).astype(np.float64)
            assert got.shape == want.shape
            top1 = np.mean(np.argmax(got, axis=-1) == np.argmax(want, axis=-1))
            err = np.max(np.abs(got - want))
            print(f"{name}, {kv_dtype} K/V: {len(tokens)} positions, top-1 agreement {top1:.4f}, "
                  f"max |logit error| {err:.2e} (logits up to {np.max(np.abs(want)):.1f})")
            assert top1 >= 0.99, (name, kv_dtype)
            assert err < tolerance, (name, kv_dtype)
