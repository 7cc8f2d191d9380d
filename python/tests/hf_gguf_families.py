"""Small Hugging Face transformers models of each supported family, and their
GGUF files written the way llama.cpp's convert_hf_to_gguf.py writes them.

Used by test_model_families.py (which documents the conventions per family).
Everything here is built locally from seeded random weights: nothing is
downloaded.

The writer mirrors the converter (llama.cpp, `conversion/` package of
convert_hf_to_gguf.py as of 2025/2026):
  * TextModel.set_gguf_parameters (the base): block_count, context_length,
    embedding_length, feed_forward_length, attention.head_count(_kv),
    rope.freq_base, attention.layer_norm_rms_epsilon, key_length /
    value_length only when config.json has head_dim; RoPE scaling from
    rope_parameters["full_attention"] (or rope_parameters): linear -> type +
    factor; yarn -> type + factor + original_context_length (+ the optional
    yarn keys when given); llama3 -> nothing here (rope_freqs.weight);
    rope.freq_base_swa from rope_parameters["sliding_attention"].
  * LlamaModel (llama, also Mistral checkpoints): + vocab_size,
    rope.dimension_count; q/k rows permuted (LlamaModel.permute);
    rope_freqs.weight for llama3 scaling (generate_extra_tensors).
  * Qwen2Model / Qwen3Model: the base only; no permutation.
  * Gemma2Model: its own key list (no rope.freq_base), the two softcaps,
    sliding_window; +1 on every *norm.weight; no output.weight (tied).
  * Gemma3Model: the base + context_length, head_count, key/value_length,
    rope.freq_base (global layers), final softcap when set, sliding_window,
    head_count_kv; +1 on every *norm.weight.
  * Phi3MiniModel: its own key list (rope.scaling.original_context_length,
    rope.dimension_count, sliding_window = 0 when config has none); fused
    attn_qkv and ffn_up = [gate; up] as HF stores them.
  * Qwen2MoeModel (qwen2moe; Qwen3MoeModel, qwen3moe, inherits it): the base
    (which adds expert_count from num_experts and expert_used_count from
    num_experts_per_tok) + expert_feed_forward_length (moe_intermediate_size)
    and, when set, expert_shared_feed_forward_length; transformers 5's fused
    experts.gate_up_proj [E, 2I, H] split into ffn_gate_exps / ffn_up_exps
    (first I rows gate), experts.down_proj [E, H, I] -> ffn_down_exps. No
    norm_topk_prob key: llama.cpp's graph fixes it per architecture.
    shared_expert_gate.weight [1, H] -> ffn_gate_inp_shexp written 1-D [H],
    as converters that squeezed every tensor wrote it (the files on the hub;
    the current converter keeps [1, H], which pagedattn also reads, but
    transformers' GGUF loader expects 1-D).
  * DeepseekV2Model (deepseek2; DeepseekV3ForCausalLM converts through it
    too): hparams num_key_value_heads forced to 1 before the base (so
    head_count_kv 1), the base's expert_count / expert_used_count /
    expert_group_count (n_group) / expert_group_used_count (topk_group) /
    expert_gating_func (scoring_func: softmax 1, sigmoid 2), then
    leading_dense_block_count (first_k_dense_replace), vocab_size,
    q_lora_rank (when not None), kv_lora_rank, key_length = kv_lora_rank +
    qk_rope_head_dim, value_length = kv_lora_rank, key_length_mla =
    qk_nope + qk_rope, value_length_mla = v_head_dim,
    expert_feed_forward_length, expert_shared_count, expert_weights_scale
    (routed_scaling_factor), expert_weights_norm (only when norm_topk_prob),
    rope.dimension_count = qk_rope_head_dim, rope.scaling.yarn_log_multiplier
    = 0.1 mscale_all_dim. Tensors: kv_b_proj [H (nope + v), kv_lora] viewed
    [H, nope + v, kv_lora] and split: attn_k_b = the key rows transposed
    [H, kv_lora, nope], attn_v_b = the value rows [H, v, kv_lora]; V3's
    e_score_correction_bias -> exp_probs_b.bias. Families with
    kv_b_split=False write the converter's form before its MLA change:
    head_count_kv = the head count, key_length = nope + rope, value_length =
    v_head_dim, no *_mla keys, and attn_kv_b as HF stores it.
"""
from __future__ import annotations

import dataclasses
import math
import os

import numpy as np

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach a hub from the tests
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import gguf  # noqa: E402
import torch  # noqa: E402
import transformers  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Family:
    name: str
    arch: str              # general.architecture
    hf_class: str          # transformers model class
    config_class: str
    config: dict           # config kwargs
    gguf_name: str = ""    # general.name (transformers maps llama + "mistral" in it to Mistral)
    f16: bool = False      # write 2-D weights as F16 (convert_hf_to_gguf --outtype f16)
    # Whether transformers' own GGUF loader rebuilds the same model from the
    # file alone (its config mapping reads the keys this family needs).
    hf_reads_whole_config: bool = True
    hf_gap: str = ""       # why not, when it does not
    kv_b_split: bool = True  # deepseek2: attn_k_b + attn_v_b (else the old attn_kv_b)


COMMON = dict(vocab_size=384, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
              pad_token_id=0, rms_norm_eps=1e-6)

def phi3_longrope(name: str, original: int) -> Family:
    """Phi-3 with LongRoPE factors, served at context 128."""
    return Family(
        name, "phi3", "Phi3ForCausalLM", "Phi3Config",
        dict(COMMON, hidden_size=384, intermediate_size=512, num_hidden_layers=2,
             num_attention_heads=4, num_key_value_heads=4,
             original_max_position_embeddings=original, max_position_embeddings=128,
             rope_parameters=dict(rope_type="longrope", rope_theta=10000.0,
                                  original_max_position_embeddings=original,
                                  long_factor=[1.0 + 3.0 * i / 47 for i in range(48)],
                                  short_factor=[1.0 + 0.5 * i / 47 for i in range(48)]),
             tie_word_embeddings=False, rms_norm_eps=1e-5),
        hf_reads_whole_config=False,
        hf_gap="transformers' GGUF config mapping reads no LongRoPE factors")


NO_DEEPSEEK_GGUF = "transformers has no GGUF loader for deepseek2 (the test reads the file back itself)"


def deepseek(name: str, hf_class: str, config_class: str, **config) -> Family:
    """A DeepSeek family: hidden 256, 4 heads, nope 32 + rope 16, latent 64."""
    base = dict(COMMON, hidden_size=256, intermediate_size=512, num_attention_heads=4,
                num_key_value_heads=4, kv_lora_rank=64, qk_nope_head_dim=32,
                qk_rope_head_dim=16, first_k_dense_replace=1, moe_intermediate_size=64,
                tie_word_embeddings=False)
    split = config.pop("kv_b_split", True)
    return Family(name, "deepseek2", hf_class, config_class, dict(base, **config),
                  hf_reads_whole_config=False, hf_gap=NO_DEEPSEEK_GGUF, kv_b_split=split)


FAMILIES = {f.name: f for f in [
    Family("llama", "llama", "LlamaForCausalLM", "LlamaConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                tie_word_embeddings=False, rms_norm_eps=1e-5)),
    Family("llama-f16", "llama", "LlamaForCausalLM", "LlamaConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=64,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                tie_word_embeddings=False, rms_norm_eps=1e-5), f16=True),
    # Llama 3.2 style: head_dim 128, GQA 4:1, tied embeddings, llama3 scaling.
    # original_max_position_embeddings 256 (8192 in the real models) puts the
    # three bands (kept / smoothed / divided by 8) at wavelengths the test's
    # 64 positions feel; the converter reads it from the top level of
    # config.json (hparams, default 8192), so the config carries it there too.
    Family("llama3", "llama", "LlamaForCausalLM", "LlamaConfig",
           dict(COMMON, hidden_size=512, intermediate_size=1024, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, head_dim=128,
                rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, factor=8.0,
                                     low_freq_factor=1.0, high_freq_factor=4.0,
                                     original_max_position_embeddings=256),
                tie_word_embeddings=True, rms_norm_eps=1e-5),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no rope_freqs.weight / llama3 scaling"),
    Family("llama-linear", "llama", "LlamaForCausalLM", "LlamaConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4, head_dim=64,
                rope_parameters=dict(rope_type="linear", rope_theta=10000.0, factor=4.0),
                tie_word_embeddings=False),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no rope.scaling.* keys for llama"),
    # Qwen2.5-0.5B style: head_dim 64, GQA 7:1, q/k/v biases, tied embeddings.
    Family("qwen2", "qwen2", "Qwen2ForCausalLM", "Qwen2Config",
           dict(COMMON, hidden_size=448, intermediate_size=896, num_hidden_layers=2,
                num_attention_heads=7, num_key_value_heads=1,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=True)),
    # YaRN as Qwen2.5 long-context configs state it; original 32 makes the
    # ramp (pairs 0..4 of 32 between extrapolated and interpolated) matter.
    Family("qwen2-yarn", "qwen2", "Qwen2ForCausalLM", "Qwen2Config",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2,
                rope_parameters=dict(rope_type="yarn", rope_theta=1000000.0, factor=4.0,
                                     original_max_position_embeddings=32),
                max_position_embeddings=128, tie_word_embeddings=False),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no rope.scaling.* keys for qwen2"),
    # Qwen3-0.6B style: head_dim 128 with heads * head_dim != hidden, q/k norms.
    Family("qwen3", "qwen3", "Qwen3ForCausalLM", "Qwen3Config",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=128,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=True)),
    # Mistral 7B v0.1 style: llama arch, GQA 4:1, a sliding window on every layer.
    Family("mistral", "llama", "MistralForCausalLM", "MistralConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=1, head_dim=64,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                sliding_window=12, tie_word_embeddings=False, rms_norm_eps=1e-5),
           gguf_name="mistral-tiny-test",
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF mapping for llama/mistral reads no attention.sliding_window"),
    # Gemma 2 2B style: head_dim 256, GQA 2:1, softcaps 50 / 30, even layers windowed.
    Family("gemma2", "gemma2", "Gemma2ForCausalLM", "Gemma2Config",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=4,
                num_attention_heads=4, num_key_value_heads=2, head_dim=256,
                query_pre_attn_scalar=256, sliding_window=16,
                attn_logit_softcapping=50.0, final_logit_softcapping=30.0,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True)),
    # Gemma 3 1B/4B style: head_dim 256, GQA 4:1, q/k norms, 5 windowed layers
    # per global one (7 layers: the 7th is windowed again), local RoPE base
    # 10000, global base 1e6 with linear scaling 8 (the 4B+ models' values).
    Family("gemma3", "gemma3", "Gemma3ForCausalLM", "Gemma3TextConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=7,
                num_attention_heads=4, num_key_value_heads=1, head_dim=256,
                query_pre_attn_scalar=256, sliding_window=16,
                rope_parameters=dict(
                    full_attention=dict(rope_type="linear", factor=8.0, rope_theta=1000000.0),
                    sliding_attention=dict(rope_type="default", rope_theta=10000.0)),
                hidden_activation="gelu_pytorch_tanh", tie_word_embeddings=True),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no rope.scaling.* / freq_base_swa for gemma3"),
    # Phi-3-mini style: head_dim 96, MHA, no window, untied.
    Family("phi3", "phi3", "Phi3ForCausalLM", "Phi3Config",
           dict(COMMON, hidden_size=384, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=4,
                original_max_position_embeddings=2048,
                rope_parameters=dict(rope_type="default", rope_theta=10000.0),
                tie_word_embeddings=False, rms_norm_eps=1e-5)),
    # Phi-3.5-mini / Phi-3-128k style LongRoPE: per-pair divisors for
    # contexts past the original (long) and within it (short), cos and sin
    # scaled by sqrt(1 + ln(context / original) / ln(original)). HF picks the
    # long factors while the sequence is longer than the original context:
    # with original 16 every prompt of the tests (32 and 64 tokens) runs on
    # them from its first token, as pagedattn does for a served context (128)
    # beyond the original.
    phi3_longrope("phi3-longrope", original=16),
    # The same within the original context (128 = the served context): the
    # short factors, attention factor 1.
    phi3_longrope("phi3-longrope-short", original=128),
    # Qwen1.5-MoE-A2.7B style: qwen2 attention (q/k/v biases), 8 experts of
    # width 128, top-2 weights as softmax gives them (norm_topk_prob false),
    # a shared expert of width 384 behind a sigmoid gate; untied.
    Family("qwen2moe", "qwen2moe", "Qwen2MoeForCausalLM", "Qwen2MoeConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, num_experts=8,
                num_experts_per_tok=2, moe_intermediate_size=128,
                shared_expert_intermediate_size=384, norm_topk_prob=False,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=False),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no expert_feed_forward_length / "
                  "expert_shared_feed_forward_length for qwen2moe"),
    # Qwen3-30B-A3B style: qwen3 attention (q/k norms, head_dim 128), 16
    # experts of width 64, top-4 renormalised to sum 1 (norm_topk_prob true,
    # as llama.cpp's qwen3moe graph assumes); tied.
    Family("qwen3moe", "qwen3moe", "Qwen3MoeForCausalLM", "Qwen3MoeConfig",
           dict(COMMON, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=128, num_experts=16,
                num_experts_per_tok=4, moe_intermediate_size=64, norm_topk_prob=True,
                rope_parameters=dict(rope_type="default", rope_theta=1000000.0),
                tie_word_embeddings=True),
           hf_reads_whole_config=False,
           hf_gap="transformers' GGUF config mapping reads no expert_feed_forward_length for qwen3moe"),
    # DeepSeek-V2-Lite style: no q compression (one attn_q), 8 experts of
    # width 64 (top-2 by softmax, weights as they are), 2 shared experts
    # (one of width 128), layer 0 dense; the current converter's split
    # attn_k_b / attn_v_b.
    deepseek("deepseek-v2-lite", "DeepseekV2ForCausalLM", "DeepseekV2Config",
             num_hidden_layers=2, q_lora_rank=None, v_head_dim=32, n_routed_experts=8,
             num_experts_per_tok=2, n_shared_experts=2, topk_method="greedy", n_group=1,
             topk_group=1, routed_scaling_factor=1.0, norm_topk_prob=False,
             rope_parameters=dict(rope_type="default", rope_theta=10000.0)),
    # DeepSeek-V2 style in the old single attn_kv_b form: q through a rank-96
    # bottleneck, softmax routing limited to the best of 4 groups of 2 (a
    # group's score: its best expert; both its experts then run), weights x 2, YaRN factor 4 from 32
    # positions with mscale = mscale_all_dim = 0.707 (cos/sin unscaled,
    # softmax scale x (1 + 0.0707 ln 4)^2).
    deepseek("deepseek-v2-kvb", "DeepseekV2ForCausalLM", "DeepseekV2Config",
             num_hidden_layers=2, q_lora_rank=96, v_head_dim=32, n_routed_experts=8,
             num_experts_per_tok=2, n_shared_experts=1, topk_method="group_limited_greedy",
             n_group=4, topk_group=1, routed_scaling_factor=2.0, norm_topk_prob=False,
             max_position_embeddings=128, kv_b_split=False,
             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                  original_max_position_embeddings=32, mscale=0.707,
                                  mscale_all_dim=0.707, beta_fast=32.0, beta_slow=1.0)),
    # DeepSeek-V3 style: q bottleneck 96, v_head_dim 48, 16 experts top-4 by
    # sigmoid + e_score_correction_bias within the best 2 of 4 groups (a
    # group's score: the sum of its best two), renormalised, x 2.5, one
    # shared expert; YaRN factor 4 with mscale = mscale_all_dim = 1.
    deepseek("deepseek-v3", "DeepseekV3ForCausalLM", "DeepseekV3Config",
             num_hidden_layers=3, q_lora_rank=96, v_head_dim=48, n_routed_experts=16,
             num_experts_per_tok=4, n_shared_experts=1, n_group=4, topk_group=2,
             routed_scaling_factor=2.5, norm_topk_prob=True, max_position_embeddings=128,
             rope_interleave=True,
             rope_parameters=dict(rope_type="yarn", rope_theta=10000.0, factor=4.0,
                                  original_max_position_embeddings=32, mscale=1.0,
                                  mscale_all_dim=1.0, beta_fast=32.0, beta_slow=1.0)),
]}


def make_config(family: Family):
    cls = getattr(transformers, family.config_class)
    config = cls(**family.config)
    if family.name == "llama3":  # where the converter reads it (hparams top level)
        config.original_max_position_embeddings = family.config["rope_parameters"][
            "original_max_position_embeddings"]
    return config


def is_gemma(family: Family) -> bool:
    return family.arch in ("gemma2", "gemma3")


def is_moe(family: Family) -> bool:
    return family.arch in ("qwen2moe", "qwen3moe", "deepseek2")


def build_model(family: Family, seed: int = 0):
    """The float32 eager HF model with seeded random weights scaled so that
    activations and logits are O(1-10)."""
    config = make_config(family)
    cls = getattr(transformers, family.hf_class)
    torch.manual_seed(seed)
    # MoE: the experts' plain per-expert loop, which runs in float64 too
    # (transformers' default grouped_mm takes float32/bf16/f16 only).
    extra = dict(experts_implementation="eager") if is_moe(family) else {}
    model = cls._from_config(config, attn_implementation="eager", dtype=torch.float32, **extra)
    gen = torch.Generator().manual_seed(seed + 1)

    def normal(shape, std):
        return torch.randn(shape, generator=gen, dtype=torch.float32) * std

    hidden = config.hidden_size
    tied = config.tie_word_embeddings
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                # RMSNorm scales around 1; Gemma stores w for a (1 + w) scale.
                p.copy_(normal(p.shape, 0.2) + (0.0 if is_gemma(family) else 1.0))
            elif name.endswith("embed_tokens.weight"):
                if is_gemma(family):  # scaled by sqrt(hidden) on input, tied output
                    p.copy_(normal(p.shape, 3.0 / math.sqrt(hidden)))
                elif tied:
                    p.copy_(normal(p.shape, 3.0 / math.sqrt(hidden)))
                else:
                    p.copy_(normal(p.shape, 1.0))
            elif name == "lm_head.weight":
                p.copy_(normal(p.shape, 3.0 / math.sqrt(hidden)))
            elif name.endswith(".bias"):
                p.copy_(normal(p.shape, 0.5))
            elif p.dim() == 3:  # fused experts [E, out, in]
                p.copy_(normal(p.shape, 1.0 / math.sqrt(p.shape[2])))
            elif p.dim() == 2:
                scale = 1.0
                if any(s in name for s in ("q_proj", "k_proj", "qkv_proj")):
                    # gemma2: scores up to ~50, where its attention softcap (50) bites
                    scale = 3.5 if family.arch == "gemma2" else 1.5
                p.copy_(normal(p.shape, scale / math.sqrt(p.shape[1])))
            else:
                raise AssertionError(f"unexpected parameter {name} {tuple(p.shape)}")
            if family.f16 and p.dim() == 2:  # the file holds these as F16: round once here
                p.copy_(p.to(torch.float16).to(torch.float32))
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):  # V3: moves the choice, not the weights
                b.copy_(normal(b.shape, 0.1))
    model.eval()
    return model


# ---------------------------------------------------------------- GGUF writer

def llama_permute(w: np.ndarray, n_head: int, n_head_kv: int | None) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.permute."""
    if n_head_kv is not None and n_head != n_head_kv:
        n_head = n_head_kv
    return (w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:])
            .swapaxes(1, 2).reshape(w.shape))


def llama3_rope_factors(config) -> np.ndarray:
    """convert_hf_to_gguf.py LlamaModel.generate_extra_tensors (rope_freqs.weight)."""
    rope = config.rope_parameters
    base = rope.get("rope_theta", 10000.0)
    dim = config.head_dim or config.hidden_size // config.num_attention_heads
    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    factor = rope.get("factor", 8.0)
    low_freq_factor = rope.get("low_freq_factor", 1.0)
    high_freq_factor = rope.get("high_freq_factor", 4.0)
    old_context_len = getattr(config, "original_max_position_embeddings", 8192)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    factors = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_freq_wavelen:
            factors.append(1)
        elif wavelen > low_freq_wavelen:
            factors.append(factor)
        else:
            smooth = (old_context_len / wavelen - low_freq_factor) / (high_freq_factor - low_freq_factor)
            factors.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(factors, dtype=torch.float32).numpy()


def byte_level_vocab(vocab_size: int):
    """A GPT-2 byte-level BPE vocabulary of exactly vocab_size tokens: 3
    specials, the 256 byte tokens, then merged letter pairs."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + \
        list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_tokens = [chr(c) for _, c in sorted(zip(bs, cs))]
    tokens = ["<|pad|>", "<|bos|>", "<|eos|>"] + byte_tokens
    types = [gguf.TokenType.CONTROL] * 3 + [gguf.TokenType.NORMAL] * 256
    merges = []
    letters = "etaoinshrdlucmfwypvbgkqjxz"
    firsts = ["Ġ"] + list(letters)
    for a in firsts:
        for b in letters:
            if len(tokens) >= vocab_size:
                break
            merges.append(f"{a} {b}")
            tokens.append(a + b)
            types.append(gguf.TokenType.NORMAL)
    assert len(tokens) == vocab_size, (len(tokens), vocab_size)
    return tokens, types, merges


def deepseek_tensor(family: Family, hf_name: str, data: np.ndarray, out: list) -> bool:
    """DeepseekV2Model.modify_tensors' own cases; False: the generic mapping."""
    layer = hf_name.split(".")[2] if hf_name.startswith("model.layers.") else None
    if hf_name.endswith("mlp.gate.e_score_correction_bias"):
        out.append((f"blk.{layer}.exp_probs_b.bias", data))
        return True
    if hf_name.endswith("self_attn.kv_b_proj.weight") and family.kv_b_split:
        c = family.config
        heads, nope, v = c["num_attention_heads"], c["qk_nope_head_dim"], c["v_head_dim"]
        kv_b = data.reshape(heads, nope + v, data.shape[-1])
        out.append((f"blk.{layer}.attn_k_b.weight",
                    np.ascontiguousarray(kv_b[:, :nope, :].transpose(0, 2, 1))))
        out.append((f"blk.{layer}.attn_v_b.weight", np.ascontiguousarray(kv_b[:, nope:, :])))
        return True
    return False


def gguf_tensors(family: Family, model) -> list[tuple[str, np.ndarray]]:
    """(GGUF name, float32 array [out][in]) in the converter's conventions."""
    config = model.config
    arch_enum = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == family.arch)
    name_map = gguf.get_tensor_name_map(arch_enum, config.num_hidden_layers)
    n_head, n_kv = config.num_attention_heads, config.num_key_value_heads
    out = []
    for hf_name, t in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue  # tied: llama.cpp reads token_embd for the output
        if "rotary_emb" in hf_name:
            continue
        data = t.detach().to(torch.float32).numpy().copy()
        if family.arch == "deepseek2" and deepseek_tensor(family, hf_name, data, out):
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        if stem.endswith("mlp.experts"):  # Qwen2MoeModel.modify_tensors
            n_ff = data.shape[1] // 2
            parts = ([("gate_proj", data[:, :n_ff]), ("up_proj", data[:, n_ff:])]
                     if suffix == "gate_up_proj" else [(suffix, data)])
            for part, array in parts:
                name = name_map.get_name(f"{stem}.{part}")
                assert name is not None, f"{family.name}: no GGUF name for {stem}.{part}"
                out.append((f"{name}.weight", np.ascontiguousarray(array)))
            continue
        if stem.endswith("shared_expert_gate"):
            data = data.reshape(-1)  # 1-D, see the module docstring
        if family.arch == "llama":
            if stem.endswith("q_proj"):
                data = llama_permute(data, n_head, n_head)
            elif stem.endswith("k_proj"):
                data = llama_permute(data, n_head, n_kv)
        if is_gemma(family) and hf_name.endswith("norm.weight"):
            data = data + np.float32(1.0)
        name = name_map.get_name(stem)
        assert name is not None, f"{family.name}: no GGUF name for {hf_name}"
        out.append((f"{name}.{suffix}", data))
    if family.arch == "llama" and config.rope_parameters.get("rope_type") == "llama3":
        out.append(("rope_freqs.weight", llama3_rope_factors(config)))
    if config.rope_parameters.get("rope_type") == "longrope":
        for which in ("long", "short"):
            out.append((f"rope_factors_{which}.weight",
                        np.asarray(config.rope_parameters[f"{which}_factor"], dtype=np.float32)))
    return out


def write_deepseek_keys(family: Family, config, w) -> None:
    """TextModel.set_gguf_parameters with num_key_value_heads forced to 1,
    then DeepseekV2Model.set_gguf_parameters (see the module docstring)."""
    c = family.config
    rope = config.rope_parameters
    w.add_block_count(config.num_hidden_layers)
    w.add_context_length(config.max_position_embeddings)
    w.add_embedding_length(config.hidden_size)
    w.add_feed_forward_length(config.intermediate_size)
    w.add_head_count(config.num_attention_heads)
    w.add_head_count_kv(1 if family.kv_b_split else config.num_attention_heads)
    if rope.get("rope_type") == "yarn":
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rope["factor"])
        w.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        w.add_rope_scaling_yarn_beta_fast(rope["beta_fast"])
        w.add_rope_scaling_yarn_beta_slow(rope["beta_slow"])
    w.add_rope_freq_base(rope["rope_theta"])
    w.add_layer_norm_rms_eps(config.rms_norm_eps)
    w.add_expert_count(c["n_routed_experts"])
    w.add_expert_used_count(c["num_experts_per_tok"])
    w.add_expert_group_count(c["n_group"])
    w.add_expert_group_used_count(c["topk_group"])
    sigmoid = family.hf_class == "DeepseekV3ForCausalLM"  # config.json scoring_func
    w.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID if sigmoid
                             else gguf.ExpertGatingFuncType.SOFTMAX)
    w.add_leading_dense_block_count(c["first_k_dense_replace"])
    w.add_vocab_size(config.vocab_size)
    if c["q_lora_rank"] is not None:
        w.add_q_lora_rank(c["q_lora_rank"])
    kv_lora, rope_dim, nope = c["kv_lora_rank"], c["qk_rope_head_dim"], c["qk_nope_head_dim"]
    w.add_kv_lora_rank(kv_lora)
    if family.kv_b_split:
        w.add_key_length(kv_lora + rope_dim)
        w.add_value_length(kv_lora)
        w.add_key_length_mla(nope + rope_dim)
        w.add_value_length_mla(c["v_head_dim"])
    else:
        w.add_key_length(nope + rope_dim)
        w.add_value_length(c["v_head_dim"])
    w.add_expert_feed_forward_length(c["moe_intermediate_size"])
    w.add_expert_shared_count(c["n_shared_experts"])
    w.add_expert_weights_scale(c["routed_scaling_factor"])
    if c["norm_topk_prob"]:
        w.add_expert_weights_norm(True)
    w.add_rope_dimension_count(rope_dim)
    if rope.get("mscale_all_dim") is not None:
        w.add_rope_scaling_yarn_log_mul(0.1 * rope["mscale_all_dim"])


def write_gguf(family: Family, model, path: str) -> None:
    config = model.config
    hp = config.to_dict()
    arch = family.arch
    w = gguf.GGUFWriter(path, arch)
    w.add_name(family.gguf_name or f"{family.name}-tiny-test")
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if family.f16 else gguf.LlamaFileType.ALL_F32)
    rope = config.rope_parameters
    full_rope = rope.get("full_attention", rope)
    head_dim = hp.get("head_dim")

    if arch in ("llama", "qwen2", "qwen3", "gemma3", "qwen2moe", "qwen3moe"):  # TextModel.set_gguf_parameters
        w.add_block_count(config.num_hidden_layers)
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        rope_type = full_rope.get("rope_type")
        if rope_type == "linear":
            w.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
            w.add_rope_scaling_factor(full_rope["factor"])
        elif rope_type == "yarn":
            w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
            w.add_rope_scaling_factor(full_rope["factor"])
            w.add_rope_scaling_orig_ctx_len(full_rope["original_max_position_embeddings"])
            for key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                             ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                             ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                             ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
                if full_rope.get(key) is not None:
                    add(full_rope[key])
        w.add_rope_freq_base(full_rope["rope_theta"])
        if "sliding_attention" in rope:
            w.add_rope_freq_base_swa(rope["sliding_attention"]["rope_theta"])
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        if head_dim is not None:
            w.add_key_length(head_dim)
            w.add_value_length(head_dim)
    if arch in ("qwen2moe", "qwen3moe"):  # the base's expert counts, then Qwen2MoeModel's
        w.add_expert_count(config.num_experts)
        w.add_expert_used_count(config.num_experts_per_tok)
        w.add_expert_feed_forward_length(config.moe_intermediate_size)
        if getattr(config, "shared_expert_intermediate_size", None) is not None:
            w.add_expert_shared_feed_forward_length(config.shared_expert_intermediate_size)
    if arch == "llama":  # LlamaModel.set_gguf_parameters
        w.add_vocab_size(config.vocab_size)
        w.add_rope_dimension_count(head_dim or config.hidden_size // config.num_attention_heads)
        if getattr(config, "sliding_window", None):
            # Not written by llama.cpp's converter for llama/Mistral (llama.cpp
            # runs llama without a window); pagedattn reads it when present.
            w.add_sliding_window(config.sliding_window)
    elif arch == "gemma2":  # Gemma2Model.set_gguf_parameters
        w.add_context_length(config.max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_key_length(config.head_dim)
        w.add_value_length(config.head_dim)
        w.add_attn_logit_softcapping(config.attn_logit_softcapping)
        w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)
    elif arch == "gemma3":  # Gemma3Model.set_gguf_parameters, after the base
        assert config.attn_logit_softcapping is None
        if config.final_logit_softcapping:
            w.add_final_logit_softcapping(config.final_logit_softcapping)
        w.add_sliding_window(config.sliding_window)
    elif arch == "deepseek2":
        write_deepseek_keys(family, config, w)
    elif arch == "phi3":  # Phi3MiniModel.set_gguf_parameters
        partial = full_rope.get("partial_rotary_factor", 1.0)
        w.add_context_length(config.max_position_embeddings)
        w.add_rope_scaling_orig_ctx_len(config.original_max_position_embeddings)
        w.add_embedding_length(config.hidden_size)
        w.add_feed_forward_length(config.intermediate_size)
        w.add_block_count(config.num_hidden_layers)
        w.add_head_count(config.num_attention_heads)
        w.add_head_count_kv(config.num_key_value_heads)
        w.add_layer_norm_rms_eps(config.rms_norm_eps)
        w.add_rope_dimension_count(int(partial * config.hidden_size) // config.num_attention_heads)
        w.add_rope_freq_base(full_rope["rope_theta"])
        w.add_sliding_window(config.sliding_window or 0)
        if full_rope.get("rope_type") == "longrope":  # Phi3MiniModel: attn factor + factor tensors
            original = config.original_max_position_embeddings
            scale = config.max_position_embeddings / original
            w.add_rope_scaling_attn_factors(
                1.0 if scale <= 1.0 else math.sqrt(1 + math.log(scale) / math.log(original)))

    tokens, types, merges = byte_level_vocab(config.vocab_size)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(config.bos_token_id)
    w.add_eos_token_id(config.eos_token_id)
    w.add_pad_token_id(config.pad_token_id)

    for name, data in gguf_tensors(family, model):
        if family.f16 and data.ndim == 2:  # --outtype f16: 1-D tensors stay F32
            w.add_tensor(name, data.astype(np.float16))
        else:
            w.add_tensor(name, data.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def write_unsupported_arch(path: str, arch: str = "falcon") -> None:
    """A small, otherwise well-formed GGUF file of an architecture pagedattn
    does not run (falcon: LayerNorm, parallel attention/MLP, fused qkv)."""
    w = gguf.GGUFWriter(path, arch)
    w.add_name(f"{arch}-tiny-test")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(256)
    w.add_head_count(4)
    w.add_head_count_kv(1)
    w.add_layer_norm_eps(1e-5)
    tokens, types, merges = byte_level_vocab(288)
    w.add_tokenizer_model("gpt2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    rng = np.random.default_rng(0)
    for name, shape in [("token_embd.weight", (288, 64)), ("output_norm.weight", (64,)),
                        ("output_norm.bias", (64,)), ("blk.0.attn_norm.weight", (64,)),
                        ("blk.0.attn_norm.bias", (64,)), ("blk.0.attn_qkv.weight", (96, 64)),
                        ("blk.0.attn_output.weight", (64, 64)), ("blk.0.ffn_up.weight", (256, 64)),
                        ("blk.0.ffn_down.weight", (64, 256))]:
        w.add_tensor(name, rng.standard_normal(shape).astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
