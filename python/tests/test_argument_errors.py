"""Arguments of the wrong Python type raise TypeError, invalid values
ValueError (pagedattn.InvalidArgumentError), each naming the call and the
argument; KVCache.get_kv / set_kv check seq_id, start and end before any
arithmetic or allocation (a wild end used to overflow end - start or try to
allocate tens of GiB)."""

import numpy as np
import pytest

import pagedattn
from pagedattn import ops


def cache_with_tokens(tokens=5):
    cache = pagedattn.KVCache(num_layers=2, num_qo_heads=2, num_kv_heads=1, head_dim=8,
                              page_size=4, num_pages=8, dtype="float32")
    cache.add_sequence(0)
    cache.begin_forward([0], [tokens])
    for layer in range(2):
        x = np.ones((tokens, 1, 8), np.float32)
        cache.attention(layer, np.ones((tokens, 2, 8), np.float32), x, x)
    cache.end_forward()
    return cache


@pytest.mark.parametrize("start, end, message", [
    (0, 2**62, r"end = 4611686018427387904 is not inside \[start = 0, 5\]"),
    (-2**63, 2**63 - 1, r"start = -9223372036854775808 is not inside \[0, 5\]"),
    (3, 2, r"end = 2 is not inside \[start = 3, 5\]"),
    (6, 6, r"start = 6 is not inside \[0, 5\]"),
])
def test_get_and_set_kv_check_the_range_before_allocating(start, end, message):
    cache = cache_with_tokens()
    with pytest.raises(pagedattn.InvalidArgumentError, match="KVCache.get_kv: " + message):
        cache.get_kv(0, start, end)
    block = np.zeros((2, 1, 1, 8), np.float32)  # any shape: the range is checked first
    with pytest.raises(ValueError, match="KVCache.set_kv: " + message):
        cache.set_kv(0, start, end, block, block)


def test_get_kv_unknown_sequence_and_a_valid_range():
    cache = cache_with_tokens()
    with pytest.raises(ValueError, match="KVCache.get_kv: seq_id = 9 is not in the cache"):
        cache.get_kv(9, 0, 1)
    k, v = cache.get_kv(np.int64(0), 1, 5)
    assert k.shape == (2, 4, 1, 8) and v.shape == (2, 4, 1, 8)
    cache.set_kv(0, 1, 5, k, v)


@pytest.mark.parametrize("args, error, message", [
    (("a", 0, 1), TypeError, "KVCache.get_kv: seq_id must be an int, got str"),
    ((0, 0.5, 1), TypeError, "KVCache.get_kv: start must be an int, got float"),
    ((0, 0, None), TypeError, "KVCache.get_kv: end must be an int, got NoneType"),
    ((0, 0, 2**70), ValueError,
     "KVCache.get_kv: end = 1180591620717411303424 does not fit a signed 64-bit integer"),
])
def test_get_kv_names_the_bad_argument(args, error, message):
    cache = cache_with_tokens()
    with pytest.raises(error, match=message):
        cache.get_kv(*args)


def test_token_tree_parents_of_the_wrong_type_is_a_named_type_error():
    cache = cache_with_tokens()
    digest = cache.get_kv(0, 0, 5)
    with pytest.raises(TypeError, match="token_tree_parents must be a sequence of ints, got str"):
        cache.begin_forward([0], [2], token_tree_parents="ab")
    with pytest.raises(TypeError, match=r"token_tree_parents\[1\] must be an int, got str"):
        cache.begin_forward([0], [2], token_tree_parents=[-1, "a"])
    after = cache.get_kv(0, 0, 5)
    for a, b in zip(digest, after):
        np.testing.assert_array_equal(a, b)
    assert cache.sequence_length(0) == 5


def ort_args():
    cache = np.zeros((2, 4, 8), np.float32)
    q, kv = np.ones((1, 16), np.float32), np.ones((1, 8), np.float32)
    return (q, kv, kv, cache, cache.copy(), np.array([0, 1], np.int32), np.array([0], np.int32),
            np.array([[0, 1]], np.int32))


@pytest.mark.parametrize("kwargs, error, message", [
    (dict(num_heads="2"), TypeError, "ort_paged_attention: num_heads must be an int, got str"),
    (dict(kv_num_heads=1.0), TypeError,
     "ort_paged_attention: kv_num_heads must be an int, got float"),
    (dict(num_heads=2**40), ValueError,
     "ort_paged_attention: num_heads = 1099511627776 does not fit a signed 32-bit integer"),
    (dict(local_window_size=-2**31 - 1), ValueError,
     "ort_paged_attention: local_window_size = -2147483649 does not fit"),
])
def test_ort_int_attributes_name_the_bad_argument(kwargs, error, message):
    attributes = dict(num_heads=2, kv_num_heads=1) | kwargs
    with pytest.raises(error, match=message):
        ops.ort_paged_attention(*ort_args(), **attributes)
    assert ops.ort_paged_attention(*ort_args(), num_heads=np.int32(2), kv_num_heads=1).shape == (1, 16)


def test_vllm_and_torch_xla_int_arguments_name_the_bad_argument():
    q = np.zeros((1, 2, 8), np.float32)
    cache = np.zeros((1, 4, 1, 8), np.float32)
    with pytest.raises(TypeError, match="paged_attention_decode: num_kv_heads must be an int"):
        ops.paged_attention_decode(q, cache, cache, np.zeros((1, 1), np.int32),
                                   np.ones(1, np.int32), num_kv_heads=None, scale=1.0)
    with pytest.raises(TypeError, match="ragged_paged_attention: sliding_window must be an int"):
        ops.ragged_paged_attention(q, np.zeros((1, 4, 2, 8), np.float32), np.ones(1, np.int32),
                                   np.zeros((1, 1), np.int32), np.array([0, 1], np.int32), 1,
                                   sliding_window=2.5)
