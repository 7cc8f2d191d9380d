"""pagedattn.ops.ort_paged_attention against ONNX Runtime itself: ORT's CPU
com.microsoft.GroupQueryAttention (the non-paged sibling of PagedAttention,
same attributes) run through the `onnxruntime` package on the same queries,
keys and values laid out contiguously. Covers GQA head ratios, prefill,
decode and chunked prefill over a cached prefix, softcap and
local_window_size -1 / 1 / small / larger than the sequence, which current
ORT (its PR #25927) defines as the last L keys, the query's own included."""

import numpy as np
import pytest

from pagedattn import ops

ort = pytest.importorskip(
    "onnxruntime", reason="onnxruntime (PyPI) is needed to compare with ORT's GroupQueryAttention")
onnx = pytest.importorskip(
    "onnx", reason="onnx (PyPI) is needed to build the GroupQueryAttention test model")
from onnx import TensorProto, helper  # noqa: E402

rng = np.random.default_rng(2025)


def gqa_session(num_heads, kv_num_heads, local_window_size, softcap):
    """One com.microsoft.GroupQueryAttention node; inputs query/key/value
    [1, S, H*D], past_key/past_value [1, Hkv, P, D] (BNSH), seqlens_k [1]
    (total length - 1), total_sequence_length (scalar)."""
    names = ["query", "key", "value", "past_key", "past_value"]
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in names]
    inputs += [helper.make_tensor_value_info("seqlens_k", TensorProto.INT32, None),
               helper.make_tensor_value_info("total_sequence_length", TensorProto.INT32, None)]
    outputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, None)
               for n in ("output", "present_key", "present_value")]
    node = helper.make_node(
        "GroupQueryAttention", names + ["seqlens_k", "total_sequence_length"],
        ["output", "present_key", "present_value"], domain="com.microsoft",
        num_heads=num_heads, kv_num_heads=kv_num_heads, local_window_size=local_window_size,
        softcap=softcap)
    model = helper.make_model(
        helper.make_graph([node], "gqa", inputs, outputs),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)])
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def ort_gqa(session, q, k_new, v_new, k_past, v_past, hkv, d):
    """One sequence through ORT: q [S, Hq*D], k/v_new [S, Hkv*D], k/v_past [P, Hkv, D]."""
    s, p = q.shape[0], k_past.shape[0]
    bnsh = lambda x: np.ascontiguousarray(x.transpose(1, 0, 2)[None])  # noqa: E731
    return session.run(None, {
        "query": q[None], "key": k_new[None], "value": v_new[None],
        "past_key": bnsh(k_past), "past_value": bnsh(v_past),
        "seqlens_k": np.array([p + s - 1], np.int32),
        "total_sequence_length": np.array(p + s, np.int32),
    })[0][0]


def check_parity(hq, hkv, d, block_size, seqs, local_window_size, softcap=0.0):
    """seqs: (past, new) per sequence, all run in one paged call."""
    randn = lambda *shape: rng.standard_normal(shape).astype(np.float32)  # noqa: E731
    max_blocks = max(-(-(p + n) // block_size) for p, n in seqs)
    num_blocks = len(seqs) * max_blocks + 3
    # Poisoned caches: a slot the op should not read makes the output NaN.
    key_cache = np.full((num_blocks, block_size, hkv * d), np.nan, np.float32)
    value_cache = key_cache.copy()
    table = rng.permutation(num_blocks)[: len(seqs) * max_blocks].reshape(len(seqs), max_blocks)
    table = table.astype(np.int32)
    news = [n for _, n in seqs]
    cu = np.concatenate([[0], np.cumsum(news)]).astype(np.int32)
    tokens = int(cu[-1])
    query, key, value = randn(tokens, hq * d), randn(tokens, hkv * d), randn(tokens, hkv * d)
    pasts = []
    for b, (p, _) in enumerate(seqs):
        k_past, v_past = randn(p, hkv, d), randn(p, hkv, d)
        for pos in range(p):
            block, slot = table[b, pos // block_size], pos % block_size
            key_cache[block, slot] = k_past[pos].reshape(-1)
            value_cache[block, slot] = v_past[pos].reshape(-1)
        pasts.append((k_past, v_past))

    out = ops.ort_paged_attention(
        query, key, value, key_cache, value_cache, cu,
        np.array([p for p, _ in seqs], np.int32), table,
        num_heads=hq, kv_num_heads=hkv, softcap=softcap, local_window_size=local_window_size)

    session = gqa_session(hq, hkv, local_window_size, softcap)
    for b, (k_past, v_past) in enumerate(pasts):
        lo, hi = cu[b], cu[b + 1]
        if lo == hi:
            continue
        expected = ort_gqa(session, query[lo:hi], key[lo:hi], value[lo:hi], k_past, v_past, hkv, d)
        np.testing.assert_allclose(
            out[lo:hi], expected, atol=2e-5, rtol=1e-4,
            err_msg=f"sequence {b} (past, new) = {seqs[b]}, heads ({hq}, {hkv}), D {d}, "
                    f"local_window_size {local_window_size}, softcap {softcap}")


SHAPES = [(4, 2, 8, 4), (6, 3, 16, 16), (2, 2, 32, 8), (8, 1, 64, 16)]
BATCHES = [
    [(0, 7)],                        # prefill
    [(9, 1), (0, 1), (30, 1)],       # decode over cached prefixes
    [(5, 6), (0, 12), (17, 3)],      # chunked prefill over a cached prefix
]


@pytest.mark.parametrize("local_window_size", [-1, 1, 2, 5, 1000])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "hq%d_hkv%d_d%d_bs%d" % s)
def test_matches_onnxruntime_group_query_attention(shape, local_window_size):
    hq, hkv, d, block_size = shape
    for seqs in BATCHES:
        check_parity(hq, hkv, d, block_size, seqs, local_window_size)


@pytest.mark.parametrize("local_window_size", [-1, 3])
def test_matches_onnxruntime_with_softcap(local_window_size):
    check_parity(4, 2, 16, 4, [(6, 5), (11, 1)], local_window_size, softcap=2.0)


def test_window_of_zero_keys_is_refused():
    hq, hkv, d, bs = 2, 1, 8, 4
    cache = np.zeros((2, bs, hkv * d), np.float32)
    q, kv = np.ones((1, hq * d), np.float32), np.ones((1, hkv * d), np.float32)
    with pytest.raises(ValueError, match="local_window_size = 0 must be -1 \\(off\\) or >= 1"):
        ops.ort_paged_attention(q, kv, kv, cache, cache.copy(), np.array([0, 1], np.int32),
                                np.array([0], np.int32), np.array([[0, 1]], np.int32),
                                num_heads=hq, kv_num_heads=hkv, local_window_size=0)
