"""pagedattn.LLM shared by threads, and generate calls that raise.

Several threads may call generate on one LLM: whichever thread steps the
engine hands every output to the call that owns its request, so each call
returns exactly what it would return alone (deterministic=True makes a
request's tokens independent of its batch). A generate that raises (a bad
request, an interrupt mid-loop, a failed step) leaves no request behind, and
the next generate works."""
import _thread
import os
import signal
import threading
import time

import pytest

import pagedattn
from pagedattn import SamplingParams

MIB = 1 << 20
THREADS = 8
JOIN_TIMEOUT_S = 120  # generous: a deadlock never ends, a slow run does


def make_llm():
    # deterministic (LLM's default): the batch never changes a request's tokens
    return pagedattn.LLM("tiny", kv_memory_bytes=16 * MIB, max_num_seqs=16, max_num_batched_tokens=64)


def prompts_of(t):
    """Thread t's own prompts (distinct lengths and tokens per thread)."""
    return [[(t * 131 + i * 17 + j * 7) % 1000 + 1 for j in range(3 + (t + i) % 9)] for i in range(3)]


def params_of(t):
    """Greedy and ignore_eos (fixed lengths that differ by thread), and one
    seeded sampled request with n=2 (samples routed by index)."""
    greedy = SamplingParams(max_tokens=4 + t % 5, ignore_eos=True)
    sampled = SamplingParams(max_tokens=3 + t % 3, temperature=0.8, top_p=0.9, seed=100 + t, n=2,
                             ignore_eos=True)
    return [greedy, sampled, greedy]


def summary(results):
    return [(r.prompt_token_ids, [(o.index, o.token_ids, o.finish_reason) for o in r.outputs])
            for r in results]


def expected_alone():
    llm = make_llm()
    return {t: summary(llm.generate(prompts_of(t), params_of(t))) for t in range(THREADS)}


def assert_clean(llm):
    assert not llm.engine.has_unfinished()
    assert llm.engine.stats().pages_in_use == 0


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt in the main thread, as in a terminal,
    also where pytest started with SIGINT ignored (a shell starts a
    background job so, and Python then installs no handler of its own)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def run_threads(target, n=THREADS):
    """Runs target(t) on n threads started together; {t: result or exception}."""
    results, barrier = {}, threading.Barrier(n)

    def body(t):
        barrier.wait()
        try:
            results[t] = target(t)
        except BaseException as e:  # noqa: BLE001 - checked by the test
            results[t] = e

    threads = [threading.Thread(target=body, args=(t,)) for t in range(n)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(JOIN_TIMEOUT_S)
    assert not any(thread.is_alive() for thread in threads), "generate threads deadlocked"
    return results


def test_threads_calling_generate_each_get_their_own_outputs():
    expected = expected_alone()
    llm = make_llm()

    def generate_twice(t):
        return [summary(llm.generate(prompts_of(t), params_of(t))) for _ in range(2)]

    results = run_threads(generate_twice)
    for t in range(THREADS):
        assert not isinstance(results[t], BaseException), f"thread {t}: {results[t]!r}"
        assert results[t] == [expected[t], expected[t]], f"thread {t}"
    assert_clean(llm)


def test_a_bad_request_leaves_nothing_behind():
    llm = make_llm()
    expected = summary(llm.generate(prompts_of(0), params_of(0)))
    # The third prompt is refused after the first two were queued.
    for bad in ([[1, 2, 3], [4, 5, 6], []], [[1, 2, 3], [4, 5, 6], [10 ** 6]]):
        with pytest.raises(ValueError):
            llm.generate(bad, SamplingParams(max_tokens=3))
        assert_clean(llm)
    # SamplingParams checks its own fields when made; what depends on the
    # model (a token id against the vocabulary) only the engine can refuse.
    with pytest.raises(ValueError, match="stop_token_ids"):
        llm.generate([[1, 2, 3], [4, 5, 6]], [SamplingParams(), SamplingParams(stop_token_ids=[10 ** 6])])
    assert_clean(llm)
    assert summary(llm.generate(prompts_of(0), params_of(0))) == expected


class Interrupt(Exception):
    pass


def interrupt_step(llm, at_call, exc_type):
    """Makes the at_call-th step raise exc_type after the engine stepped (its
    outputs are lost, as when Ctrl-C lands between a step and its delivery)."""
    real_step, calls = llm.engine.step, [0]

    def step():
        outputs = real_step()
        calls[0] += 1
        if calls[0] == at_call:
            raise exc_type("interrupted mid-generation")
        return outputs

    llm.engine.step = step


@pytest.mark.parametrize("at_call", [1, 3])
def test_an_interrupt_mid_generation_leaves_nothing_behind(at_call):
    llm = make_llm()
    # The first step finishes the max_tokens=1 request: interrupting it loses
    # that request's only output while the other request goes on.
    params = params_of(1) + [SamplingParams(max_tokens=1)]
    prompts = prompts_of(1) + [[7, 8, 9]]
    expected = summary(llm.generate(prompts, params))
    interrupt_step(llm, at_call, KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts, params)
    assert_clean(llm)
    assert summary(llm.generate(prompts, params)) == expected
    assert_clean(llm)


def test_a_real_keyboard_interrupt_mid_generation_leaves_nothing_behind(ctrl_c_raises):
    """SIGINT as Ctrl-C sends it, landing in the main thread during a step."""
    llm = make_llm()
    long = SamplingParams(max_tokens=40, ignore_eos=True)
    expected = summary(llm.generate(prompts_of(2), long))
    seen = [0]

    def interrupt_after_a_few(output):
        seen[0] += 1
        if seen[0] == 5:
            _thread.interrupt_main()

    llm.engine.set_stream_callback(interrupt_after_a_few)
    with pytest.raises(KeyboardInterrupt):
        llm.generate(prompts_of(2), long)
    llm.engine.set_stream_callback(None)
    assert_clean(llm)
    assert summary(llm.generate(prompts_of(2), long)) == expected
    assert_clean(llm)


def test_ctrl_c_while_another_thread_steps_leaves_the_other_call_exact(ctrl_c_raises):
    """SIGINT reaches the main thread while its generate waits for a step of
    another thread's: only the main thread's call ends (its requests
    aborted); the other call loses nothing."""
    llm = make_llm()
    longer = SamplingParams(max_tokens=80, ignore_eos=True)
    expected = summary(llm.generate(prompts_of(4), longer))
    main = threading.main_thread()
    worker_stepping, main_encoding, held_step, sent, main_generating = (threading.Event() for _ in range(5))
    real_step, real_encode = llm.engine.step, llm.engine.encode

    def step():
        if threading.current_thread() is main or sent.is_set():
            return real_step()
        worker_stepping.set()
        if not main_encoding.is_set():
            return real_step()
        # The worker holds the stepping role while the main thread queues its
        # requests and waits for this step; then Ctrl-C.
        held_step.set()
        outputs = real_step()
        time.sleep(0.2)
        sent.set()
        if main_generating.is_set():  # (a broken generate may have returned: no stray Ctrl-C)
            os.kill(os.getpid(), signal.SIGINT)
        return outputs

    def encode(prompt):
        if threading.current_thread() is main:
            main_encoding.set()
            assert held_step.wait(JOIN_TIMEOUT_S)
        return real_encode(prompt)

    llm.engine.step, llm.engine.encode = step, encode
    other = {}

    def work():
        try:
            other["r"] = summary(llm.generate(prompts_of(4), longer))
        except BaseException as e:  # noqa: BLE001 - checked by the test
            other["r"] = e

    worker = threading.Thread(target=work)
    worker.start()
    assert worker_stepping.wait(JOIN_TIMEOUT_S)
    main_generating.set()
    try:
        with pytest.raises(KeyboardInterrupt):
            llm.generate(prompts_of(5), SamplingParams(max_tokens=40, ignore_eos=True))
    finally:
        main_generating.clear()
    worker.join(JOIN_TIMEOUT_S)
    assert sent.is_set() and not worker.is_alive()
    assert other["r"] == expected
    assert_clean(llm)
    llm.engine.step, llm.engine.encode = real_step, real_encode
    assert summary(llm.generate(prompts_of(4), longer)) == expected


def test_a_failed_step_in_one_thread_fails_or_finishes_the_others():
    """A step whose outputs were lost fails every call still waiting (never a
    silently truncated result); each call either raises or returns exactly
    its own outputs, and the LLM works afterwards."""
    expected = expected_alone()
    llm = make_llm()
    interrupt_step(llm, 4, Interrupt)
    results = run_threads(lambda t: summary(llm.generate(prompts_of(t), params_of(t))))
    raised = [t for t in range(THREADS) if isinstance(results[t], BaseException)]
    assert any(isinstance(results[t], Interrupt) for t in raised)
    for t in range(THREADS):
        if t in raised:
            assert isinstance(results[t], (Interrupt, RuntimeError)), f"thread {t}: {results[t]!r}"
        else:
            assert results[t] == expected[t], f"thread {t}"
    assert_clean(llm)
    results = run_threads(lambda t: summary(llm.generate(prompts_of(t), params_of(t))))
    assert results == expected
    assert_clean(llm)


def test_a_bad_request_in_one_thread_does_not_disturb_the_others():
    expected = expected_alone()
    llm = make_llm()

    def generate(t):
        if t == 3:
            return llm.generate(prompts_of(t) + [[]], SamplingParams(max_tokens=5))
        return summary(llm.generate(prompts_of(t), params_of(t)))

    results = run_threads(generate)
    assert isinstance(results[3], ValueError), repr(results[3])
    for t in range(THREADS):
        if t != 3:
            assert results[t] == expected[t], f"thread {t}: {results[t]!r}"
    assert_clean(llm)
