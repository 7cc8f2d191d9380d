// Decoder hyper-parameters and tensor names read from a GGUF file.
//
// Architectures (general.architecture), all RMSNorm / RoPE / gated-MLP
// decoders that the built-in model runs:
//  * llama: Llama 2/3.x, SmolLM2, TinyLlama, Mistral/Ministral (a sliding
//    window when {arch}.attention.sliding_window is set); RoPE scaling
//    llama3 (rope_freqs.weight), linear, yarn.
//  * qwen2: adds q/k/v biases. qwen3: RMSNorm over each q and k head.
//  * gemma2: GELU-tanh gated MLP, norms after attention and MLP too,
//    embeddings scaled by sqrt(hidden), attention and final logit softcaps,
//    even layers windowed. gemma3 (text): q/k norms, five windowed layers
//    per global one, windowed layers on their own RoPE base, RoPE scaling on
//    global layers only.
//  * phi3: fused q|k|v (attn_qkv) and gate|up (ffn_up) weights.
//  * qwen2moe (Qwen1.5-MoE, Qwen2-57B-A14B): qwen2 with a mixture of experts
//    in every layer's MLP: a router (ffn_gate_inp), {arch}.expert_count
//    gated MLPs stacked in 3-D tensors (ffn_gate_exps / ffn_up_exps /
//    ffn_down_exps), {arch}.expert_used_count of them run per token with
//    their softmax weights as they are, plus a shared gated MLP (ffn_*_shexp)
//    scaled by sigmoid(x . ffn_gate_inp_shexp). qwen3moe (Qwen3-30B-A3B):
//    qwen3 with the routed experts only, their top-k weights renormalised to
//    sum 1 (llama.cpp's llm_build_qwen3moe; HF norm_topk_prob = true in
//    those checkpoints, while qwen2moe's is false).
//  * deepseek2 (DeepSeek-V2, V2-Lite, V2.5, V3 and their GGUF kin): multi-head
//    latent attention (MLA) and DeepSeek's mixture of experts. Per layer the
//    query comes from attn_q, or with {arch}.attention.q_lora_rank > 0 from
//    attn_q_b(rms_norm(attn_q_a(x))) (norm attn_q_a_norm); attn_kv_a_mqa
//    gives the latent (kv_lora_rank, normed by attn_kv_a_norm) and one
//    shared RoPE key part (rope.dimension_count wide). The per-head key and
//    value up-projections come either as the old single attn_kv_b
//    [kv_lora_rank, heads * (nope + v)] or as the split attn_k_b
//    {nope, kv_lora_rank, heads} and attn_v_b {kv_lora_rank, v, heads} that
//    llama.cpp's converter writes since its MLA change (with head_count_kv 1,
//    key_length = kv_lora_rank + rope, value_length = kv_lora_rank and the
//    per-head sizes in key_length_mla / value_length_mla). pagedattn runs the
//    absorbed form: the cache holds one KV head of [latent | rope key] per
//    token. The first leading_dense_block_count layers have a dense MLP; the
//    others route over expert_count experts (gating 1 softmax, 2 sigmoid with
//    the exp_probs_b selection bias), optionally within the best
//    expert_group_used_count of expert_group_count groups, weights
//    renormalised when expert_weights_norm and scaled by
//    expert_weights_scale, plus expert_shared_count ungated shared experts
//    (ffn_*_shexp). RoPE: interleaved pairs on the weights as stored.
//
// RoPE layout -- which pagedattn RopeStyle to use:
//  * llama: llama.cpp's converter (convert_hf_to_gguf.py, LlamaModel.permute)
//    reorders the rows of attn_q / attn_k within each head: row 2i + s of the
//    GGUF weight is HF row i + s * head_dim / 2 (reshape(n_head, 2, hd/2, ..)
//    .swapaxes(1, 2)). HF's rotate_half ("neox") pairs (i, i + hd/2) thereby
//    become adjacent pairs (2i, 2i + 1), and llama.cpp runs llama with its
//    normal rope mode (LLAMA_ROPE_TYPE_NORM), rotating adjacent pairs. So
//    with GGUF llama weights as stored, use the interleaved / GPT-J style
//    (RopeStyle::kGptJ); frequency of pair i is theta^(-2i / head_dim).
//  * qwen2: weights are not permuted and llama.cpp uses LLAMA_ROPE_TYPE_NEOX:
//    use the neox style (pairs (i, i + hd/2)).
// Either way the attention output is the same as HF's model for the same
// checkpoint; only the q/k feature order inside a head differs.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/gguf.h"

namespace pagedattn {

enum class GgufArch {
  kLlama,
  kQwen2,
  kQwen3,
  kGemma2,
  kGemma3,
  kPhi3,
  kQwen2Moe,
  kQwen3Moe,
  kDeepseek2
};

// How a router's logits become expert scores ("{arch}.expert_gating_func").
enum class GgufExpertGating { kSoftmax = 1, kSigmoid = 2 };

// The gated MLP's activation: silu(gate) * up, or gelu_tanh(gate) * up.
enum class GgufActivation { kSilu, kGeluTanh };

// How q/k pairs are rotated (see the header comment).
enum class GgufRopeLayout {
  kInterleaved,  // adjacent pairs (2i, 2i + 1): llama (pagedattn RopeStyle::kGptJ)
  kNeox,         // pairs (i, i + head_dim / 2): qwen2 (RopeStyle::kNeox)
};

struct GgufRopeScaling {
  std::string type = "none";                 // "{arch}.rope.scaling.type": none, linear, yarn
  float factor = 1.0f;                       // "{arch}.rope.scaling.factor" (1 when absent)
  std::int64_t original_context_length = 0;  // 0 when absent
  // YaRN ("{arch}.rope.scaling.yarn_beta_fast" / "yarn_beta_slow" /
  // "yarn_attn_factor"; Hugging Face's defaults when absent, 0: derived).
  float yarn_beta_fast = 32.0f;
  float yarn_beta_slow = 1.0f;
  float yarn_attention_factor = 0.0f;
  // Llama 3 style scaling is stored as per-frequency divisors in the F32
  // tensor "rope_freqs.weight" [head_dim / 2] (llama.cpp divides each pair's
  // frequency by its entry); empty when the file has none.
  std::string freq_factors_tensor;
  // Phi-3 LongRoPE: per-pair divisors for contexts beyond the original
  // ("rope_factors_long.weight") and within it ("rope_factors_short.weight"),
  // [rotary_dim / 2] each, and "{arch}.rope.scaling.attn_factor" (0 when
  // absent: sqrt(1 + ln(context / original) / ln(original))). Empty names:
  // no LongRoPE.
  std::string long_factors_tensor, short_factors_tensor;
  float attention_factor = 0.0f;
};

// Tensor names of one transformer block (ggml dims, [in, out]).
// Empty names: the file's architecture has no such tensor.
struct GgufLayerTensors {
  std::string attn_norm;    // [hidden]
  std::string attn_q;       // [hidden, heads * head_dim]
  std::string attn_k;       // [hidden, kv_heads * head_dim]
  std::string attn_v;       // [hidden, kv_heads * head_dim]
  std::string attn_qkv;     // phi3 instead of q, k, v: [hidden, (heads + 2 kv_heads) * head_dim]
  std::string attn_output;  // [heads * head_dim, hidden]
  // qwen2 biases ([heads * head_dim] / [kv_heads * head_dim]).
  std::string attn_q_bias, attn_k_bias, attn_v_bias;
  std::string attn_q_norm, attn_k_norm;  // qwen3, gemma3: [head_dim]
  std::string post_attention_norm;       // gemma2/3: [hidden]
  std::string ffn_norm;                  // [hidden]
  std::string ffn_gate;                  // [hidden, intermediate] (phi3: none)
  std::string ffn_up;    // [hidden, intermediate] (phi3: [hidden, 2 intermediate], gate first)
  std::string ffn_down;  // [intermediate, hidden]
  // Mixture of experts (qwen2moe, qwen3moe) instead of ffn_gate / ffn_up /
  // ffn_down (those names then empty).
  std::string ffn_gate_inp;                  // router: [hidden, experts]
  std::string ffn_gate_exps, ffn_up_exps;    // [hidden, expert_ff, experts]
  std::string ffn_down_exps;                 // [expert_ff, hidden, experts]
  std::string ffn_gate_inp_shexp;            // qwen2moe shared expert gate: [hidden] or [hidden, 1]
  std::string ffn_gate_shexp, ffn_up_shexp;  // qwen2moe: [hidden, shared_ff]
  std::string ffn_down_shexp;                // qwen2moe: [shared_ff, hidden]
  std::string post_ffw_norm;                 // gemma2/3: [hidden]
  // deepseek2 (multi-head latent attention; attn_q then [hidden, heads *
  // (nope + rope)] when q_lora_rank is 0, attn_output [heads * v, hidden]).
  std::string attn_q_a;        // [hidden, q_lora_rank]
  std::string attn_q_a_norm;   // [q_lora_rank]
  std::string attn_q_b;        // [q_lora_rank, heads * (nope + rope)]
  std::string attn_kv_a_mqa;   // [hidden, kv_lora_rank + rope]
  std::string attn_kv_a_norm;  // [kv_lora_rank]
  std::string attn_kv_b;       // [kv_lora_rank, heads * (nope + v)], or empty
  std::string attn_k_b;        // [nope, kv_lora_rank, heads] (split form), or empty
  std::string attn_v_b;        // [kv_lora_rank, v, heads] (split form), or empty
  std::string exp_probs_b;     // [experts]: sigmoid routing's selection bias, or empty
};

struct GgufModelConfig {
  GgufArch arch = GgufArch::kLlama;
  std::string arch_name;  // "llama" / "qwen2"
  std::string name;       // general.name, "" when absent
  std::int64_t num_layers = 0;
  std::int64_t hidden_size = 0;
  std::int64_t intermediate_size = 0;
  std::int64_t num_qo_heads = 0;
  std::int64_t num_kv_heads = 0;
  std::int64_t head_dim = 0;
  std::int64_t rotary_dim = 0;  // "{arch}.rope.dimension_count", else head_dim
  std::int64_t vocab_size = 0;
  std::int64_t context_length = 0;
  float rope_theta = 10000.0f;
  GgufRopeLayout rope_layout = GgufRopeLayout::kInterleaved;
  GgufRopeScaling rope_scaling;
  float rms_norm_eps = 1e-5f;
  // Per layer: 0 = global attention, W > 0 = a sliding window of W tokens
  // (a query sees itself and the W - 1 tokens before it, as Hugging Face's
  // sliding_window = W). [num_layers].
  std::vector<std::int64_t> layer_windows;
  // Windowed layers' RoPE base, unscaled (gemma3: "{arch}.rope.freq_base_swa",
  // else 10000); 0: windowed layers rotate as global ones.
  float rope_theta_windowed = 0.0f;
  float attention_scale = 0.0f;    // 0: 1 / sqrt(head_dim)
  float attention_softcap = 0.0f;  // gemma2: "{arch}.attn_logit_softcapping"
  float final_softcap = 0.0f;      // gemma2: "{arch}.final_logit_softcapping"
  float embedding_scale = 1.0f;    // gemma: sqrt(hidden_size)
  GgufActivation activation = GgufActivation::kSilu;
  bool tie_embeddings = false;     // no "output.weight": the LM head is token_embd
  std::int64_t bos_token_id = -1;  // -1 when absent
  std::int64_t eos_token_id = -1;
  // Mixture of experts; num_experts 0: a dense model.
  std::int64_t num_experts = 0;       // "{arch}.expert_count"
  std::int64_t num_experts_used = 0;  // "{arch}.expert_used_count"
  // "{arch}.expert_feed_forward_length", else intermediate_size /
  // num_experts_used (llama.cpp's fallback).
  std::int64_t expert_intermediate_size = 0;
  // qwen2moe: "{arch}.expert_shared_feed_forward_length", else
  // intermediate_size; 0 without a shared expert.
  std::int64_t shared_expert_intermediate_size = 0;
  bool normalize_expert_weights = false;  // qwen3moe: top-k weights renormalised
  // deepseek2's routing (the qwen families: softmax, scale 1, no groups).
  GgufExpertGating expert_gating = GgufExpertGating::kSoftmax;
  float expert_weights_scale = 1.0f;      // "{arch}.expert_weights_scale"
  std::int64_t expert_groups = 0;         // "{arch}.expert_group_count"; <= 1: no groups
  std::int64_t expert_groups_used = 0;    // "{arch}.expert_group_used_count"
  bool shared_expert_gated = false;       // qwen2moe: sigmoid(x . ffn_gate_inp_shexp)
  std::int64_t leading_dense_layers = 0;  // "{arch}.leading_dense_block_count"

  // Multi-head latent attention (deepseek2); kv_lora_rank 0: none. Then the
  // cache's shape is num_kv_heads 1 and head_dim kv_lora_rank + rotary_dim
  // (a latent row and the RoPE key), and attention_scale is
  // mscale^2 / sqrt(qk_nope_head_dim + rotary_dim), mscale being
  // 1 + rope.scaling.yarn_log_multiplier x ln(factor) under YaRN, else 1.
  std::int64_t q_lora_rank = 0;  // 0: attn_q
  std::int64_t kv_lora_rank = 0;
  std::int64_t qk_nope_head_dim = 0;
  std::int64_t v_head_dim = 0;  // per head, after attn_v_b / attn_kv_b

  std::string token_embedding = "token_embd.weight";  // [hidden, vocab]
  std::string output_norm = "output_norm.weight";     // [hidden]
  std::string output;  // [hidden, vocab]: "output.weight", or token_embedding when tied
  std::vector<GgufLayerTensors> layers;
};

// Reads and checks the configuration: every required key present with a
// sane value, every tensor present with the shape the hyper-parameters
// imply and a type dequantize_row supports. InvalidArgument naming the key
// or tensor; Unsupported naming it for another architecture or an unknown
// RoPE scaling type.
GgufModelConfig read_model_config(const GgufFile& file);

}  // namespace pagedattn
