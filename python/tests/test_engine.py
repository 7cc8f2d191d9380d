"""pagedattn.Engine / LLM: the C++ engine driven from Python.

The synthetic "tiny" preset checks the engine's contracts (determinism,
streaming, abort, callbacks, threads); SmolLM2 (PAGEDATTN_TEST_MODEL)
checks that Python generates exactly what the C++ `pagedattn generate` CLI
generates, token for token."""
import os
import pathlib
import subprocess
import threading

import numpy as np
import pytest

import pagedattn
from pagedattn import SamplingParams

REPO = pathlib.Path(__file__).resolve().parents[2]
MIB = 1 << 20


def tiny_engine(**options):
    options.setdefault("kv_memory_bytes", 16 * MIB)
    return pagedattn.Engine("tiny", **options)


def collect(outputs):
    """{request_id: {sample index: (tokens, finish_reason)}} of RequestOutputs."""
    result = {}
    for out in outputs:
        for s in out.samples:
            tokens, _ = result.setdefault(out.request_id, {}).get(s.index, ([], None))
            result[out.request_id][s.index] = (tokens + list(s.new_token_ids), s.finish_reason)
    return result


PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3]
SAMPLED = SamplingParams(max_tokens=8, temperature=0.9, top_p=0.9, seed=11, n=2)


def test_deterministic_results_do_not_depend_on_the_batch():
    alone = tiny_engine(deterministic=True)
    rid = alone.add_request(PROMPT, SAMPLED)
    expected = collect(alone)[rid]

    crowded = tiny_engine(deterministic=True, max_num_batched_tokens=16, max_num_seqs=16)
    for i in range(3):
        crowded.add_request([(i * 37 + j) % 1000 for j in range(1, 30)], SamplingParams(max_tokens=5))
    rid = crowded.add_request(PROMPT, SAMPLED)
    got = collect(crowded)[rid]
    assert got == expected
    assert [reason for _, reason in got.values()] == ["length", "length"]
    assert all(len(tokens) == 8 for tokens, _ in got.values())


def test_reduced_precision_products_serve_a_request_to_the_end():
    engine = tiny_engine(bf16_products=True)
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
    tokens, reason = collect(engine)[rid][0]
    assert len(tokens) == 6 and reason == "length"
    engine = tiny_engine(kv_dtype="int8", int8_products=True)
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
    tokens, reason = collect(engine)[rid][0]
    assert len(tokens) == 6 and reason == "length"
    # fp8 KV: bf16 / f16 products where they measure faster (the default)
    # and f32 products throughout (exact_products).
    for exact in (False, True):
        engine = tiny_engine(kv_dtype="float8_e4m3fn", exact_products=exact)
        rid = engine.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
        tokens, reason = collect(engine)[rid][0]
        assert len(tokens) == 6 and reason == "length"


def test_pinned_threads_serve_a_request_to_the_end():
    # Stepped from a thread of its own: binding reaches the OpenMP threads of
    # the thread that steps, and the rest of the session keeps unbound ones.
    result = {}

    def serve():
        engine = tiny_engine(pin_threads=True)
        rid = engine.add_request(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True))
        result.update(collect(engine))
        result["rid"] = rid

    worker = threading.Thread(target=serve)
    worker.start()
    worker.join()
    tokens, reason = result[result["rid"]][0]
    assert len(tokens) == 6 and reason == "length"


def test_llm_generate_equals_streaming_the_engine():
    greedy = SamplingParams(max_tokens=6)
    engine = tiny_engine(deterministic=True)
    ids = [engine.add_request(p, greedy) for p in (PROMPT, PROMPT[:3])]
    streamed = collect(engine)
    llm = pagedattn.LLM("tiny", kv_memory_bytes=16 * MIB)
    results = llm.generate([PROMPT, PROMPT[:3]], greedy)
    assert [r.prompt_token_ids for r in results] == [PROMPT, PROMPT[:3]]
    for rid, result in zip(ids, results):
        (tokens, reason), = streamed[rid].values()
        assert result.outputs[0].token_ids == tokens and result.outputs[0].finish_reason == reason
        assert result.outputs[0].text is None  # a preset has no tokenizer
    for single_prompt in (PROMPT, np.array(PROMPT, np.int64)):
        single = llm.generate(single_prompt, greedy)
        assert single[0].outputs[0].token_ids == results[0].outputs[0].token_ids


def test_abort_and_stats():
    engine = tiny_engine()
    keep = engine.add_request(PROMPT, SamplingParams(max_tokens=4))
    stop = engine.add_request(PROMPT, SamplingParams(max_tokens=50))
    engine.step()
    engine.abort(stop)
    result = collect(engine)
    assert result[stop][0][1] == "abort"
    assert result[keep][0][1] == "length"
    stats = engine.stats()
    assert stats.steps >= 4 and stats.num_running_seqs == 0 and stats.pages_in_use == 0
    assert not engine.has_unfinished()
    with pytest.raises(ValueError):
        engine.abort(stop)


def test_stream_callback_sees_every_output_and_its_error_is_raised():
    engine = tiny_engine()
    seen = []
    engine.set_stream_callback(seen.append)
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=3))
    returned = collect(engine)
    assert collect(seen) == returned and rid in returned

    def fail(output):
        raise KeyError("from the callback")

    engine.set_stream_callback(fail)
    engine.add_request(PROMPT, SamplingParams(max_tokens=2))
    with pytest.raises(KeyError, match="from the callback"):
        engine.step()
    engine.set_stream_callback(None)
    collect(engine)  # the engine goes on


def test_requests_added_from_other_threads_while_one_thread_steps():
    engine = tiny_engine()
    ids, lock = [], threading.Lock()

    def add(offset):
        for i in range(5):
            rid = engine.add_request([offset + i + 1] * 4, SamplingParams(max_tokens=3, ignore_eos=True))
            with lock:
                ids.append(rid)

    threads = [threading.Thread(target=add, args=(100 * t,)) for t in range(3)]
    for t in threads:
        t.start()
    outputs = []
    while any(t.is_alive() for t in threads) or engine.has_unfinished():
        outputs += engine.step()
    for t in threads:
        t.join()
    outputs += list(engine)
    result = collect(outputs)
    assert sorted(result) == sorted(ids) and len(ids) == 15
    assert all(len(tokens) == 3 for r in result.values() for tokens, _ in r.values())


def test_bad_requests_are_refused():
    engine = tiny_engine()
    with pytest.raises(ValueError):
        engine.add_request([], SamplingParams())
    with pytest.raises(ValueError):
        engine.add_request([10 ** 6], SamplingParams())
    with pytest.raises(ValueError):
        engine.add_request(PROMPT, SamplingParams(max_tokens=10 ** 6))  # past the context
    with pytest.raises(ValueError, match="tokenizer"):
        engine.add_request("text needs a tokenizer", SamplingParams())
    with pytest.raises(ValueError):
        pagedattn.Engine("no-such-preset")
    assert not engine.has_unfinished()


# --- SmolLM2 against the C++ CLI -------------------------------------------------

def model_path():
    path = os.environ.get("PAGEDATTN_TEST_MODEL")
    if not path:
        pytest.skip("PAGEDATTN_TEST_MODEL is not set (scripts/get_test_model.sh prints the path)")
    return path


def cli_path():
    """The `pagedattn` CLI: $PAGEDATTN_CLI, else the Release build's."""
    path = os.environ.get("PAGEDATTN_CLI") or str(REPO / "build" / "release" / "tools" / "pagedattn")
    if not os.access(path, os.X_OK):
        pytest.skip("the pagedattn CLI is not built (cmake --preset release; or set PAGEDATTN_CLI)")
    return path


@pytest.fixture(scope="module")
def smollm():
    # The CLI's engine configuration: 64 MiB of KV, the default (not deterministic) planning.
    return pagedattn.LLM(model_path(), kv_memory_bytes=64 * MIB, deterministic=False)


@pytest.mark.parametrize("chat", [False, True])
def test_llm_equals_the_cpp_cli_token_for_token(smollm, chat):
    prompt = "The capital of France is"
    args = [cli_path(), "generate", "--model", model_path(), "--prompt", prompt,
            "--max-tokens", "12", "--kv-memory-mib", "64"] + (["--chat"] if chat else [])
    run = subprocess.run(args, capture_output=True, text=True, check=True)
    if chat:
        result, = smollm.chat([{"role": "user", "content": prompt}], SamplingParams(max_tokens=12))
    else:
        result = smollm.generate(prompt, SamplingParams(max_tokens=12))[0]
    completion = result.outputs[0]
    # The CLI prints the text and a newline; stderr counts the new tokens.
    assert completion.text + "\n" == run.stdout
    assert f"{len(completion.token_ids)} new tokens" in run.stderr


def test_llm_keeps_the_cache_salt_when_it_adds_stop_tokens():
    # A GGUF model's LLM adds its end-of-turn stop tokens to the params; the
    # tenant's cache_salt must survive that (else tenants share prefixes).
    llm = pagedattn.LLM(model_path(), kv_memory_bytes=16 * MIB, enable_prefix_caching=True)
    prompt = "The quick brown fox jumps over the lazy dog. " * 2  # > one page of 16 tokens
    hits = []
    for salt in (1, 2, 1):
        llm.generate(prompt, SamplingParams(max_tokens=1, cache_salt=salt))
        hits.append(llm.engine.stats().prefix_hit_tokens)
    assert hits[0] == hits[1] == 0 and hits[2] >= 16


def test_prefix_caching_reuses_a_shared_prompt_per_salt_and_changes_no_output():
    system = [(7 * j + 3) % 1000 for j in range(64)]  # four full pages of 16
    prompts = [system + [900 + i, 901 + i] for i in range(3)]
    greedy = SamplingParams(max_tokens=5)

    def run(engine, salts):
        results = []
        for prompt, salt in zip(prompts, salts):  # one after another: pages get published
            rid = engine.add_request(prompt, SamplingParams(max_tokens=5, cache_salt=salt))
            results.append(collect(engine)[rid][0])
        return results

    plain = run(tiny_engine(deterministic=True), [0, 0, 0])
    cached = tiny_engine(deterministic=True, enable_prefix_caching=True, host_kv_memory_bytes=4 * MIB)
    assert run(cached, [0, 0, 0]) == plain
    stats = cached.stats()
    assert stats.prefix_query_tokens == sum(len(p) for p in prompts)
    assert stats.prefix_hit_tokens == 2 * 64  # the second and third prompt share the system prompt
    assert stats.prefix_hit_rate == pytest.approx(128 / stats.prefix_query_tokens)
    assert stats.cached_pages >= 4 and stats.num_host_pages > 0
    salted = tiny_engine(deterministic=True, enable_prefix_caching=True)
    assert run(salted, [1, 2, 3]) == plain  # different tenants never share
    assert salted.stats().prefix_hit_tokens == 0
    assert greedy.cache_salt == 0
