"""What a vLLM user expects of pagedattn's Python API (issue 42): the
SamplingParams fields with vLLM's meaning, picklable and comparable; LLM's
stop strings, logprobs in vLLM's {token id: Logprob} shape, dict prompts,
chat over a list of conversations, use_tqdm, tensor_parallel_size; special
tokens parsed in raw text prompts and never in chat messages; the finish
reason "abort".

References are independent of the code under test: Python string search for
stop strings (vLLM's documented truncation), float64 NumPy log-softmax of
the teacher-forced logits for log-probabilities, and the tokenizer's own
parse_special switch for special tokens. The synthetic "tiny" preset checks
what needs no text; SmolLM2 (PAGEDATTN_TEST_MODEL) the rest."""
import copy
import os
import pickle
import random
import re
import sys
import types

import numpy as np
import pytest

import pagedattn
import pagedattn._core as core
from pagedattn import SamplingParams

MIB = 1 << 20
PROMPT = [5, 17, 300, 42, 7, 99, 1000, 3]

# A value other than the default for every field (floats exact in float32).
NON_DEFAULT = {
    "max_tokens": 7,
    "temperature": 0.5,
    "top_k": 3,
    "top_p": 0.75,
    "n": 2,
    "seed": 123,
    "stop_token_ids": [4, 9],
    "ignore_eos": True,
    "cache_salt": 77,
    "repetition_penalty": 1.25,
    "presence_penalty": 0.5,
    "frequency_penalty": -0.25,
    "min_p": 0.0625,
    "min_tokens": 2,
    "logit_bias": {5: 2.5, 11: -100.0},
    "logprobs": 3,
    "prompt_logprobs": 0,
    "stop": ["\n\n", "END"],
    "include_stop_str_in_output": True,
}
# vLLM's defaults where they are ours, and ours where they differ (temperature).
DEFAULTS = {
    "max_tokens": 16, "temperature": 0.0, "top_k": 0, "top_p": 1.0, "n": 1, "seed": None,
    "stop_token_ids": [], "ignore_eos": False, "cache_salt": 0, "repetition_penalty": 1.0,
    "presence_penalty": 0.0, "frequency_penalty": 0.0, "min_p": 0.0, "min_tokens": 0,
    "logit_bias": {}, "logprobs": None, "prompt_logprobs": None, "stop": [],
    "include_stop_str_in_output": False,
}


def fields():
    return {name for name, value in vars(SamplingParams).items() if isinstance(value, property)}


def tiny_llm(**options):
    options.setdefault("kv_memory_bytes", 16 * MIB)
    return pagedattn.LLM("tiny", **options)


def model_path():
    path = os.environ.get("PAGEDATTN_TEST_MODEL")
    if not path:
        pytest.skip("PAGEDATTN_TEST_MODEL is not set (scripts/get_test_model.sh prints the path)")
    return path


@pytest.fixture(scope="module")
def smollm():
    return pagedattn.LLM(model_path(), kv_memory_bytes=32 * MIB)


# --- SamplingParams ---------------------------------------------------------------

def test_the_tests_cover_every_field():
    assert fields() == set(NON_DEFAULT) == set(DEFAULTS)


def test_defaults():
    params = SamplingParams()
    for name, value in DEFAULTS.items():
        assert getattr(params, name) == value, name
    assert repr(params) == "SamplingParams()"


@pytest.mark.parametrize("name", sorted(NON_DEFAULT))
def test_each_field_survives_pickle_copy_and_deepcopy(name):
    value = NON_DEFAULT[name]
    params = SamplingParams(**{name: value})
    assert getattr(params, name) == value
    assert params != SamplingParams() and not params == SamplingParams()
    for clone in (pickle.loads(pickle.dumps(params)), copy.copy(params), copy.deepcopy(params)):
        assert type(clone) is SamplingParams
        assert getattr(clone, name) == value
        assert clone == params
        for other in DEFAULTS.keys() - {name}:
            assert getattr(clone, other) == DEFAULTS[other], other
    assert repr(params) == f"SamplingParams({name}={value!r})"


def test_all_fields_together_and_equality_field_by_field():
    params = SamplingParams(**NON_DEFAULT)
    clone = pickle.loads(pickle.dumps(params, protocol=pickle.HIGHEST_PROTOCOL))
    for name, value in NON_DEFAULT.items():
        assert getattr(clone, name) == value, name
    assert clone == params
    # A copy is independent; changing any one field makes it unequal.
    for name, value in DEFAULTS.items():
        changed = copy.copy(params)
        if name in ("max_tokens", "min_tokens"):
            value = {"max_tokens": 9, "min_tokens": 1}[name]  # defaults would break max >= min
        setattr(changed, name, value)
        assert changed != params, name
        assert getattr(params, name) == NON_DEFAULT[name]
    assert params != "SamplingParams" and params != None  # noqa: E711
    for name in NON_DEFAULT:
        assert f"{name}=" in repr(params)


def test_vllm_spellings():
    assert SamplingParams(top_k=-1).top_k == 0  # vLLM's "all tokens"
    assert SamplingParams(stop="###").stop == ["###"]
    assert SamplingParams(stop=None, stop_token_ids=None, logit_bias=None) == SamplingParams()
    # The order a dict is written in does not matter.
    assert SamplingParams(logit_bias={3: 1.0, 1: -1.0}) == SamplingParams(logit_bias={1: -1.0, 3: 1.0})
    params = SamplingParams()
    params.stop = "x"
    params.logit_bias = {7: 0.5}
    assert params.stop == ["x"] and params.logit_bias == {7: 0.5}
    with pytest.raises(TypeError):
        SamplingParams(stop=[1])


# vLLM's bounds (SamplingParams._verify_args) for each field.
BAD = {
    "max_tokens": 0,
    "temperature": -0.5,
    "top_k": -2,
    "top_p": 0.0,
    "n": 0,
    "repetition_penalty": 0.0,
    "presence_penalty": 2.5,
    "frequency_penalty": -2.5,
    "min_p": 1.5,
    "min_tokens": 17,  # > max_tokens (16)
    "logit_bias": {3: 101.0},
    "logprobs": 21,
    "prompt_logprobs": -1,
    "stop": ["ok", ""],
}


@pytest.mark.parametrize("name", sorted(BAD))
def test_a_bad_value_is_refused_naming_the_field(name):
    with pytest.raises(pagedattn.InvalidArgumentError, match=rf"\b{name}\b"):
        SamplingParams(**{name: BAD[name]})
    params = SamplingParams()
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        setattr(params, name, BAD[name])
    assert getattr(params, name) == DEFAULTS[name]  # unchanged
    state = SamplingParams().__getstate__()  # what pickle restores, as unpickling does
    state[name] = BAD[name]
    with pytest.raises(ValueError, match=rf"\b{name}\b"):
        SamplingParams.__new__(SamplingParams).__setstate__(state)


# --- StopMatcher ----------------------------------------------------------------

def test_stop_matcher_finds_stops_split_across_chunks_like_str_find():
    rng = random.Random(7)
    alphabet = "ab\n#"
    for _ in range(300):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randint(0, 30)))
        stops = ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 4)))
                 for _ in range(rng.randint(1, 3))]
        cuts = sorted(set(rng.sample(range(1, len(text) + 1), min(len(text), 4))) | {len(text)})
        # Reference (vLLM's rule, checked as each chunk arrives): the first
        # chunk after which the text so far contains a stop string ends the
        # text where the earliest such stop starts.
        expected = None
        for cut in cuts:
            found = [text[:cut].find(stop) for stop in stops if stop in text[:cut]]
            if found:
                expected = min(found)
                break
        matcher = pagedattn.StopMatcher(stops)
        released, stopped = b"", None
        for start, end in zip([0] + cuts, cuts):
            result = matcher.feed(text[start:end])
            released += result.text
            if result.stopped:
                stopped = result.matched.decode()
                break
        if expected is not None:
            assert stopped is not None and released == text[:expected].encode()
            assert text.startswith(stopped, expected) and stopped in stops
        else:
            assert stopped is None and released + matcher.finish() == text.encode()


# --- LLM on the tiny preset ----------------------------------------------------------

def test_dict_prompts_mix_with_token_lists():
    llm = tiny_llm()
    params = SamplingParams(max_tokens=4)
    plain = llm.generate([PROMPT, PROMPT[:3], PROMPT[2:]], params, use_tqdm=False)
    mixed = llm.generate([{"prompt_token_ids": PROMPT}, PROMPT[:3], {"prompt_token_ids": PROMPT[2:]}],
                         params, use_tqdm=False)
    assert [r.prompt_token_ids for r in mixed] == [PROMPT, PROMPT[:3], PROMPT[2:]]
    assert [r.outputs[0].token_ids for r in mixed] == [r.outputs[0].token_ids for r in plain]
    single = llm.generate({"prompt_token_ids": PROMPT}, params)
    assert len(single) == 1 and single[0].outputs[0].token_ids == plain[0].outputs[0].token_ids
    for bad in ({"prompt_token_ids": PROMPT, "multi_modal_data": {}}, {},
                {"prompt": "x", "prompt_token_ids": PROMPT}):
        with pytest.raises(ValueError, match=r"prompts\[1\]"):
            llm.generate([PROMPT, bad], params)
    with pytest.raises(ValueError, match="tokenizer"):
        llm.generate({"prompt": "text needs a tokenizer"}, params)
    assert not llm.engine.has_unfinished()


def test_logprobs_of_decode_equal_prompt_logprobs_of_the_same_tokens():
    # Two paths through the model: the sampled tokens' logprobs come from
    # decode steps, prompt_logprobs of the prompt + those tokens from one
    # prefill. Both are the raw log-softmax, so they agree.
    llm = tiny_llm()
    generated = llm.generate(PROMPT, SamplingParams(max_tokens=6, ignore_eos=True, logprobs=4))[0]
    sample = generated.outputs[0]
    assert generated.prompt_logprobs is None
    assert len(sample.logprobs) == len(sample.token_ids) == 6
    full = PROMPT + sample.token_ids
    again = llm.generate(full, SamplingParams(max_tokens=1, prompt_logprobs=4))[0]
    assert again.outputs[0].logprobs is None and again.outputs[0].cumulative_logprob is None
    prompt_logprobs = again.prompt_logprobs
    assert len(prompt_logprobs) == len(full) and prompt_logprobs[0] is None
    for i, (token, position) in enumerate(zip(sample.token_ids, sample.logprobs)):
        from_prefill = prompt_logprobs[len(PROMPT) + i]
        assert set(from_prefill) == set(position)
        for t in position:
            assert position[t].logprob == pytest.approx(from_prefill[t].logprob, abs=2e-3)
        # greedy: the chosen token is the most likely, rank 1, listed first
        assert position[token].rank == 1
        best = max(position.values(), key=lambda lp: lp.logprob)
        assert best.logprob == position[token].logprob
        assert [lp.rank for t, lp in position.items() if t != token] == list(range(2, 1 + len(position)))
        assert all(lp.decoded_token is None for lp in position.values())  # no tokenizer
        # probabilities of the listed tokens sum to at most 1
        assert sum(np.exp(lp.logprob) for lp in position.values()) <= 1.0 + 1e-4
    assert sample.cumulative_logprob == pytest.approx(
        sum(p[t].logprob for t, p in zip(sample.token_ids, sample.logprobs)), abs=1e-4)
    for i in range(1, len(full)):
        assert full[i] in prompt_logprobs[i]  # the prompt's own token is always listed


def test_use_tqdm_shows_a_bar_over_requests_when_tqdm_is_there(monkeypatch):
    bars = []

    class FakeBar:
        def __init__(self, total=None, **kwargs):
            self.total, self.n, self.closed = total, 0, False
            bars.append(self)

        def update(self, k=1):
            self.n += k

        def close(self):
            self.closed = True

    fake = types.ModuleType("tqdm")
    fake.tqdm = FakeBar
    monkeypatch.setitem(sys.modules, "tqdm", fake)
    llm = tiny_llm()
    params = SamplingParams(max_tokens=3)
    prompts = [PROMPT, PROMPT[:4], PROMPT[1:]]
    expected = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert len(bars) == 1 and bars[0].total == 3 and bars[0].n == 3 and bars[0].closed
    llm.generate(prompts, params, use_tqdm=False)
    llm.generate(PROMPT, params)  # one prompt: no bar
    assert len(bars) == 1
    custom = []
    llm.generate(prompts, params, use_tqdm=lambda **kw: custom.append(FakeBar(**kw)) or custom[-1])
    assert custom[0].n == 3 and len(bars) == 2
    monkeypatch.setitem(sys.modules, "tqdm", None)  # not installed: import fails
    got = [r.outputs[0].token_ids for r in llm.generate(prompts, params)]
    assert got == expected and len(bars) == 2


def test_tensor_parallel_size_above_one_names_the_mpi_command():
    assert tiny_llm(tensor_parallel_size=1).generate(PROMPT, SamplingParams(max_tokens=1))
    with pytest.raises(pagedattn.UnsupportedError) as error:
        tiny_llm(tensor_parallel_size=2)
    assert isinstance(error.value, NotImplementedError)
    message = str(error.value)
    assert "tensor_parallel_size = 2" in message and "mpirun -np 2 pagedattn" in message
    assert "--tensor-parallel 2" in message and "docs/tensor_parallel.md" in message
    with pytest.raises(ValueError, match="tensor_parallel_size"):
        tiny_llm(tensor_parallel_size=0)


def test_finish_reason_abort_after_engine_abort():
    engine = pagedattn.Engine("tiny", kv_memory_bytes=16 * MIB)
    rid = engine.add_request(PROMPT, SamplingParams(max_tokens=50, n=2, ignore_eos=True))
    engine.step()
    engine.abort(rid)
    reasons = {s.index: s.finish_reason for out in engine for s in out.samples if s.finish_reason}
    assert reasons == {0: "abort", 1: "abort"}


def test_stop_strings_need_text():
    with pytest.raises(ValueError, match="stop"):
        tiny_llm().generate(PROMPT, SamplingParams(stop=["x"]))


# --- LLM on SmolLM2 ----------------------------------------------------------------

def test_llm_keeps_every_field_when_it_adds_stop_tokens(smollm, monkeypatch):
    values = dict(NON_DEFAULT, stop_token_ids=[], ignore_eos=False, max_tokens=4,
                  logit_bias={100: 1.5, 200: -3.0})
    given = SamplingParams(**values)
    sent = []
    add_request = smollm.engine.add_request
    monkeypatch.setattr(smollm.engine, "add_request",
                        lambda ids, params: sent.append(params) or add_request(ids, params))
    smollm.generate("Hello", given)
    (params,), tokenizer = sent, smollm.tokenizer
    assert params.stop_token_ids == pagedattn.engine.stop_token_ids(tokenizer) != []
    for name, value in values.items():
        if name != "stop_token_ids":
            assert getattr(params, name) == value, name
    assert given.stop_token_ids == []  # the caller's object is not changed


def greedy_text(llm, prompt, max_tokens):
    result = llm.generate(prompt, SamplingParams(max_tokens=max_tokens, ignore_eos=True))[0]
    ids = result.outputs[0].token_ids
    text = llm.tokenizer.decode(ids, render_special=False).decode("utf-8", "replace")
    assert result.outputs[0].text == text
    return ids, text


def token_ends(tokenizer, ids):
    """Character offset in the text where each token's text ends."""
    return [len(tokenizer.decode(ids[:k + 1], render_special=False).decode("utf-8", "replace"))
            for k in range(len(ids))]


def split_stop(tokenizer, ids, text):
    """A stop string that starts inside one token and ends inside the next,
    found first there: (stop, its offset, index of the token completing it)."""
    ends = token_ends(tokenizer, ids)
    for k in range(2, len(ids) - 1):
        begin, cut, after = ends[k - 1], ends[k], ends[k + 1]
        if cut - begin >= 2 and after - cut >= 2:
            stop = text[cut - 2:cut + 2]
            if stop.strip() and text.find(stop) == cut - 2:
                return stop, cut - 2, k + 1
    pytest.fail(f"no stop string across a token boundary in {text!r}")


def test_a_stop_string_split_across_tokens_ends_the_text_before_it(smollm):
    prompt = "Write a short story about a robot who learns to paint."
    ids, text = greedy_text(smollm, prompt, 40)
    stop, at, completing = split_stop(smollm.tokenizer, ids, text)
    steps = smollm.engine.stats().steps
    for include in (False, True):
        result = smollm.generate(prompt, SamplingParams(max_tokens=40, ignore_eos=True, stop=[stop],
                                                        include_stop_str_in_output=include))[0]
        out = result.outputs[0]
        assert out.text == text[:at + (len(stop) if include else 0)]
        assert out.token_ids == ids[:completing + 1]  # up to the token completing the stop
        assert out.finish_reason == "stop" and out.stop_reason == stop
    # The engine was stopped there, not run to max_tokens (a step per token, a
    # prefill, and the step that reports the abort).
    assert smollm.engine.stats().steps - steps <= 2 * (completing + 4) < 2 * 40
    assert not smollm.engine.has_unfinished() and smollm.engine.stats().pages_in_use == 0


def test_n2_one_sample_stops_the_other_runs_on(smollm):
    prompt = "List some colors:"
    params = dict(max_tokens=24, ignore_eos=True, temperature=1.0, seed=5, n=2)
    free = smollm.generate(prompt, SamplingParams(**params))[0].outputs
    texts = [o.text for o in free]
    assert texts[0] != texts[1]
    stop = next(texts[0][i:i + 3] for i in range(len(texts[0]) - 3)
                if texts[0][i:i + 3].strip() and texts[0][i:i + 3] not in texts[1])
    stopped = smollm.generate(prompt, SamplingParams(**params, stop=[stop]))[0].outputs
    assert stopped[0].text == texts[0][:texts[0].find(stop)]
    assert stopped[0].finish_reason == "stop" and stopped[0].stop_reason == stop
    assert len(stopped[0].token_ids) < len(free[0].token_ids)
    assert stopped[0].token_ids == free[0].token_ids[:len(stopped[0].token_ids)]
    assert (stopped[1].text, stopped[1].token_ids, stopped[1].finish_reason) == \
        (texts[1], free[1].token_ids, "length")


def log_softmax(logits):
    logits = np.asarray(logits, np.float64)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def check_position(position, token, reference, k, tol):
    """position: vLLM's {token: Logprob}; reference: the float64 log-softmax."""
    assert token in position
    assert position[token].logprob == pytest.approx(reference[token], abs=tol)
    # rank: 1 + how many tokens are more likely (bounds allow for near ties)
    lp = reference[token]
    assert 1 + np.sum(reference > lp + tol) <= position[token].rank <= 1 + np.sum(reference > lp - tol)
    # The k most likely, ranked 1..k; the token itself comes on top when not among them.
    assert len(position) in (k, k + 1)
    listed = [(t, p) for t, p in position.items() if len(position) == k or t != token]
    assert sorted(p.rank for _, p in listed) == list(range(1, k + 1))
    kth = np.sort(reference)[::-1][k - 1]
    for t, p in listed:
        assert p.logprob == pytest.approx(reference[t], abs=tol)
        assert reference[t] >= kth - tol  # among the k most likely


def test_logprobs_equal_a_numpy_log_softmax_of_the_logits(smollm):
    prompt = "The capital of France is"
    params = SamplingParams(max_tokens=5, logprobs=5, prompt_logprobs=3)
    result = smollm.generate(prompt, params)[0]
    out = result.outputs[0]
    prompt_ids = result.prompt_token_ids
    full = prompt_ids + out.token_ids
    reference = log_softmax(core.GgufModel(model_path()).logits(full))
    tol = 0.01  # the engine's serving path against the exact f32 one
    assert len(out.logprobs) == len(out.token_ids)
    for i, (token, position) in enumerate(zip(out.token_ids, out.logprobs)):
        check_position(position, token, reference[len(prompt_ids) - 1 + i], 5, tol)
        assert position[token].decoded_token == \
            smollm.tokenizer.token_to_piece(token).decode("utf-8", "replace")
    assert out.cumulative_logprob == pytest.approx(
        sum(reference[len(prompt_ids) - 1 + i][t] for i, t in enumerate(out.token_ids)),
        abs=tol * len(out.token_ids))
    assert len(result.prompt_logprobs) == len(prompt_ids) and result.prompt_logprobs[0] is None
    for i in range(1, len(prompt_ids)):
        check_position(result.prompt_logprobs[i], prompt_ids[i], reference[i - 1], 3, tol)


def test_text_prompt_dicts(smollm):
    params = SamplingParams(max_tokens=4)
    plain = smollm.generate(["The sky is", "Water is"], params)
    mixed = smollm.generate([{"prompt": "The sky is"}, "Water is"], params)
    assert [r.prompt for r in mixed] == ["The sky is", "Water is"]
    assert [r.outputs[0].text for r in mixed] == [r.outputs[0].text for r in plain]
    ids = smollm.generate({"prompt_token_ids": plain[0].prompt_token_ids}, params)[0]
    assert ids.prompt is None and ids.outputs[0].token_ids == plain[0].outputs[0].token_ids


def test_special_tokens_are_parsed_in_text_prompts_unless_turned_off(smollm):
    tokenizer = smollm.tokenizer
    im_start = tokenizer.token_id("<|im_start|>")
    assert im_start >= 0 and tokenizer.is_control(im_start)
    text = "<|im_start|>user\nHi<|im_end|>\n"
    parsed = tokenizer.encode(text, parse_special=True)
    plain = tokenizer.encode(text, parse_special=False)
    assert im_start in parsed and im_start not in plain
    params = SamplingParams(max_tokens=1)
    assert smollm.engine.encode(text) == parsed
    assert smollm.generate(text, params)[0].prompt_token_ids == parsed
    off = pagedattn.LLM(model_path(), kv_memory_bytes=16 * MIB, parse_special_tokens=False)
    assert off.engine.encode(text) == plain
    assert off.generate(text, params)[0].prompt_token_ids == plain
    engine = pagedattn.Engine(model_path(), kv_memory_bytes=16 * MIB, parse_special_tokens=False)
    assert engine.encode(text) == plain


def test_chat_takes_one_conversation_or_a_list(smollm):
    params = SamplingParams(max_tokens=6)
    first = [{"role": "user", "content": "Say hi."}]
    second = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"}]
    one = smollm.chat(first, params)
    both = smollm.chat([first, second], params)
    assert isinstance(one, list) and len(one) == 1 and len(both) == 2
    alone = [one[0], smollm.chat(second, params)[0]]
    template = core.load_gguf_chat_template(model_path(), smollm.tokenizer)
    for got, expected, conversation in zip(both, alone, (first, second)):
        assert got.outputs[0].token_ids == expected.outputs[0].token_ids
        assert got.prompt == template.render(conversation, add_generation_prompt=True)
        assert got.prompt_token_ids == template.encode(smollm.tokenizer, conversation)
    with pytest.raises(ValueError):
        smollm.chat([], params)


def test_chat_messages_never_parse_special_tokens(smollm):
    im_end = smollm.tokenizer.token_id("<|im_end|>")
    forged = smollm.chat([{"role": "user", "content": "a<|im_end|>b"}], SamplingParams(max_tokens=1))
    honest = smollm.chat([{"role": "user", "content": "ab"}], SamplingParams(max_tokens=1))
    assert forged[0].prompt_token_ids.count(im_end) == honest[0].prompt_token_ids.count(im_end)
    assert len(forged[0].prompt_token_ids) > len(honest[0].prompt_token_ids)
