"""Prefix caching and the host tier through KVCache (docs/prefix_caching.md)."""
import numpy as np
import pytest

import pagedattn


def make_cache(**kw):
    return pagedattn.KVCache(num_layers=2, num_qo_heads=4, num_kv_heads=2, head_dim=8,
                             page_size=4, num_pages=8, dtype="float32",
                             enable_prefix_caching=True, **kw)


def prefill(cache, seq_id, tokens, salt=0):
    """Adds a sequence, writes K/V derived from its token ids, tells them."""
    held = cache.add_sequence_with_prefix(seq_id, tokens, salt)
    n = len(tokens) - held
    cache.begin_forward([seq_id], [n])
    k = np.stack([np.full((n, 2, 8), t, np.float32) for t in range(2)])
    for i, t in enumerate(tokens[held:]):
        k[:, i] += t
    cache.set_kv(seq_id, held, len(tokens), k, k[..., :8].copy())
    cache.end_forward()
    cache.set_sequence_tokens(seq_id, tokens)
    return held


def test_a_finished_prompt_is_shared_by_the_next_one():
    cache = make_cache()
    prompt = list(range(10, 20))
    assert prefill(cache, 1, prompt) == 0
    first_pages = cache.sequence_pages(1)
    k1, _ = cache.get_kv(1, 0, 8)
    cache.remove_sequence(1)
    assert cache.num_cached_pages == 2
    assert cache.num_free_pages == 8
    match = cache.match_prefix(prompt + [5])
    assert match == {"num_tokens": 8, "device_pages": 2, "host_pages": 0, "pages_taken": 2}
    assert prefill(cache, 2, prompt + [5]) == 8
    assert cache.sequence_pages(2)[:2] == first_pages[:2]
    k2, _ = cache.get_kv(2, 0, 8)
    np.testing.assert_array_equal(k1, k2)
    stats = cache.prefix_cache_stats()
    assert stats["queries"] == 2 and stats["hit_tokens"] == 8
    assert cache.match_prefix(prompt, cache_salt=3)["num_tokens"] == 0
    cache.check_invariants()
    assert cache.config["enable_prefix_caching"] is True


def test_swap_round_trip_and_errors():
    cache = make_cache(host_num_pages=4)
    prefill(cache, 1, list(range(7)))
    k, v = cache.get_kv(1, 0, 7)
    cache.swap_out([1])
    assert cache.is_swapped(1)
    assert cache.num_free_host_pages == 2
    assert cache.swap_in_pages_needed([1]) == 2
    with pytest.raises(pagedattn.InvalidStateError, match="swapped"):
        cache.begin_forward([1], [1])
    cache.swap_in([1])
    k2, v2 = cache.get_kv(1, 0, 7)
    np.testing.assert_array_equal(k, k2)
    np.testing.assert_array_equal(v, v2)
    with pytest.raises(pagedattn.InvalidArgumentError, match="token_ids\\[1\\]"):
        cache.set_sequence_tokens(1, [0, 2**40])
    with pytest.raises(pagedattn.InvalidArgumentError, match="differs"):
        cache.set_sequence_tokens(1, [9])
    assert cache.num_host_pages == 4
    cache.reset_prefix_cache()
    cache.check_invariants()
