"""Array handling (zero copy, buffer protocol, DLPack, bf16/fp8 as uint arrays
or ml_dtypes) and the mapping of C++ errors to Python exceptions."""

import numpy as np
import pytest

import pagedattn
from pagedattn import ops
import numpy_reference as ref

BS, HKV, D = 4, 2, 8


class DLPackOnly:
    """A producer that only speaks DLPack (like a torch or JAX array)."""

    def __init__(self, array):
        self._array = array

    def __dlpack__(self, **kwargs):
        return self._array.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self._array.__dlpack_device__()


def write_args(cache_dtype=np.float32):
    key = np.random.default_rng(0).standard_normal((3, HKV, D)).astype(np.float32)
    caches = [np.zeros((2, BS, HKV, D), cache_dtype) for _ in range(2)]
    return key, caches, np.array([0, 5, 2], np.int64)


def test_dlpack_and_buffer_protocol_caches_are_written_in_place():
    key, (kc, vc), slots = write_args()
    ops.reshape_and_cache(key, key, DLPackOnly(kc), memoryview(vc), slots)
    flat_k, flat_v = kc.reshape(-1, HKV, D), vc.reshape(-1, HKV, D)
    np.testing.assert_array_equal(flat_k[[0, 5, 2]], key)
    np.testing.assert_array_equal(flat_v[[0, 5, 2]], key)


def test_strided_views_are_used_without_copies():
    # vLLM's [2, num_blocks, ...] KV tensor: K and V are halves, written in place.
    key, _, slots = write_args()
    kv = np.zeros((2, 2, BS, HKV, D), np.float32)
    ops.reshape_and_cache(key, key, kv[0], kv[1], slots)
    np.testing.assert_array_equal(kv[1].reshape(-1, HKV, D)[[0, 5, 2]], key)


def test_read_only_cache_is_refused():
    key, (kc, vc), slots = write_args()
    kc.flags.writeable = False
    with pytest.raises(ValueError, match="key_cache is read-only"):
        ops.reshape_and_cache(key, key, kc, vc, slots)


def test_wrong_dtypes_raise_type_error_naming_the_argument():
    key, (kc, vc), slots = write_args()
    with pytest.raises(TypeError, match="key has dtype float64"):
        ops.reshape_and_cache(key.astype(np.float64), key, kc, vc, slots)
    with pytest.raises(TypeError, match="slot_mapping has dtype float32"):
        ops.reshape_and_cache(key, key, kc, vc, slots.astype(np.float32))
    with pytest.raises(TypeError, match="explicit dtype string"):
        ops.ragged_paged_attention(np.zeros((1, 4, D), np.float32), np.zeros((2, BS, 4, D), np.uint16),
                                   np.array([1], np.int32), np.array([[0]], np.int32),
                                   np.array([0, 1], np.int32), 1)
    with pytest.raises(TypeError, match="must be an array"):
        ops.reshape_and_cache("key", key, kc, vc, slots)


def test_other_integer_index_arrays_are_converted():
    key, (kc, vc), slots = write_args()
    ops.reshape_and_cache(key, key, kc, vc, slots.astype(np.int32))  # vLLM's slots are int64
    flat_k = kc.reshape(-1, HKV, D)
    np.testing.assert_array_equal(flat_k[[0, 5, 2]], key)


def test_library_errors_carry_the_cpp_message():
    key, (kc, vc), slots = write_args()
    with pytest.raises(ValueError, match="slot_mapping") as err:
        ops.reshape_and_cache(key, key, kc, vc, np.array([0, 99, 1], np.int64))  # out of range
    assert isinstance(err.value, pagedattn.InvalidArgumentError)
    assert isinstance(err.value, pagedattn.Error)
    with pytest.raises(ValueError, match="kv_lens holds 1099511627776"):
        ops.ragged_paged_attention(np.zeros((1, 4, D), np.float32), np.zeros((2, BS, 4, D), np.float32),
                                   np.array([2 ** 40], np.int64), np.array([[0]], np.int32),
                                   np.array([0, 1], np.int32), 1)  # int64 beyond int32
    with pytest.raises(ValueError, match="contiguous"):
        big = np.zeros((8, BS, 2 * HKV * D), np.float32)
        ops.ort_paged_attention(np.zeros((1, 4 * D), np.float32), np.zeros((1, HKV * D), np.float32),
                                np.zeros((1, HKV * D), np.float32), big[:, :, ::2], big[:, :, ::2],
                                np.array([0, 1], np.int32), np.array([0], np.int32),
                                np.array([[0]], np.int32), num_heads=4, kv_num_heads=HKV)
    with pytest.raises(ValueError, match="merge_states: s_b"):
        ops.merge_states(np.zeros((2, D), np.float32), np.zeros(2, np.float32),
                         np.zeros((2, D), np.float32), np.zeros(3, np.float32))


def test_kv_cache_errors():
    with pytest.raises(ValueError, match="layout"):
        pagedattn.KVCache(1, 2, 1, 8, 4, 4, layout="XYZ")
    with pytest.raises(ValueError, match="num_kv_heads"):
        pagedattn.KVCache(1, 3, 2, 8, 4, 4)
    cache = pagedattn.KVCache(2, 2, 1, 8, 4, 4, dtype="float32")
    cache.add_sequence(1)
    with pytest.raises(ValueError, match="7"):
        cache.remove_sequence(7)
    with pytest.raises(pagedattn.OutOfPagesError, match="pages") as err:
        cache.begin_forward([1], [17])
    assert isinstance(err.value, RuntimeError)
    assert cache.num_free_pages == 4 and cache.sequence_length(1) == 0  # unchanged
    with pytest.raises(pagedattn.InvalidStateError):
        cache.attention(0, np.zeros((0, 2, 8), np.float32), np.zeros((0, 1, 8), np.float32),
                        np.zeros((0, 1, 8), np.float32))
    cache.begin_forward([1], [2])
    q, kv = np.ones((2, 2, 8), np.float32), np.ones((2, 1, 8), np.float32)
    with pytest.raises(ValueError, match="layer = 5"):
        cache.attention(5, q, kv, kv)
    with pytest.raises(ValueError, match="q has shape"):
        cache.attention(0, q[:1], kv, kv)
    with pytest.raises(ValueError, match="last axis"):
        cache.attention(0, np.ones((2, 2, 16), np.float32)[:, :, ::2], kv, kv)
    with pytest.raises(TypeError, match="float64"):
        cache.attention(0, q.astype(np.float64), kv, kv)
    # A failed call leaves the forward usable.
    for layer in range(2):
        out = cache.attention(layer, q, kv, kv)
        np.testing.assert_allclose(out, 1.0)
    cache.end_forward()
    assert cache.sequence_length(1) == 2
    with pytest.raises(TypeError, match="float32"):
        cache.set_kv(1, 0, 2, np.zeros((2, 2, 1, 8)), np.zeros((2, 2, 1, 8)))
    with pytest.raises(ValueError, match="k has shape"):
        cache.set_kv(1, 0, 2, np.zeros((2, 3, 1, 8), np.float32), np.zeros((2, 2, 1, 8), np.float32))


def test_bfloat16_cache_takes_float32_inputs():
    cache = pagedattn.KVCache(1, 2, 1, 8, 4, 4, dtype="bfloat16")
    cache.add_sequence(0)
    cache.begin_forward([0], [3])
    x = np.random.default_rng(1).standard_normal((3, 2, 8)).astype(np.float32)
    out = cache.attention(0, x, x[:, :1], x[:, :1])
    assert out.dtype == np.float32
    cache.end_forward()
    k, _ = cache.get_kv(0, 0, 3)
    np.testing.assert_array_equal(k[0], ref.bf16_value(ref.bf16_bits(x[:, :1])))


def test_ml_dtypes_arrays():
    ml_dtypes = pytest.importorskip("ml_dtypes")
    rng = np.random.default_rng(5)
    pages32 = rng.standard_normal((2, BS, 2 * HKV, D)).astype(np.float32)
    args = (np.array([5], np.int32), np.array([[1, 0]], np.int32), np.array([0, 2], np.int32), 1)
    q = rng.standard_normal((2, 4, D)).astype(np.float32)
    as_bits = ops.ragged_paged_attention(q, ref.bf16_bits(pages32), *args, kv_dtype="bfloat16")
    as_ml = ops.ragged_paged_attention(q, pages32.astype(ml_dtypes.bfloat16), *args)
    np.testing.assert_array_equal(as_bits, as_ml)
    # bfloat16 activations: the output keeps ml_dtypes' type.
    out = ops.ragged_paged_attention(q.astype(ml_dtypes.bfloat16), pages32.astype(ml_dtypes.bfloat16), *args)
    assert out.dtype == ml_dtypes.bfloat16
    np.testing.assert_allclose(out.astype(np.float32), as_ml, atol=3e-2)
    # float8 caches as ml_dtypes arrays with kv_cache_dtype="fp8".
    kc = np.zeros((2, BS, HKV, D), ml_dtypes.float8_e4m3fn)
    vc = np.zeros_like(kc)
    key = rng.standard_normal((3, HKV, D)).astype(np.float32)
    ops.reshape_and_cache(key, key, kc, vc, np.array([0, 1, 2], np.int64), kv_cache_dtype="fp8")
    np.testing.assert_allclose(kc.reshape(-1, HKV, D)[:3].astype(np.float32), key, rtol=0.07)
    with pytest.raises(TypeError, match="was given"):
        ops.ragged_paged_attention(q, pages32.astype(ml_dtypes.bfloat16), *args, kv_dtype="float8_e5m2")
