"""torch tensors in and out through DLPack, without copies (CPU tensors):
bfloat16 tensors, strided views (slices of a fused QKV tensor, head-major
transposes) and the refusal of overlapping ones.

Skipped when torch is not installed: the CI venv does not carry it (the CPU
wheel is large); docs/python.md records a run."""
import math
import sys

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import pagedattn  # noqa: E402
from pagedattn import ops  # noqa: E402
import numpy_reference as ref  # noqa: E402

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


# bfloat16 keeps 8 significant bits: rounding a result to it moves it by at
# most 2^-8 of its magnitude. Inputs are bfloat16 already (stored exactly),
# the kernels work in float32; BF16_ATOL covers their float32 rounding.
BF16_RTOL, BF16_ATOL = 2.0 ** -8, 1e-4


def bf16(*shape):
    return torch.randn(*shape).to(torch.bfloat16)


def as_bf16_tensor(array):
    """A pagedattn bfloat16 result (ml_dtypes, or tagged uint16 bits) as a
    torch.bfloat16 tensor over the same memory."""
    tensor = torch.from_dlpack(array.view(np.uint16)).view(torch.bfloat16)
    assert tensor.data_ptr() == ptr(array)
    return tensor


def assert_within_bf16(got, expected):
    got = got.double().numpy()
    bound = BF16_RTOL * np.abs(expected) + BF16_ATOL
    assert np.all(np.abs(got - expected) <= bound), np.max(np.abs(got - expected) - bound)


def doubles(*tensors):
    return [t.double().numpy() for t in tensors]


def cache_attention_bf16(q, k, v, cache_dtype="bfloat16"):
    cache = pagedattn.KVCache(num_layers=1, num_qo_heads=HQ, num_kv_heads=HKV, head_dim=D,
                              page_size=4, num_pages=16, dtype=cache_dtype, layout="NHD")
    cache.add_sequence(0)
    cache.begin_forward([0], [3])
    out = cache.attention(0, q, k, v)
    cache.end_forward()
    return cache, out


@pytest.mark.parametrize("cache_dtype", ["bfloat16", "float32"])
def test_bfloat16_tensors_attend_within_bf16_of_float64(cache_dtype):
    q, k, v = bf16(3, HQ, D), bf16(3, HKV, D), bf16(3, HKV, D)
    cache, out = cache_attention_bf16(q, k, v, cache_dtype)
    assert out.shape == (3, HQ, D) and out.dtype.itemsize == 2
    assert_within_bf16(as_bf16_tensor(out), cache_attention_numpy(*doubles(q, k, v)))
    # The tensors' bits went into the cache unchanged (bf16 -> bf16 or f32).
    got_k, got_v = cache.get_kv(0, 0, 3)
    np.testing.assert_array_equal(got_k[0], k.float().numpy())
    np.testing.assert_array_equal(got_v[0], v.float().numpy())


def test_bfloat16_tensors_and_ml_dtypes_arrays_give_the_same_bits():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    q, k, v = bf16(3, HQ, D), bf16(3, HKV, D), bf16(3, HKV, D)
    _, from_torch = cache_attention_bf16(q, k, v)
    assert from_torch.dtype == ml_dtypes.bfloat16     # numpy's convention for bf16
    as_ml = [t.view(torch.int16).numpy().view(ml_dtypes.bfloat16) for t in (q, k, v)]
    _, from_numpy = cache_attention_bf16(*as_ml)
    assert from_numpy.dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(from_torch.view(np.uint16), from_numpy.view(np.uint16))


def test_bfloat16_tensors_without_ml_dtypes_round_trip_as_tagged_bits(monkeypatch):
    q, k, v = bf16(3, HQ, D), bf16(3, HKV, D), bf16(3, HKV, D)
    _, expected = cache_attention_bf16(q, k, v)
    monkeypatch.setitem(sys.modules, "ml_dtypes", None)   # import ml_dtypes now fails
    _, out = cache_attention_bf16(q, k, v)
    assert out.dtype == np.uint16 and out.dtype.metadata == {"pagedattn_dtype": "bfloat16"}
    np.testing.assert_array_equal(out, expected.view(np.uint16))
    # Tagged bits need no dtype string: they go back in as bfloat16.
    _, again = cache_attention_bf16(out, k, v)
    np.testing.assert_array_equal(again, cache_attention_bf16(as_bf16_tensor(out), k, v)[1])
    assert torch.equal(torch.from_dlpack(out).view(torch.bfloat16), as_bf16_tensor(out))


def test_bfloat16_caches_are_written_in_place_and_decoded():
    key_cache = torch.zeros(4, 4, HKV, D, dtype=torch.bfloat16)
    value_cache = torch.zeros(4, 4, HKV, D, dtype=torch.bfloat16)
    k, v = bf16(6, HKV, D), bf16(6, HKV, D)
    slots = torch.tensor([5, 6, 7, 8, 9, 10])
    pointer = key_cache.data_ptr()
    ops.reshape_and_cache(k, v, key_cache, value_cache, slots)
    assert key_cache.data_ptr() == pointer
    assert torch.equal(key_cache.view(-1, HKV, D)[slots], k)
    assert torch.equal(value_cache.view(-1, HKV, D)[slots], v)
    q = bf16(1, HQ, D)
    table = torch.tensor([[1, 2, 0, 3]], dtype=torch.int32)
    out = ops.paged_attention_decode(q, key_cache, value_cache, table, torch.tensor([7]),
                                     num_kv_heads=HKV, scale=D ** -0.5)
    keys = key_cache.view(-1, HKV, D)[4:11].double().numpy()
    values = value_cache.view(-1, HKV, D)[4:11].double().numpy()
    assert_within_bf16(as_bf16_tensor(out), ref.attention(q.double().numpy(), keys, values,
                                                          D ** -0.5))


def test_float8_tensor_caches_carry_their_dtype():
    key_cache = torch.zeros(2, 4, HKV, D, dtype=torch.float8_e4m3fn)
    value_cache = torch.zeros(2, 4, HKV, D, dtype=torch.float8_e4m3fn)
    k, v = torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    ops.reshape_and_cache(k, v, key_cache, value_cache, torch.tensor([1, 2, 3]),
                          kv_cache_dtype="fp8", k_scale=0.5, v_scale=0.25)
    stored = key_cache.view(torch.uint8).view(-1, HKV, D)[1:4].numpy()
    np.testing.assert_array_equal(ref.fp8_value(stored, "e4m3fn"),
                                  ref.fp8_value(ref.fp8_bits(k.numpy() / 0.5, "e4m3fn"), "e4m3fn"))


def test_vllm_prefix_prefill_with_bfloat16_tensors():
    key_cache = torch.zeros(6, 4, HKV, D, dtype=torch.bfloat16)
    value_cache = torch.zeros(6, 4, HKV, D, dtype=torch.bfloat16)
    table = torch.tensor([[2, 0, 5]], dtype=torch.int32)
    length, new = 10, 4                       # 6 cached keys, 4 new queries
    slots = torch.tensor([int(table[0, p // 4]) * 4 + p % 4 for p in range(length)])
    k, v = bf16(length, HKV, D), bf16(length, HKV, D)
    ops.reshape_and_cache(k, v, key_cache, value_cache, slots)
    q = bf16(new, HQ, D)
    out = ops.paged_attention_prefix(q, key_cache, value_cache, table,
                                     torch.tensor([0, new], dtype=torch.int32),
                                     torch.tensor([length], dtype=torch.int32))
    expected = ref.attention(*doubles(q, k, v), 1 / math.sqrt(D))
    assert_within_bf16(as_bf16_tensor(out), expected)


# Strided views: the kernels read them where they are, so the results equal
# those of contiguous copies bit for bit.


def cache_run(q, k, v, fused=None):
    cache = make_cache()
    cache.begin_forward([0], [q.shape[0] if fused is None else fused.shape[0]])
    out = cache.attention(0, q, k, v) if fused is None else cache.attention_with_fused_qkv(0, fused)
    cache.end_forward()
    return out, cache.get_kv(0, 0, cache.sequence_length(0))


def test_fused_qkv_slices_and_head_major_views_equal_contiguous_copies():
    T = 3
    qkv = torch.randn(T, (HQ + 2 * HKV) * D)
    q = qkv[:, :HQ * D].view(T, HQ, D)                   # rows of the fused tensor
    v = qkv[:, (HQ + HKV) * D:].view(T, HKV, D)
    k = torch.randn(HKV, T, D).transpose(0, 1)           # head-major
    q_head_major = torch.randn(HQ, T, D).transpose(0, 1)
    for args in ((q, k, v), (q_head_major, k, v)):
        assert not all(a.is_contiguous() for a in args)
        out, kv = cache_run(*args)
        out_dense, kv_dense = cache_run(*(a.contiguous() for a in args))
        np.testing.assert_array_equal(out, out_dense)
        np.testing.assert_array_equal(kv[0], kv_dense[0])
        np.testing.assert_array_equal(kv[1], kv_dense[1])
    fused = torch.randn(HQ + 2 * HKV, T, D).transpose(0, 1)   # head-major fused QKV
    out, kv = cache_run(None, None, None, fused=fused)
    out_dense, kv_dense = cache_run(None, None, None, fused=fused.contiguous())
    np.testing.assert_array_equal(out, out_dense)
    np.testing.assert_array_equal(kv[0], kv_dense[0])


def test_strided_operator_arguments_equal_contiguous_copies():
    T = 5
    key = torch.randn(HKV, T, D).transpose(0, 1)
    value = torch.randn(T, 2 * HKV * D)[:, HKV * D:].view(T, HKV, D)
    query = torch.randn(HQ, 2, D).transpose(0, 1)
    table = torch.tensor([[3, 1], [0, 2]], dtype=torch.int32)
    slots = torch.tensor([12, 13, 14, 15, 4, 0, 1], dtype=torch.int64)[:T]
    lens = torch.tensor([5, 0], dtype=torch.int32)
    # NHD caches over head-major (HND) memory, and halves of one [2, ...] tensor.
    caches = (torch.zeros(4, HKV, 4, D).permute(0, 2, 1, 3), torch.zeros(2, 4, 4, HKV, D)[1])
    results = []
    for dense in (False, True):
        args = [a.contiguous() if dense else a for a in (key, value, query)]
        kc, vc = (torch.zeros(4, 4, HKV, D) for _ in range(2)) if dense else caches
        ops.reshape_and_cache(args[0], args[1], kc, vc, slots)
        out = ops.paged_attention_decode(args[2], kc, vc, table, lens + torch.tensor([0, 1]),
                                         num_kv_heads=HKV, scale=0.5)
        ragged = ops.ragged_paged_attention(args[2], torch.stack([kc, vc], 3).view(4, 4, 2 * HKV, D),
                                            torch.tensor([5, 1], dtype=torch.int32), table,
                                            torch.tensor([0, 1, 2], dtype=torch.int32), 2)
        results.append((kc.clone(), vc.clone(), out, ragged))
    for got, expected in zip(*results):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(expected))


def test_interleaved_but_disjoint_strides_are_accepted():
    # Token stride 16, head stride 24: the axes interleave, yet no two
    # elements share an address (checked element by element).
    q = torch.randn(112).as_strided((3, HQ, D), (16, 24, 1))
    k, v = torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    np.testing.assert_array_equal(cache_run(q, k, v)[0], cache_run(q.contiguous(), k, v)[0])


def test_overlapping_views_are_refused_naming_argument_shape_and_strides():
    k, v = torch.randn(3, HKV, D), torch.randn(3, HKV, D)
    cache = make_cache()
    cache.begin_forward([0], [3])
    broadcast = torch.randn(3, 1, D).expand(3, HQ, D)     # every head one row
    with pytest.raises(pagedattn.InvalidArgumentError,
                       match=r"q stride\[1\] = 0 overlaps .*\(shape \[3, 4, 8\], "
                             r"strides \[8, 0, 1\]\).*share an address"):
        cache.attention(0, broadcast, k, v)
    sliding = torch.randn(64).as_strided((3, HKV, D), (4, 16, 1))  # tokens 4 apart, rows of 8
    with pytest.raises(ValueError, match=r"k stride\[0\] = 4 overlaps the 8 elements of axis 2 "
                                         r"\(shape \[3, 2, 8\], strides \[4, 16, 1\]\)"):
        cache.attention(0, torch.randn(3, HQ, D), sliding, v)
    cache.attention(0, torch.randn(3, HQ, D), k, v)       # the step is still usable
    cache.end_forward()
    with pytest.raises(ValueError, match=r"query stride\[1\] = 4 .*strides \[32, 4, 1\]"):
        ops.paged_attention_decode(torch.randn(64).as_strided((1, HQ, D), (32, 4, 1)),
                                   torch.zeros(2, 4, HKV, D), torch.zeros(2, 4, HKV, D),
                                   [[0, 1]], [3], num_kv_heads=HKV, scale=1.0)


class LegacyProducer:
    """A DLPack producer from before DLPack 1.0: __dlpack__ takes no max_version."""

    def __init__(self, tensor):
        self.tensor = tensor

    def __dlpack__(self):
        return self.tensor.__dlpack__()


class ReadOnlyProducer(LegacyProducer):
    def __dlpack__(self, max_version=None):
        return self.tensor.__dlpack__(max_version=max_version, read_only=True)


def test_legacy_and_read_only_dlpack_producers():
    k = bf16(3, HKV, D)
    key_cache = torch.zeros(2, 4, HKV, D, dtype=torch.bfloat16)
    value_cache = torch.zeros_like(key_cache)
    ops.reshape_and_cache(LegacyProducer(k), k, LegacyProducer(key_cache), value_cache, [0, 1, 2])
    assert torch.equal(key_cache.view(-1, HKV, D)[:3], k)
    with pytest.raises(ValueError, match="key_cache is read-only"):
        ops.reshape_and_cache(k, k, ReadOnlyProducer(key_cache), value_cache, [0, 1, 2])
