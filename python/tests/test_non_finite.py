"""Broken weights from Python: a tiny GGUF file with a NaN planted in one
token's embedding row. A request that reads that token ends with
finish_reason "error" and a message (Engine), LLM.generate raises
GenerationError with every result attached, the rest of the batch is
unaffected, and Model.from_gguf(check_tensors=True) refuses the file naming
the tensor."""
import numpy as np
import pytest

gguf = pytest.importorskip("gguf")
import pagedattn  # noqa: E402
from pagedattn import SamplingParams  # noqa: E402

VOCAB, HIDDEN, HEADS, KV_HEADS, FF, LAYERS = 32, 64, 4, 2, 96, 2
HEALTHY = [[1, 2, 3], [4, 5, 6, 7]]
GREEDY = SamplingParams(max_tokens=6, ignore_eos=True)


def write_tiny_llama(path, poisoned_token=None):
    """A random-weight llama file (F32); poisoned_token's embedding row holds a NaN."""
    rng = np.random.default_rng(0)
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(LAYERS)
    w.add_context_length(256)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(FF)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    hd = HIDDEN // HEADS

    def weight(*shape):
        return (rng.standard_normal(shape) * 0.2).astype(np.float32)

    embedding = weight(VOCAB, HIDDEN)
    if poisoned_token is not None:
        embedding[poisoned_token, 5] = np.nan
    w.add_tensor("token_embd.weight", embedding)
    w.add_tensor("output_norm.weight", np.ones(HIDDEN, np.float32))
    w.add_tensor("output.weight", weight(VOCAB, HIDDEN))
    for layer in range(LAYERS):
        p = f"blk.{layer}."
        w.add_tensor(p + "attn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(p + "attn_q.weight", weight(HEADS * hd, HIDDEN))
        w.add_tensor(p + "attn_k.weight", weight(KV_HEADS * hd, HIDDEN))
        w.add_tensor(p + "attn_v.weight", weight(KV_HEADS * hd, HIDDEN))
        w.add_tensor(p + "attn_output.weight", weight(HIDDEN, HEADS * hd))
        w.add_tensor(p + "ffn_norm.weight", np.ones(HIDDEN, np.float32))
        w.add_tensor(p + "ffn_gate.weight", weight(FF, HIDDEN))
        w.add_tensor(p + "ffn_up.weight", weight(FF, HIDDEN))
        w.add_tensor(p + "ffn_down.weight", weight(HIDDEN, FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return str(path)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    """(clean path, broken path, the poisoned token, the healthy prompts' clean outputs)."""
    folder = tmp_path_factory.mktemp("non_finite")
    clean = write_tiny_llama(folder / "clean.gguf")
    reference = pagedattn.LLM(pagedattn.Model.from_gguf(clean)).generate(HEALTHY, GREEDY)
    used = {t for prompt in HEALTHY for t in prompt}
    used |= {t for r in reference for t in r.outputs[0].token_ids}
    poisoned = min(set(range(VOCAB)) - used)
    broken = write_tiny_llama(folder / "broken.gguf", poisoned)
    return clean, broken, poisoned, [r.outputs[0].token_ids for r in reference]


def test_engine_ends_the_request_with_an_error_and_frees_its_pages(files):
    _, broken, poisoned, _ = files
    engine = pagedattn.Engine(pagedattn.Model.from_gguf(broken), kv_memory_bytes=1 << 20,
                              deterministic=True)
    bad = engine.add_request([1, poisoned, 2], SamplingParams(max_tokens=4, temperature=1.0, n=2))
    good = engine.add_request(HEALTHY[0], GREEDY)
    finished = {}
    for output in engine:
        if output.finished:
            finished[output.request_id] = output
    assert finished[good].error is None
    failed = finished[bad]
    assert sorted(s.finish_reason for s in failed.samples) == ["error", "error"]
    assert all(not s.new_token_ids for s in failed.samples)
    assert f"request {bad}:" in failed.error
    assert f"{VOCAB} NaN and 0 Inf of {VOCAB} logits" in failed.error
    assert engine.stats().pages_in_use == 0


def test_llm_generate_raises_with_every_result_attached(files):
    _, broken, poisoned, reference = files
    llm = pagedattn.LLM(pagedattn.Model.from_gguf(broken))
    with pytest.raises(pagedattn.GenerationError, match="NaN") as raised:
        llm.generate([HEALTHY[0], [3, poisoned], HEALTHY[1]], GREEDY)
    assert isinstance(raised.value, pagedattn.Error) and isinstance(raised.value, RuntimeError)
    results = raised.value.outputs
    assert [r.outputs[0].token_ids for r in (results[0], results[2])] == reference
    assert results[0].outputs[0].finish_reason == "length" and results[0].outputs[0].error is None
    failed = results[1].outputs[0]
    assert failed.finish_reason == "error" and failed.token_ids == []
    assert "not finite" in failed.error
    # The engine is left clean: the next call works.
    assert llm.generate([HEALTHY[0]], GREEDY)[0].outputs[0].token_ids == reference[0]


def test_check_tensors_refuses_the_file_naming_the_tensor(files):
    clean, broken, poisoned, _ = files
    pagedattn.Model.from_gguf(broken)  # off by default
    pagedattn.Model.from_gguf(clean, check_tensors=True)
    element = poisoned * HIDDEN + 5
    with pytest.raises(pagedattn.InvalidArgumentError,
                       match=rf"'token_embd.weight' element {element} \(row {poisoned}, column 5\) is NaN"):
        pagedattn.Model.from_gguf(broken, check_tensors=True)
