"""pagedattn's GGUF model families against Hugging Face transformers on the
same weights.

For every family a small transformers model (2-7 layers, the family's real
head_dim, GQA ratio, window, softcaps and RoPE settings; seeded random weights
scaled so logits are O(1-10)) is written to a GGUF file the way llama.cpp's
convert_hf_to_gguf.py writes that family (hf_gguf_families.py; the converter's
code was read class by class). Then:

1. The writer is checked independently of pagedattn: transformers' own GGUF
   loader reads the file back to the same weights (it undoes the llama q/k
   permutation, Gemma's +1 and maps the fused Phi-3 tensors by itself) and the
   same logits. Where its GGUF config mapping reads the keys the family needs
   (llama, llama-f16, qwen2, qwen3, gemma2, phi3; for qwen3 and gemma2 partly
   because its config defaults equal these files' values: qwen3 head_dim 128,
   gemma2 softcaps 50 / 30 and query_pre_attn_scalar 256, which it does not
   read) the model is rebuilt from the file alone; where it does not (rope scaling, windows of llama/mistral,
   gemma3's local base) the original config is supplied and the tensors come
   from the file (mistral: transformers maps general.architecture "llama" to
   LlamaForCausalLM; its tensors go into the original MistralForCausalLM).
2. pagedattn (core.GgufModel(path).logits) against the HF model run in float64
   (eager attention): top-1 agreement and a stated max |logit error|, for f32
   and f16 K/V; then a 16-token greedy continuation against HF
   generate(do_sample=False, no_repeat_ngram_size=2), pagedattn's side being
   the argmax of its last-position logits under the same bigram ban.
3. A GGUF file of an architecture pagedattn does not run (falcon) raises
   UnsupportedError naming the architecture.

transformers 5.x classes: LlamaForCausalLM (llama, llama-f16, llama3,
llama-linear), MistralForCausalLM, Qwen2ForCausalLM (qwen2, qwen2-yarn),
Qwen3ForCausalLM, Gemma2ForCausalLM, Gemma3ForCausalLM (Gemma3TextConfig),
Phi3ForCausalLM, Qwen2MoeForCausalLM, Qwen3MoeForCausalLM, DeepseekV2ForCausalLM,
DeepseekV3ForCausalLM. Nothing is downloaded (HF_HUB_OFFLINE=1). transformers
has no GGUF loader for deepseek2: for those files step 1 reads the file back
with gguf's reader and undoes the converter's transforms itself.

Conventions of the files (what pagedattn's loader must read), per family:

| family | general.architecture | shape (layers, hidden, heads/kv, head_dim) | tensors / transforms | keys beyond the common ones (*) |
|---|---|---|---|---|
| llama | llama | 2, 256, 4/2, 64 | q/k rows permuted (LlamaModel.permute: row 2i+s of a head = HF row i + s*hd/2; rotate adjacent pairs); untied output.weight | vocab_size, rope.dimension_count=64, key/value_length=64 |
| llama-f16 | llama | as llama | 2-D weights F16, norms F32 (--outtype f16) | as llama; general.file_type=1 |
| llama3 | llama | 2, 512, 4/1, 128 | as llama; tied (no output.weight); rope_freqs.weight F32 [64]: per-pair frequency divisor (1 / 8 / smoothed 1/((1-s)/8+s)), the converter's loop | rope.freq_base=500000; NO rope.scaling.* keys (the converter writes none for llama3) |
| llama-linear | llama | 2, 256, 4/4, 64 | as llama | rope.scaling.type="linear", rope.scaling.factor=4 (positions / 4) |
| qwen2 | qwen2 | 2, 448, 7/1, 64 | no permutation (neox pairs i, i+hd/2); attn_q/k/v.bias; tied | none (no key_length, no rope.dimension_count); rope.freq_base=1e6 |
| qwen2-yarn | qwen2 | 2, 256, 4/2, 64 | as qwen2, untied | rope.scaling.type="yarn", .factor=4, .original_context_length=32 (no yarn_beta_* / attn_factor keys: HF defaults beta_fast 32, beta_slow 1, attention factor 0.1 ln(4)+1 on cos/sin); context_length=128 |
| qwen3 | qwen3 | 2, 256, 4/2, 128 (q dim 512 != hidden) | attn_q_norm / attn_k_norm [128] (RMSNorm per head, before RoPE), no biases, tied | key/value_length=128 |
| mistral | llama | 2, 256, 4/1, 64 | as llama, untied | llama.attention.sliding_window=12 (a query sees itself and the 11 before it, every layer). NOTE: llama.cpp's converter writes no window for llama-arch (Mistral) files; this key is pagedattn's reading of gguf's standard key name |
| gemma2 | gemma2 | 4, 256, 4/2, 256 | +1 on every *norm.weight; post_attention_norm, ffn_norm (pre-FFN), post_ffw_norm; GELU-tanh; no output.weight; embeddings x sqrt(hidden) | key/value_length=256, attn_logit_softcapping=50, final_logit_softcapping=30, attention.sliding_window=16 (layers 0, 2: windowed; 1, 3: global); NO rope.freq_base (Gemma2Model writes none: 10000); query_pre_attn_scalar=head_dim -> scale 1/sqrt(256) |
| gemma3 | gemma3 | 7, 256, 4/1, 256 | as gemma2 + attn_q_norm/attn_k_norm (+1 too); tied | rope.freq_base=1e6 (global), rope.freq_base_swa=10000 (windowed; base converter from rope_parameters["sliding_attention"]), rope.scaling.type="linear" factor 8 (global layers only), attention.sliding_window=16; layers 5 global, 0-4 and 6 windowed ((i+1) % 6 != 0); no softcaps |
| phi3 | phi3 | 2, 384, 4/4, 96 | attn_qkv [q; k; v] rows, ffn_up = [gate; up] (2*ffn rows), untied | rope.dimension_count=96, rope.scaling.original_context_length=2048 (written always, without a scaling type), attention.sliding_window=0 (no window) |
| phi3-longrope | phi3 | 2, 384, 4/4, 96 | as phi3 + rope_factors_long.weight / rope_factors_short.weight F32 [48] | context 128, rope.scaling.original_context_length=16, rope.scaling.attn_factor=sqrt(1 + ln 8 / ln 16) (Phi3MiniModel); pagedattn serves 128 > 16: long factors, as HF for sequences past 16 |
| phi3-longrope-short | phi3 | as phi3-longrope | same tensors | context = original = 128: short factors, attn_factor 1 |
| qwen2moe | qwen2moe | 2, 256, 4/2, 64; 8 experts of width 128, top-2; shared expert 384 | as qwen2 (biases), untied; per layer ffn_gate_inp [256, 8] (router), ffn_gate_exps / ffn_up_exps [256, 128, 8], ffn_down_exps [128, 256, 8] (HF's fused gate_up_proj split), ffn_gate_shexp / ffn_up_shexp [256, 384], ffn_down_shexp [384, 256], ffn_gate_inp_shexp [256] (1-D) | expert_count=8, expert_used_count=2, expert_feed_forward_length=128, expert_shared_feed_forward_length=384; no norm_topk_prob key (qwen2moe: weights not renormalised) |
| qwen3moe | qwen3moe | 2, 256, 4/2, 128; 16 experts of width 64, top-4 | as qwen3 (q/k norms), tied; router and expert tensors as qwen2moe, no shared expert | expert_count=16, expert_used_count=4, expert_feed_forward_length=64, key/value_length=128; qwen3moe: top-4 weights renormalised (HF norm_topk_prob=True) |
| deepseek-v2-lite | deepseek2 | 2, 256, 4 heads; MLA latent 64, nope 32 + rope 16, v 32; layer 0 dense (512), layer 1: 8 experts of width 64, top-2, 2 shared | attn_q [256, 192] (no q_lora_rank), attn_kv_a_mqa [256, 80], attn_kv_a_norm [64], attn_k_b [32, 64, 4], attn_v_b [64, 32, 4] (kv_b split, keys transposed), attn_output [128, 256]; ffn_gate_inp, *_exps, *_shexp [256, 128]; untied | head_count_kv=1, kv_lora_rank=64, key_length=80, value_length=64, key_length_mla=48, value_length_mla=32, rope.dimension_count=16, leading_dense_block_count=1, expert_count=8, expert_used_count=2, expert_shared_count=2, expert_feed_forward_length=64, expert_weights_scale=1, expert_gating_func=1 (softmax), expert_group_count=1, expert_group_used_count=1 |
| deepseek-v2-kvb | deepseek2 | as v2-lite, q_lora_rank 96 | attn_q_a [256, 96], attn_q_a_norm [96], attn_q_b [96, 192]; the OLD single attn_kv_b [64, 256] as HF stores it | head_count_kv=4, key_length=48, value_length=32 (no *_mla keys), q_lora_rank=96, expert_group_count=4, expert_group_used_count=1 (HF group_limited_greedy: the best group by its best expert), expert_weights_scale=2, rope.scaling.type=yarn factor 4 original 32, yarn_log_multiplier=0.0707 (mscale_all_dim 0.707); context 128 |
| deepseek-v3 | deepseek2 | 3, 256, 4 heads; MLA latent 64, nope 32 + rope 16, v 48; layer 0 dense; 16 experts of width 64, top-4, 1 shared | as v2-kvb's q, split attn_k_b / attn_v_b; exp_probs_b.bias [16] (e_score_correction_bias) | expert_gating_func=2 (sigmoid), expert_group_count=4, expert_group_used_count=2 (groups by the sum of their best two), expert_weights_norm=true, expert_weights_scale=2.5, yarn factor 4 original 32, yarn_log_multiplier=0.1; context 128 |

(*) common: {arch}.block_count, context_length (2048 unless stated),
embedding_length, feed_forward_length, attention.head_count,
attention.head_count_kv, attention.layer_norm_rms_epsilon, rope.freq_base
(10000 unless stated), general.name, general.file_type; tokenizer.ggml.model
"gpt2", pre "default", 3 control tokens + 256 byte-level tokens + letter-pair
merges to 384 (pagedattn's and transformers' tokenizers read from the file
encode alike), bos 1, eos 2, pad 0. All tensors F32 except in llama-f16.
"""
import functools
import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
gguf = pytest.importorskip("gguf")
pytest.importorskip("accelerate")  # transformers' GGUF loading needs it

import hf_gguf_families as H  # noqa: E402
import pagedattn._core as core  # noqa: E402

FAMILIES = list(H.FAMILIES)
PROMPT_LEN = 64      # exceeds every window (12 / 16) several times over
GREEDY_PROMPT = 32
GREEDY_STEPS = 16

# f32 activations: every product rounds a sum of <= 1024 terms (~1e-7
# relative each), RMSNorm divides by the residual stream's RMS, softmax, GELU
# and SiLU add 1-ulp errors. The reference is float64, so the whole difference
# is pagedattn's rounding: measured 1.3e-5 .. 6.4e-5 over these families with
# f32 K/V (logits up to 12-36; gemma2 largest). 1e-3 leaves >= 15x for other
# SIMD targets and still fails on any real mistake: switching off one
# family setting (scaling, window, softcap, local base) moves logits by
# 1.1-13 (test_each_family_setting_matters), a wrong RoPE pair or norm
# offset by more.
# f16 K/V rounds every key and value to 11 bits (relative 2^-12 ~ 2.4e-4);
# scores q.k (up to ~50 in gemma2) carry that into the softmax and values
# into the outputs: measured 2.9e-3 .. 2.1e-2 (gemma2 largest). 0.1 leaves 5x
# and stays 10x below the smallest setting checked above.
TOLERANCE = {"f32": 1e-3, "f16": 0.1}


def prompt_tokens(family, n=PROMPT_LEN):
    """48 random ids then a repeat of 16 of them (an induction pattern)."""
    rng = np.random.default_rng(sum(map(ord, family)))
    vocab = H.FAMILIES[family].config["vocab_size"]
    ids = [int(t) for t in rng.integers(3, vocab, n - 16)]
    return ids + ids[8:24]


@functools.lru_cache(maxsize=None)
def built(family, directory):
    """(HF float32 model, GGUF path) for one family, written once per session."""
    fam = H.FAMILIES[family]
    model = H.build_model(fam)
    path = os.path.join(directory, f"{family}.gguf")
    H.write_gguf(fam, model, path)
    return model, path


@functools.lru_cache(maxsize=None)
def reference64(family, directory):
    """The HF model in float64 (eager): its RoPE tables and Gemma's norms
    still run in float32 inside transformers (<= ~1e-6 on these logits)."""
    model, _ = built(family, directory)
    import copy
    m64 = copy.deepcopy(model).to(torch.float64)
    m64.eval()
    return m64


def hf_logits(model, tokens):
    with torch.no_grad():
        return model(torch.tensor([tokens])).logits[0].double().numpy()


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return str(tmp_path_factory.mktemp("families"))


def gguf_fields(path):
    r = gguf.GGUFReader(path)
    return {k: f.contents() for k, f in r.fields.items()}, {t.name: t for t in r.tensors}


# ------------------------------------------------------------- writer checks

def expected_keys(family):
    """Per family: keys that must hold these values (the docstring's table)."""
    fam = H.FAMILIES[family]
    c = fam.config
    a = fam.arch
    if a == "deepseek2":
        return expected_deepseek_keys(fam)
    keys = {f"{a}.block_count": c["num_hidden_layers"],
            f"{a}.embedding_length": c["hidden_size"],
            f"{a}.feed_forward_length": c["intermediate_size"],
            f"{a}.attention.head_count": c["num_attention_heads"],
            f"{a}.attention.head_count_kv": c["num_key_value_heads"],
            f"{a}.context_length": c["max_position_embeddings"]}
    rope = c["rope_parameters"]
    full = rope.get("full_attention", rope)
    if a != "gemma2":
        keys[f"{a}.rope.freq_base"] = full["rope_theta"]
    if a == "llama":
        keys[f"{a}.rope.dimension_count"] = c["head_dim"]
        keys[f"{a}.vocab_size"] = c["vocab_size"]
    if full.get("rope_type") in ("linear", "yarn"):
        keys[f"{a}.rope.scaling.type"] = full["rope_type"]
        keys[f"{a}.rope.scaling.factor"] = full["factor"]
    if full.get("rope_type") == "yarn":
        keys[f"{a}.rope.scaling.original_context_length"] = full["original_max_position_embeddings"]
    if "head_dim" in c:
        keys[f"{a}.attention.key_length"] = c["head_dim"]
        keys[f"{a}.attention.value_length"] = c["head_dim"]
    if c.get("sliding_window"):
        keys[f"{a}.attention.sliding_window"] = c["sliding_window"]
    if a == "gemma2":
        keys["gemma2.attn_logit_softcapping"] = c["attn_logit_softcapping"]
        keys["gemma2.final_logit_softcapping"] = c["final_logit_softcapping"]
    if a == "gemma3":
        keys["gemma3.rope.freq_base_swa"] = rope["sliding_attention"]["rope_theta"]
    if a in ("qwen2moe", "qwen3moe"):
        keys[f"{a}.expert_count"] = c["num_experts"]
        keys[f"{a}.expert_used_count"] = c["num_experts_per_tok"]
        keys[f"{a}.expert_feed_forward_length"] = c["moe_intermediate_size"]
        if "shared_expert_intermediate_size" in c:
            keys[f"{a}.expert_shared_feed_forward_length"] = c["shared_expert_intermediate_size"]
    if a == "phi3":
        keys["phi3.rope.dimension_count"] = c["hidden_size"] // c["num_attention_heads"]
        keys["phi3.rope.scaling.original_context_length"] = c["original_max_position_embeddings"]
        keys["phi3.attention.sliding_window"] = 0
    return keys


def expected_deepseek_keys(fam):
    c, a = fam.config, "deepseek2"
    rope = c["rope_parameters"]
    latent, nope, rope_dim = c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    keys = {f"{a}.block_count": c["num_hidden_layers"],
            f"{a}.embedding_length": c["hidden_size"],
            f"{a}.feed_forward_length": c["intermediate_size"],
            f"{a}.attention.head_count": c["num_attention_heads"],
            f"{a}.context_length": c["max_position_embeddings"],
            f"{a}.rope.freq_base": rope["rope_theta"],
            f"{a}.rope.dimension_count": rope_dim,
            f"{a}.vocab_size": c["vocab_size"],
            f"{a}.attention.kv_lora_rank": latent,
            f"{a}.leading_dense_block_count": c["first_k_dense_replace"],
            f"{a}.expert_count": c["n_routed_experts"],
            f"{a}.expert_used_count": c["num_experts_per_tok"],
            f"{a}.expert_shared_count": c["n_shared_experts"],
            f"{a}.expert_feed_forward_length": c["moe_intermediate_size"],
            f"{a}.expert_weights_scale": c["routed_scaling_factor"],
            f"{a}.expert_group_count": c["n_group"],
            f"{a}.expert_group_used_count": c["topk_group"],
            f"{a}.expert_gating_func": 2 if fam.hf_class == "DeepseekV3ForCausalLM" else 1}
    if fam.kv_b_split:
        keys.update({f"{a}.attention.head_count_kv": 1,
                     f"{a}.attention.key_length": latent + rope_dim,
                     f"{a}.attention.value_length": latent,
                     f"{a}.attention.key_length_mla": nope + rope_dim,
                     f"{a}.attention.value_length_mla": c["v_head_dim"]})
    else:
        keys.update({f"{a}.attention.head_count_kv": c["num_attention_heads"],
                     f"{a}.attention.key_length": nope + rope_dim,
                     f"{a}.attention.value_length": c["v_head_dim"]})
    if c["q_lora_rank"] is not None:
        keys[f"{a}.attention.q_lora_rank"] = c["q_lora_rank"]
    if c["norm_topk_prob"]:
        keys[f"{a}.expert_weights_norm"] = True
    if rope.get("rope_type") == "yarn":
        keys[f"{a}.rope.scaling.type"] = "yarn"
        keys[f"{a}.rope.scaling.factor"] = rope["factor"]
        keys[f"{a}.rope.scaling.original_context_length"] = rope["original_max_position_embeddings"]
        keys[f"{a}.rope.scaling.yarn_log_multiplier"] = 0.1 * rope["mscale_all_dim"]
    return keys


def check_deepseek_model_config(fam, path):
    """What pagedattn reads of a deepseek2 file (core.GgufFile.model_config)."""
    config = core.GgufFile(path).model_config()
    c = fam.config
    rope = c["rope_parameters"]
    latent, nope, rope_dim = c["kv_lora_rank"], c["qk_nope_head_dim"], c["qk_rope_head_dim"]
    assert config["num_kv_heads"] == 1 and config["head_dim"] == latent + rope_dim
    assert config["rotary_dim"] == rope_dim and config["rope_layout"] == "interleaved"
    assert config["kv_lora_rank"] == latent and config["qk_nope_head_dim"] == nope
    assert config["q_lora_rank"] == (c["q_lora_rank"] or 0)
    assert config["v_head_dim"] == c["v_head_dim"]
    assert config["num_experts"] == c["n_routed_experts"]
    assert config["shared_expert_intermediate_size"] == c["n_shared_experts"] * c["moe_intermediate_size"]
    assert config["leading_dense_layers"] == c["first_k_dense_replace"]
    assert config["expert_weights_scale"] == pytest.approx(c["routed_scaling_factor"])
    assert config["normalize_expert_weights"] == bool(c["norm_topk_prob"])
    # HF's scaling: qk_head_dim^-0.5, x yarn_get_mscale(factor, mscale_all_dim)^2 under YaRN
    scale = (nope + rope_dim) ** -0.5
    if rope.get("rope_type") == "yarn":
        scale *= (0.1 * rope["mscale_all_dim"] * np.log(rope["factor"]) + 1.0) ** 2
    assert config["attention_scale"] == pytest.approx(scale, rel=1e-6)


@pytest.mark.parametrize("family", FAMILIES)
def test_gguf_file_follows_the_converter(family, workdir):
    fam = H.FAMILIES[family]
    model, path = built(family, workdir)
    fields, tensors = gguf_fields(path)
    assert fields["general.architecture"] == fam.arch
    for key, want in expected_keys(family).items():
        assert key in fields, key
        assert fields[key] == pytest.approx(want), key
    if fam.arch == "gemma2":
        assert "gemma2.rope.freq_base" not in fields and "output.weight" not in tensors
    if family == "llama3":
        assert not any(k.startswith("llama.rope.scaling") for k in fields)
        rf = tensors["rope_freqs.weight"]
        assert rf.tensor_type == gguf.GGMLQuantizationType.F32
        factors = np.asarray(rf.data, dtype=np.float64)
        assert factors.shape == (fam.config["head_dim"] // 2,)
        # the three bands are all present: 1 (short waves), 8 (long), between
        assert factors[0] == 1 and factors[-1] == 8 and np.any((factors > 1) & (factors < 8))
        # llama.cpp's frequencies theta^(-2i/d) / factor_i are HF's llama3 inv_freq
        d = fam.config["head_dim"]
        ours = 500000.0 ** (-np.arange(0, d, 2) / d) / factors
        hf_inv = model.model.rotary_emb.inv_freq.double().numpy()
        assert np.max(np.abs(ours / hf_inv - 1)) < 1e-6
    if fam.arch in ("qwen2moe", "qwen3moe"):  # what pagedattn reads of the experts
        config = core.GgufFile(path).model_config()
        c = fam.config
        assert config["num_experts"] == c["num_experts"]
        assert config["num_experts_used"] == c["num_experts_per_tok"]
        assert config["expert_intermediate_size"] == c["moe_intermediate_size"]
        assert config["shared_expert_intermediate_size"] == c.get("shared_expert_intermediate_size", 0)
        assert config["normalize_expert_weights"] == (fam.arch == "qwen3moe")
    if fam.arch == "deepseek2":
        check_deepseek_model_config(fam, path)
    want_tied = model.config.tie_word_embeddings
    assert ("output.weight" not in tensors) == want_tied
    for t in tensors.values():
        want = (gguf.GGMLQuantizationType.F16 if fam.f16 and len(t.shape) == 2
                else gguf.GGMLQuantizationType.F32)
        assert t.tensor_type == want, t.name
    # both loaders accept the tokenizer section and agree on it (transformers
    # refuses deepseek2 files outright: there pagedattn's round trip only)
    ours = core.load_gguf_tokenizer(path)
    theirs = (None if fam.arch == "deepseek2" else
              transformers.AutoTokenizer.from_pretrained(os.path.dirname(path),
                                                         gguf_file=os.path.basename(path)))
    assert ours.vocab_size == fam.config["vocab_size"]
    for text in ["hello there", "The quick brown fox, 123!", "\u00fcn\u00efc\u00f6d\u00e9  spaces\n\tx"]:
        ids = list(ours.encode(text, add_special=False))
        if theirs is not None:
            assert ids == theirs(text, add_special_tokens=False)["input_ids"], text
        assert ours.decode(ids) == text.encode()


def deepseek_state_dict_from_gguf(fam, path, model):
    """The HF state dict rebuilt from a deepseek2 file by undoing the
    converter's transforms (transformers has no GGUF loader for it)."""
    _, tensors = gguf_fields(path)
    arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == "deepseek2")
    name_map = gguf.get_tensor_name_map(arch, model.config.num_hidden_layers)
    c = fam.config
    heads, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]

    def array(name):  # numpy in PyTorch order (gguf's reader reverses ggml dims)
        return torch.from_numpy(np.array(tensors[name].data, dtype=np.float32))

    state = {}
    for hf_name, want in model.state_dict().items():
        if "rotary_emb" in hf_name:
            continue
        layer = hf_name.split(".")[2] if hf_name.startswith("model.layers.") else None
        stem, suffix = hf_name.rsplit(".", 1)
        if suffix == "e_score_correction_bias":
            got = array(f"blk.{layer}.exp_probs_b.bias")
        elif stem.endswith("kv_b_proj") and fam.kv_b_split:
            k_b = array(f"blk.{layer}.attn_k_b.weight").transpose(1, 2)  # [H, nope, latent]
            v_b = array(f"blk.{layer}.attn_v_b.weight")                  # [H, v, latent]
            assert k_b.shape[1] == nope and v_b.shape[1] == v
            got = torch.cat([k_b, v_b], dim=1).reshape(heads * (nope + v), -1)
        elif stem.endswith("mlp.experts") and suffix == "gate_up_proj":
            parts = [array(name_map.get_name(f"{stem}.{p}") + ".weight") for p in ("gate_proj", "up_proj")]
            got = torch.cat(parts, dim=1)
        elif stem.endswith("mlp.experts"):
            got = array(name_map.get_name(f"{stem}.{suffix}") + ".weight")
        else:
            got = array(f"{name_map.get_name(stem)}.{suffix}")
        state[hf_name] = got.reshape(want.shape)
    return state


def load_hf_from_gguf(family, directory):
    """transformers' own GGUF loader on the file: (model, whole_config_read)."""
    fam = H.FAMILIES[family]
    model, path = built(family, directory)
    if fam.arch == "deepseek2":
        hf = type(model)._from_config(model.config, attn_implementation="eager",
                                      dtype=torch.float32, experts_implementation="eager")
        hf.load_state_dict(deepseek_state_dict_from_gguf(fam, path, model))
        return hf.eval()
    name = os.path.basename(path)
    kwargs = dict(gguf_file=name, dtype=torch.float32, attn_implementation="eager")
    if fam.hf_reads_whole_config:
        return transformers.AutoModelForCausalLM.from_pretrained(directory, **kwargs)
    if fam.hf_class == "MistralForCausalLM":
        # transformers reads the llama-arch file as LlamaForCausalLM (tensors
        # un-permuted); the window comes from the original config.
        llama = transformers.AutoModelForCausalLM.from_pretrained(directory, **kwargs)
        assert type(llama).__name__ == "LlamaForCausalLM"
        hf = type(model)._from_config(model.config, attn_implementation="eager",
                                      dtype=torch.float32)
        hf.load_state_dict(llama.state_dict())
        return hf.eval()
    return transformers.AutoModelForCausalLM.from_pretrained(directory, config=model.config,
                                                             **kwargs)


@pytest.mark.parametrize("family", FAMILIES)
def test_transformers_reads_the_file_back(family, workdir):
    fam = H.FAMILIES[family]
    model, _ = built(family, workdir)
    hf = load_hf_from_gguf(family, workdir)
    assert type(hf).__name__ == fam.hf_class
    want = model.state_dict()
    got = hf.state_dict()
    for name, w in want.items():
        if "rotary_emb" in name:
            continue
        assert name in got, name
        if H.is_gemma(fam) and name.endswith("norm.weight"):
            # stored as 1 + w in f32, read back as (1 + w) - 1: one rounding at |1 + w| < 2
            assert torch.max(torch.abs(got[name] - w)) <= 2.0 ** -22, name
        else:
            assert torch.equal(got[name], w), name  # exact: F32 (or F16-rounded) round trip
    tokens = prompt_tokens(family)
    diff = np.max(np.abs(hf_logits(hf, tokens) - hf_logits(model, tokens)))
    print(f"{family}: transformers from GGUF ({'file config' if fam.hf_reads_whole_config else 'original config: ' + fam.hf_gap}) "
          f"vs original: max |logit diff| {diff:.1e}")
    assert diff <= 1e-5


# Each family's distinctive setting, switched off in the HF model (same
# weights): it must move the logits far beyond TOLERANCE["f16"], or the
# comparison with pagedattn below would not check it.
FEATURES = {
    "llama3": [("no llama3 scaling", dict(rope_parameters=dict(rope_type="default", rope_theta=500000.0)))],
    "llama-linear": [("no linear scaling", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)))],
    "qwen2-yarn": [("no YaRN", dict(rope_parameters=dict(rope_type="default", rope_theta=1000000.0)))],
    "mistral": [("no window", dict(sliding_window=None))],
    "gemma2": [("no window", dict(sliding_window=4096)),
               ("no attention softcap", dict(attn_logit_softcapping=None)),
               ("no final softcap", dict(final_logit_softcapping=None))],
    "gemma3": [("no window", dict(sliding_window=4096)),
               ("local base = global base", dict(rope_parameters=dict(
                   full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                   sliding_attention=dict(rope_type="default", rope_theta=1000000.0)))),
               ("no global scaling", dict(rope_parameters=dict(
                   full_attention=dict(rope_type="default", rope_theta=1000000.0),
                   sliding_attention=dict(rope_type="default", rope_theta=10000.0))))],
    # pagedattn fixes these per architecture (as llama.cpp does): the other
    # choice must show.
    "qwen2moe": [("top-k weights renormalised", dict(norm_topk_prob=True))],
    "qwen3moe": [("top-k weights not renormalised", dict(norm_topk_prob=False))],
    "deepseek-v2-kvb": [("no groups", dict(topk_method="greedy")),
                        ("weights not scaled", dict(routed_scaling_factor=1.0)),
                        ("no YaRN", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)))],
    "deepseek-v3": [("no selection bias", dict(_zero_selection_bias=True)),
                    ("no groups", dict(n_group=1, topk_group=1)),
                    ("top-k weights not renormalised", dict(norm_topk_prob=False)),
                    ("weights not scaled", dict(routed_scaling_factor=1.0)),
                    ("no YaRN", dict(rope_parameters=dict(rope_type="default", rope_theta=10000.0)))],
}


@pytest.mark.parametrize("family", list(FEATURES))
def test_each_family_setting_matters(family, workdir):
    fam = H.FAMILIES[family]
    model, _ = built(family, workdir)
    tokens = prompt_tokens(family)
    base = hf_logits(model, tokens)
    for label, override in FEATURES[family]:
        override = dict(override)
        zero_bias = override.pop("_zero_selection_bias", False)  # a weight, not a config field
        config = type(model.config)(**{**fam.config, **override})
        extra = dict(experts_implementation="eager") if H.is_moe(fam) else {}
        variant = type(model)._from_config(config, attn_implementation="eager", dtype=torch.float32,
                                           **extra)
        variant.load_state_dict(model.state_dict())
        if zero_bias:
            with torch.no_grad():
                for name, b in variant.named_buffers():
                    if name.endswith("e_score_correction_bias"):
                        b.zero_()
        diff = np.max(np.abs(hf_logits(variant.eval(), tokens) - base))
        print(f"{family}, {label}: max |logit change| {diff:.2f}")
        assert diff > 10 * TOLERANCE["f16"], (family, label)


# --------------------------------------------------------------- pagedattn

@functools.lru_cache(maxsize=None)
def pagedattn_model(path):
    return core.GgufModel(path)


def check_logits(label, got, want, tolerance):
    """Top-1 agreement and max |error|. Where the reference's two best logits
    lie within 2 x tolerance of each other either is a correct top-1 under the
    bound, so there only "a reference top-1 up to the bound" is required."""
    assert got.shape == want.shape
    err = float(np.max(np.abs(got - want)))
    ref_top = np.argmax(want, axis=-1)
    got_top = np.argmax(got, axis=-1)
    srt = np.sort(want, axis=-1)
    gap = srt[:, -1] - srt[:, -2]
    clear = gap > 2 * tolerance
    agree = float(np.mean(got_top == ref_top))
    print(f"{label}: max |logit error| {err:.2e} (logits up to {np.max(np.abs(want)):.1f}), "
          f"top-1 agreement {agree:.4f}, {int(np.sum(~clear))} near-tie positions")
    assert np.all(got_top[clear] == ref_top[clear]), label
    chosen = np.take_along_axis(want, got_top[:, None], axis=-1)[:, 0]
    assert np.all(chosen >= srt[:, -1] - 2 * tolerance), label
    assert err < tolerance, label
    return err


@pytest.mark.parametrize("family", FAMILIES)
def test_pagedattn_logits_match_transformers(family, workdir):
    _, path = built(family, workdir)
    m = pagedattn_model(path)
    assert m.vocab_size == H.FAMILIES[family].config["vocab_size"]
    assert m.num_layers == H.FAMILIES[family].config["num_hidden_layers"]
    tokens = prompt_tokens(family)
    want = hf_logits(reference64(family, workdir), tokens)
    for kv_dtype, tolerance in TOLERANCE.items():
        got = np.asarray(m.logits(tokens, kv_dtype=kv_dtype), dtype=np.float64)
        check_logits(f"{family}, {kv_dtype} K/V, {len(tokens)} positions", got, want, tolerance)


@pytest.mark.parametrize("family", [f for f in FAMILIES if H.FAMILIES[f].arch == "deepseek2"])
def test_deepseek_serving_path_expands_prefill_and_matches_transformers(family, workdir):
    # exact=False: the serving path, where a prompt's latent attention runs
    # expanded per head (mla_form: fewer multiply-adds than absorbed for a
    # 64-token prompt); exact=True above runs absorbed (deterministic mode).
    _, path = built(family, workdir)
    m = pagedattn_model(path)
    tokens = prompt_tokens(family)
    want = hf_logits(reference64(family, workdir), tokens)
    for kv_dtype, tolerance in TOLERANCE.items():
        got = np.asarray(m.logits(tokens, kv_dtype=kv_dtype, exact=False), dtype=np.float64)
        check_logits(f"{family} serving path, {kv_dtype} K/V, {len(tokens)} positions", got, want,
                     tolerance)


def banned_next(seq):
    """HF's no_repeat_ngram_size=2: no bigram occurs twice (random models with
    tied embeddings otherwise repeat one token forever, which checks little)."""
    return {seq[i + 1] for i in range(len(seq) - 1) if seq[i] == seq[-1]}


def greedy_pick(logits, seq):
    logits = np.array(logits, dtype=np.float64)
    logits[list(banned_next(seq))] = -np.inf
    return logits


@pytest.mark.parametrize("family", FAMILIES)
def test_pagedattn_greedy_matches_transformers_generate(family, workdir):
    _, path = built(family, workdir)
    m = pagedattn_model(path)
    ref = reference64(family, workdir)
    prompt = prompt_tokens(family)[:GREEDY_PROMPT]
    gen_config = transformers.GenerationConfig(do_sample=False, max_new_tokens=GREEDY_STEPS,
                                               no_repeat_ngram_size=2, eos_token_id=None,
                                               pad_token_id=0)
    ref.generation_config.eos_token_id = None  # else the model's own EOS (2) may end it early
    with torch.no_grad():
        out = ref.generate(torch.tensor([prompt]), generation_config=gen_config)
    want = [int(t) for t in out[0, len(prompt):]]
    assert len(want) == GREEDY_STEPS
    got = []
    seq = list(prompt)
    for _ in range(GREEDY_STEPS):
        nxt = int(np.argmax(greedy_pick(m.logits(seq, kv_dtype="f32")[-1], seq)))
        got.append(nxt)
        seq.append(nxt)
    print(f"{family}: HF generate {want}\n{family}: pagedattn     {got}")
    if got != want:  # allowed only at a tie within the f32 bound
        i = next(j for j in range(GREEDY_STEPS) if got[j] != want[j])
        ctx = prompt + want[:i]
        ref_logits = greedy_pick(hf_logits(ref, ctx)[-1], ctx)
        gap = ref_logits[want[i]] - ref_logits[got[i]]
        assert gap < 2 * TOLERANCE["f32"], (family, i, got, want, gap)


@pytest.mark.parametrize("family", ["qwen2moe", "qwen3moe", "deepseek-v2-lite", "deepseek-v3"])
def test_tensor_parallel_generate_prints_the_single_process_text(family, workdir):
    # `generate --tensor-parallel 2` under mpirun: experts split by feature,
    # latent attention by query head (docs/tensor_parallel.md); greedy text
    # equal to one process's (the logits differ by summation order only;
    # tests/model/deepseek_gguf_test.cc checks them).
    import shutil
    import subprocess
    from test_engine import cli_path
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("no mpirun")
    _, path = built(family, workdir)
    args = [cli_path(), "generate", "--model", path, "--prompt", "the quick brown fox",
            "--max-tokens", "16", "--ignore-eos", "--kv-memory-mib", "16"]
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1",
               OMP_NUM_THREADS="1", OMPI_MCA_btl_vader_single_copy_mechanism="none")
    # Random weights print arbitrary bytes: compared as bytes.
    one = subprocess.run(args, env=env, capture_output=True, timeout=120)
    two = subprocess.run([mpirun, "--oversubscribe", "-np", "2"] + args + ["--tensor-parallel", "2"],
                         env=env, capture_output=True, timeout=300)
    assert one.returncode == 0, one.stderr.decode(errors="replace")
    assert two.returncode == 0, two.stderr.decode(errors="replace")
    assert one.stdout and two.stdout == one.stdout
    assert b"tensor parallel 2" in two.stderr


def test_unsupported_architecture_names_it(tmp_path):
    path = str(tmp_path / "falcon.gguf")
    H.write_unsupported_arch(path, "falcon")
    with pytest.raises(core.UnsupportedError, match="falcon"):
        core.GgufModel(path)
