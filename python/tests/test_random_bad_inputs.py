"""Randomized bad-input driver (seeded, bounded): random calls on KVCache and
pagedattn.ops with a mix of good and bad arguments (unknown ids, negative or
huge lengths, wrong dtypes, shapes and index values, None, strings). Every
failure must be a typed Python exception, and a failed call must leave the
cache unchanged (sequence lengths, free pages, stored K/V); invariants hold
after every call."""

import random

import numpy as np
import pytest

import pagedattn
from pagedattn import ops

# What a bad argument may raise: the library's errors (InvalidArgumentError is
# a ValueError, ...) and the binding layer's TypeError / ValueError /
# IndexError / OverflowError for arguments that cannot convert.
TYPED = (pagedattn.Error, ValueError, TypeError, IndexError, OverflowError)

LAYERS, HQ, HKV, D, PAGE, PAGES = 2, 4, 2, 8, 4, 12
CALLS = 400


def bad_int(rng):
    return rng.choice([-1, -(2**31), 2**31, 2**63 - 1, 10**6, 0, 1, 2, 3, "3", None, 1.5])


def int_or_bad(rng, good):
    return good if rng.random() < 0.85 else bad_int(rng)


def snapshot(cache, ids):
    """Observable state: free pages, lengths and every sequence's stored K/V."""
    state = [cache.num_free_pages, cache.total_sequence_length]
    for sid in sorted(ids):
        if cache.sequence_length(sid) > 0:
            k, v = cache.get_kv(sid, 0, cache.sequence_length(sid))
            state.append((sid, k.tobytes(), v.tobytes()))
    return state


def random_array(rng, shape, good_dtype=np.float32):
    if rng.random() < 0.15:  # wrong shape: one axis off by one (or dropped)
        shape = list(shape)
        axis = rng.randrange(len(shape))
        shape[axis] = max(0, shape[axis] + rng.choice([-1, 1]))
        if rng.random() < 0.3:
            shape = shape[:-1]
    dtype = good_dtype if rng.random() < 0.85 else rng.choice([np.int32, np.float64, np.int8, np.uint16])
    return (np.arange(int(np.prod(shape)), dtype=np.float64).reshape(shape) % 5 * 0.25).astype(dtype)


def cache_call(rng, cache, ids, step):
    """One random KVCache call; returns (name, thunk). step["tokens"]: the
    current step's token count (None outside a step), so attention usually
    gets matching shapes."""
    sid = rng.choice(ids + [99, -1]) if ids and rng.random() < 0.8 else rng.randrange(-1, 5)
    kind = rng.randrange(10)
    if kind == 0:
        return "add_sequence", lambda: cache.add_sequence(int_or_bad(rng, rng.randrange(0, 5)))
    if kind == 1:
        return "remove_sequence", lambda: cache.remove_sequence(int_or_bad(rng, sid))
    if kind == 2:
        child, pos = int_or_bad(rng, rng.randrange(0, 6)), int_or_bad(rng, rng.randrange(-1, 12))
        return "fork_sequence", lambda: cache.fork_sequence(int_or_bad(rng, sid), child, pos)
    if kind == 3:
        return "pop_n", lambda: cache.pop_n(int_or_bad(rng, sid), int_or_bad(rng, rng.randrange(0, 6)))
    if kind == 4:
        window, sink = int_or_bad(rng, rng.randrange(1, 9)), int_or_bad(rng, rng.randrange(0, 3))
        return "enable_sliding_window", lambda: cache.enable_sliding_window(sid, window, sink)
    if kind == 5:
        seqs = list(dict.fromkeys(int_or_bad(rng, rng.choice(ids + [7])) for _ in range(rng.randrange(0, 3)))) if ids else []
        lengths = [int_or_bad(rng, rng.randrange(0, 7)) for _ in range(len(seqs) + (rng.random() < 0.1))]
        parents = None
        if rng.random() < 0.3 and all(isinstance(n, int) and 0 <= n < 8 for n in lengths):
            parents = [rng.randrange(-2, max(1, i + 1)) for n in lengths for i in range(n)]
        def begin():
            cache.begin_forward(seqs, lengths, parents)
            step["tokens"] = sum(lengths)
        return "begin_forward", begin
    if kind == 6:
        leaves = [int_or_bad(rng, rng.randrange(-1, 4))]
        return "commit_accepted_token_tree_nodes", lambda: cache.commit_accepted_token_tree_nodes([sid], leaves)
    if kind == 7:
        def end():
            cache.end_forward()
            step["tokens"] = None
        return "end_forward", end
    if kind == 8:
        tokens = step["tokens"] if step["tokens"] is not None and rng.random() < 0.8 else rng.randrange(0, 6)
        q, k, v = (random_array(rng, (tokens, h, D)) for h in (HQ, HKV, HKV))
        layer = int_or_bad(rng, rng.randrange(0, LAYERS))
        return "attention", lambda: cache.attention(layer, q, k, v)
    start, end = int_or_bad(rng, rng.randrange(0, 6)), int_or_bad(rng, rng.randrange(0, 8))
    n = end - start if isinstance(end, int) and isinstance(start, int) and 0 <= end - start < 64 else 1
    k, v = random_array(rng, (LAYERS, n, HKV, D)), random_array(rng, (LAYERS, n, HKV, D))
    return "set_kv", lambda: cache.set_kv(sid, start, end, k, v)


@pytest.mark.parametrize("seed", [1, 2, 3])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_random_kv_cache_calls_raise_typed_errors_and_change_nothing(seed, dtype):
    rng = random.Random(seed)
    cache = pagedattn.KVCache(LAYERS, HQ, HKV, D, page_size=PAGE, num_pages=PAGES, dtype=dtype,
                              support_sliding_window=True)
    failures, step = 0, {"tokens": None}
    for _ in range(CALLS):
        ids = known_ids(cache)
        name, call = cache_call(rng, cache, ids, step)
        before = snapshot(cache, ids)
        try:
            call()
        except TYPED as error:
            failures += 1
            assert not isinstance(error, pagedattn.InternalError), f"{name}: {error}"
            assert snapshot(cache, ids) == before, f"{name} failed ({error}) but changed the cache"
        cache.check_invariants()
    assert 0 < failures < CALLS  # both outcomes were exercised


def known_ids(cache):
    ids = []
    for sid in range(-1, 8):
        try:
            cache.sequence_length(sid)
            ids.append(sid)
        except pagedattn.InvalidArgumentError:
            pass
    return ids


def index_array(rng, shape, dtype=np.int32):
    """Index values near the valid range, sometimes extreme; sometimes a wrong dtype."""
    values = [rng.choice([rng.randrange(-2, 12), rng.randrange(-2, 12), 2**31 - 1, -(2**31)])
              for _ in range(int(np.prod(shape)))]
    if rng.random() < 0.1:
        dtype = rng.choice([np.float32, np.int16, np.uint32, np.int64])
    return np.array(values, dtype=np.int64).reshape(shape).astype(dtype)


def ops_call(rng):
    """One random call of a peer op with good shapes and random indices; returns
    (name, thunk, caches written in place)."""
    blocks, seqs, tokens = rng.randrange(1, 6), rng.randrange(0, 3), rng.randrange(0, 5)
    key_cache = np.zeros((blocks, PAGE, HKV, D), np.float32)
    value_cache = np.zeros((blocks, PAGE, HKV, D), np.float32)
    kind = rng.randrange(5)
    if kind == 0:
        return "reshape_and_cache", lambda: ops.reshape_and_cache(
            random_array(rng, (tokens, HKV, D)), random_array(rng, (tokens, HKV, D)), key_cache,
            value_cache, index_array(rng, (tokens,), np.int64)), (key_cache, value_cache)
    if kind == 1:
        return "paged_attention_decode", lambda: ops.paged_attention_decode(
            random_array(rng, (seqs, HQ, D)), key_cache, value_cache, index_array(rng, (seqs, 2)),
            index_array(rng, (seqs,)), num_kv_heads=int_or_bad(rng, HKV), scale=0.5), ()
    if kind == 2:
        return "copy_blocks", lambda: ops.copy_blocks(
            [key_cache], [value_cache], index_array(rng, (rng.randrange(0, 3), 2), np.int64)), (
                key_cache, value_cache)
    if kind == 3:
        dst = np.zeros((rng.randrange(1, 4), PAGE, HKV, D), np.float32)
        return "swap_blocks", lambda: ops.swap_blocks(
            key_cache, dst, index_array(rng, (rng.randrange(0, 3), 2), np.int64)), (dst,)
    q = random_array(rng, (tokens, HQ * D))
    k, v = random_array(rng, (tokens, HKV * D)), random_array(rng, (tokens, HKV * D))
    kc, vc = key_cache.reshape(blocks, PAGE, HKV * D), value_cache.reshape(blocks, PAGE, HKV * D)
    return "ort_paged_attention", lambda: ops.ort_paged_attention(
        q, k, v, kc, vc, index_array(rng, (seqs + 1,)), index_array(rng, (seqs,)),
        index_array(rng, (seqs, 2)), num_heads=HQ, kv_num_heads=HKV,
        local_window_size=int_or_bad(rng, -1)), (kc, vc)


@pytest.mark.parametrize("seed", [11, 12])
def test_random_ops_calls_raise_typed_errors_and_keep_caches(seed):
    rng = random.Random(seed)
    failures = 0
    for _ in range(CALLS):
        name, call, written = ops_call(rng)
        before = [c.copy() for c in written]
        try:
            call()
        except TYPED as error:
            failures += 1
            assert not isinstance(error, pagedattn.InternalError), f"{name}: {error}"
            for b, c in zip(before, written):
                np.testing.assert_array_equal(b, c, err_msg=f"{name} failed ({error}) but wrote")
    assert 0 < failures < CALLS
