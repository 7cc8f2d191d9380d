"""KVCache shared by threads, and steps that cannot leak stale K/V.

The cache locks itself and every binding releases the GIL while it waits or
works: threads calling anything in any order get results or pagedattn
errors, never a crash, a deadlock or a corrupted cache."""

import random
import threading

import numpy as np
import pytest

import pagedattn

LAYERS, HQ, HKV, D, PAGE = 2, 4, 2, 8, 4
JOIN_TIMEOUT_S = 120  # generous: a deadlock never ends, a slow run does


def make_cache(num_pages=32):
    return pagedattn.KVCache(LAYERS, HQ, HKV, D, PAGE, num_pages, dtype="float32")


def hammer(cache, seed, step_tokens, errors):
    """Random calls; pagedattn errors (refusals) are expected, others are not."""
    rng = random.Random(seed)
    for _ in range(300):
        try:
            op = rng.randrange(9)
            if op == 0:
                cache.add_sequence(rng.randrange(6))
            elif op == 1:
                cache.remove_sequence(rng.randrange(6))
            elif op == 2:
                ids = rng.sample(range(6), 2)
                lens = [rng.randrange(4), rng.randrange(4)]
                cache.begin_forward(ids, lens)
                step_tokens[0] = sum(lens)
            elif op in (3, 4):
                t = step_tokens[0]  # maybe stale: the binding refuses a changed step
                q = np.full((t, HQ, D), 0.25, np.float32)
                kv = np.full((t, HKV, D), 0.5, np.float32)
                cache.attention(rng.randrange(LAYERS), q, kv, kv)
            elif op == 5:
                cache.end_forward()
            elif op == 6:
                cache.cancel_forward()
            elif op == 7:
                sid = rng.randrange(6)
                n = cache.sequence_length(sid)
                cache.get_kv(sid, 0, n)
            else:
                cache.check_invariants()
                repr(cache)
                _ = cache.num_free_pages, cache.total_sequence_length
        except pagedattn.InternalError as e:  # a broken invariant is a bug
            errors.append(e)
        except pagedattn.Error:
            pass
        except BaseException as e:  # noqa: BLE001 - reported by the test
            errors.append(e)


def test_threads_hammering_one_cache_neither_crash_nor_deadlock():
    cache = make_cache()
    step_tokens, errors = [0], []
    threads = [threading.Thread(target=hammer, args=(cache, s, step_tokens, errors), daemon=True)
               for s in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(JOIN_TIMEOUT_S)
    assert not any(t.is_alive() for t in threads), "a thread is stuck (deadlock?)"
    assert not errors, errors
    cache.check_invariants()
    if cache.num_free_pages != cache.num_pages:  # still fully usable
        try:
            cache.cancel_forward()
        except pagedattn.InvalidStateError:
            pass
    for sid in range(6):
        try:
            cache.remove_sequence(sid)
        except ValueError:
            pass
    assert cache.empty()


def test_attention_of_one_thread_runs_while_others_use_python():
    """The GIL is released inside attention: a pure-Python thread progresses."""
    cache = make_cache(num_pages=512)
    cache.add_sequence(0)
    tokens = 1024
    cache.begin_forward([0], [tokens])
    q = np.ones((tokens, HQ, D), np.float32)
    kv = np.ones((tokens, HKV, D), np.float32)
    done = threading.Event()
    counter = [0]

    def spin():
        while not done.is_set():
            counter[0] += 1

    spinner = threading.Thread(target=spin, daemon=True)
    spinner.start()
    for layer in range(LAYERS):
        cache.attention(layer, q, kv, kv)
    done.set()
    spinner.join(JOIN_TIMEOUT_S)
    assert not spinner.is_alive()
    cache.end_forward()
    assert counter[0] > 0


def test_end_forward_refuses_a_skipped_layer_and_never_shows_old_keys():
    cache = make_cache(num_pages=4)
    cache.add_sequence(1)
    cache.begin_forward([1], [4])
    old = np.full((4, HKV, D), 7.0, np.float32)
    for layer in range(LAYERS):
        cache.attention(layer, np.ones((4, HQ, D), np.float32), old, old)
    cache.end_forward()
    cache.remove_sequence(1)

    cache.add_sequence(2)  # takes the page sequence 1 left
    cache.begin_forward([2], [4])
    new = np.ones((4, HKV, D), np.float32)
    cache.attention(0, np.ones((4, HQ, D), np.float32), new, new)
    k, v = cache.get_kv(2, 0, 4)
    np.testing.assert_array_equal(k[0], 1.0)
    np.testing.assert_array_equal(k[1], 0.0)  # not yet written: zeros, never the 7s
    np.testing.assert_array_equal(v[1], 0.0)
    with pytest.raises(pagedattn.InvalidStateError, match="layer 1"):
        cache.end_forward()
    cache.cancel_forward()  # the model could not finish: drop the step
    assert cache.sequence_length(2) == 0 and cache.num_free_pages == 4
    with pytest.raises(pagedattn.InvalidStateError, match="no forward"):
        cache.cancel_forward()
    cache.check_invariants()


def test_set_kv_of_every_new_token_completes_a_step():
    cache = make_cache(num_pages=4)
    cache.add_sequence(1)
    cache.begin_forward([1], [3])
    k = np.arange(LAYERS * 3 * HKV * D, dtype=np.float32).reshape(LAYERS, 3, HKV, D)
    first, rest = np.ascontiguousarray(k[:, :2]), np.ascontiguousarray(k[:, 2:])
    cache.set_kv(1, 0, 2, first, first)
    with pytest.raises(pagedattn.InvalidStateError, match="layer 0"):
        cache.end_forward()
    cache.set_kv(1, 2, 3, rest, rest)
    cache.end_forward()
    np.testing.assert_array_equal(cache.get_kv(1, 0, 3)[0], k)


def replaced_step(cache):
    """Step A of sequence 1 is ended by "another thread" (here: cancelled) and
    replaced by step B of sequence 2 with the same token count. Returns A's
    and B's plans."""
    cache.add_sequence(1)
    cache.add_sequence(2)
    a = cache.begin_forward([1], [3])
    cache.cancel_forward(step=a)
    b = cache.begin_forward([2], [3])
    assert a.num_tokens == b.num_tokens and a.step_id != b.step_id
    return a, b


def test_calls_for_a_replaced_step_raise_and_write_nothing():
    cache = make_cache(num_pages=8)
    a, b = replaced_step(cache)
    digest = cache.state_digest()
    q = np.ones((3, HQ, D), np.float32)
    kv = np.full((3, HKV, D), 7.0, np.float32)
    names = f"step = {a.step_id} is not the open step \\(step_id {b.step_id}\\)"
    with pytest.raises(pagedattn.InvalidStateError, match=names):
        cache.attention(0, q, kv, kv, step=a)
    with pytest.raises(pagedattn.InvalidStateError, match=names):
        cache.attention_with_fused_qkv(0, np.concatenate([q, kv, kv], axis=1), step=a)
    with pytest.raises(pagedattn.InvalidStateError, match=names):
        cache.mark_layer_appended(0, step=a)
    with pytest.raises(pagedattn.InvalidStateError, match=names):
        cache.end_forward(step=a)
    with pytest.raises(pagedattn.InvalidStateError, match=names):
        cache.cancel_forward(step=a)
    assert cache.state_digest() == digest  # no K/V of sequence 2 was written
    with pytest.raises(pagedattn.InvalidStateError, match="layer 0"):
        cache.end_forward(step=b)  # and no layer counts as appended
    cache.attention(0, q, kv * 0 + 1.0, kv * 0 + 1.0, step=b)  # B's owner goes on
    cache.attention(1, q, kv * 0 + 1.0, kv * 0 + 1.0)
    cache.end_forward(step=b)
    np.testing.assert_array_equal(cache.get_kv(2, 0, 3)[0], 1.0)


def test_the_thread_that_began_a_replaced_step_is_refused_by_default():
    """Without step=, a call acts for the step its thread began: the
    documented promise for plain `cache.attention(layer, q, k, v)`."""
    cache = make_cache(num_pages=8)
    cache.add_sequence(1)
    cache.add_sequence(2)
    q = np.ones((3, HQ, D), np.float32)
    kv = np.full((3, HKV, D), 7.0, np.float32)
    began, replaced, outcome = threading.Event(), threading.Event(), {}

    def first():  # begins A, then runs a layer after B replaced it
        outcome["a"] = cache.begin_forward([1], [3])
        began.set()
        replaced.wait(JOIN_TIMEOUT_S)
        try:
            cache.attention(0, q, kv, kv)
            outcome["error"] = "attention for the replaced step succeeded"
        except pagedattn.InvalidStateError as e:
            outcome["error"] = str(e)

    thread = threading.Thread(target=first, daemon=True)
    thread.start()
    assert began.wait(JOIN_TIMEOUT_S)
    cache.cancel_forward()  # this thread began nothing: it acts on the open step
    b = cache.begin_forward([2], [3])
    digest = cache.state_digest()
    replaced.set()
    thread.join(JOIN_TIMEOUT_S)
    assert not thread.is_alive()
    a = outcome["a"]
    assert a.num_tokens == b.num_tokens
    assert cache.state_digest() == digest, "the first thread wrote into step B"
    assert f"step = {a.step_id} is not the open step (step_id {b.step_id})" in outcome["error"]
    with pytest.raises(pagedattn.InvalidStateError, match="layer 0"):
        cache.end_forward()
    cache.cancel_forward()
    cache.check_invariants()
