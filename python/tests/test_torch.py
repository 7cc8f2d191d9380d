"""torch tensors in and out through DLPack, without copies (CPU tensors).

Skipped when torch is not installed: the CI venv does not carry it (the CPU
wheel is large); docs/python.md records a run."""
import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pagedattn  # noqa: E402
from pagedattn import ops  # noqa: E402

HQ, HKV, D = 4, 2, 8


def ptr(array):
    return array.__array_interface__["data"][0]


def make_cache():
    cache = pagedattn.KVCache(num_layers=1, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                              page_size=4, num_pages=16, dtype="float32", layout="NHD")
    cache.add_sequence(0)
    return cache


def test_plan_and_storage_views_become_tensors_without_copies():
    cache = make_cache()
    plan = cache.begin_forward([0], [5])
    for name in ("qo_indptr", "kv_indptr", "kv_indices", "kv_lens", "positions", "slot_mapping"):
        array = getattr(plan, name)
        tensor = torch.from_dlpack(array)
        assert tensor.data_ptr() == ptr(array), name
        assert tensor.tolist() == array.tolist(), name
    storage = cache.layer_storage(0)
    k = torch.from_dlpack(storage.k)
    assert k.data_ptr() == ptr(storage.k) and tuple(k.shape) == storage.k.shape
    # Writing through the tensor writes the cache's pages.
    key = torch.randn(5, HKV, D)
    value = torch.randn(5, HKV, D)
    slots = torch.from_dlpack(plan.slot_mapping)
    k.view(-1, HKV, D)[slots] = key
    torch.from_dlpack(storage.v).view(-1, HKV, D)[slots] = value
    cache.mark_layer_appended(0)
    cache.end_forward()
    got_k, got_v = cache.get_kv(0, 0, 5)
    np.testing.assert_array_equal(got_k[0], key.numpy())
    np.testing.assert_array_equal(got_v[0], value.numpy())


def test_tensor_inputs_are_used_in_place_and_outputs_convert_without_copies():
    cache = make_cache()
    plan = cache.begin_forward([0], [3])
    q, k, v = torch.randn(3, HQ, D), torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    out = cache.attention(0, q, k, v)
    cache.end_forward()
    tensor = torch.from_dlpack(out)
    assert tensor.data_ptr() == ptr(out)
    expected = cache_attention_numpy(q.numpy(), k.numpy(), v.numpy())
    np.testing.assert_allclose(tensor.numpy(), expected, rtol=1e-5, atol=1e-6)

    # A torch cache is written in place (vLLM's reshape_and_cache), and
    # torch int64 / int32 index tensors are accepted (converted when needed).
    key_cache = torch.zeros(4, 4, HKV, D)
    value_cache = torch.zeros(4, 4, HKV, D)
    slots = torch.tensor([3, 9, 0], dtype=torch.int32)
    ops.reshape_and_cache(k, v, key_cache, value_cache, slots)
    assert torch.equal(key_cache.view(-1, HKV, D)[slots.long()], k)
    decoded = ops.paged_attention_decode(q[:1], key_cache, value_cache,
                                         torch.tensor([[0, 1, 2, 3]], dtype=torch.int64),
                                         torch.tensor([10]), num_kv_heads=HKV, scale=0.5)
    assert decoded.shape == (1, HQ, D)
    assert plan.num_tokens == 3


def cache_attention_numpy(q, k, v):
    """Causal attention of one sequence's 3 tokens (float64)."""
    group = HQ // HKV
    kk, vv = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
    s = np.einsum("nhd,lhd->hnl", q.astype(np.float64), kk) / np.sqrt(D)
    s = np.where(np.tril(np.ones((3, 3), bool))[None], s, -np.inf)
    w = np.exp(s - s.max(axis=2, keepdims=True))
    w /= w.sum(axis=2, keepdims=True)
    return np.einsum("hnl,lhd->nhd", w, vv)
