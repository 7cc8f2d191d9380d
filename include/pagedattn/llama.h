// The built-in decoder model: Llama's architecture (RMSNorm, fused QKV
// projection with GQA, RoPE, paged attention through
// PagedKVCache::attention_with_fused_qkv, output projection, gated MLP, LM
// head) and the variants of the GGUF families (q/k norms, norms after
// attention and MLP, GELU-tanh, per-layer sliding windows and RoPE bases,
// softcaps, RoPE scaling). Presets draw seeded synthetic weights (outputs
// deterministic but meaningless); make_gguf_model loads a file's weights.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>

#include <vector>

#include "pagedattn/model.h"
#include "pagedattn/tensor_parallel_shard.h"

namespace pagedattn {

class GgufFile;

// The gated MLP's activation: act(gate) * up.
enum class MlpActivation : std::uint8_t { kSilu = 0, kGeluTanh = 1 };

// How a MoE router's logits become expert scores.
enum class ExpertGating : std::uint8_t {
  kSoftmax = 0,  // softmax over the experts (qwen2moe, qwen3moe, DeepSeek-V2)
  kSigmoid = 1,  // sigmoid per expert, chosen by score + selection bias (DeepSeek-V3)
};

struct LlamaConfig {
  std::string name = "tiny";
  std::int32_t vocab_size = 1024;
  std::int32_t hidden_size = 256;
  std::int32_t intermediate_size = 688;
  std::int32_t num_layers = 4;
  std::int32_t num_qo_heads = 4;
  std::int32_t num_kv_heads = 2;
  std::int32_t head_dim = 64;
  RopeStyle rope_style = RopeStyle::kNeox;  // GGUF `llama` files: kGptJ (pairs 2t, 2t + 1)
  float rope_theta = 10000.0f;
  float llama3_rope_factor = 0.0f;  // > 0: Llama-3 RoPE scaling (low 1, high 4, original 8192)
  float rms_norm_eps = 1e-5f;
  std::int32_t max_position = 4096;
  bool tie_embeddings = true;  // LM head = embedding matrix (Llama-3.2)
  std::int32_t eos_token_id = 2;
  std::uint64_t weight_seed = 0x5eed;

  // Architecture variants (the GGUF families); the defaults are plain Llama.
  std::int32_t rotary_dim = 0;           // 0: head_dim
  float rope_scale = 1.0f;               // linear RoPE scaling: every frequency x rope_scale
  RopeYarnScaling rope_yarn;             // off while factor is 0
  std::vector<float> rope_freq_factors;  // [rotary_dim / 2] frequency divisors, or empty
  float rope_attention_factor = 1.0f;    // RoPE's cos and sin x this (LongRoPE)
  // [num_layers]: 0 = global attention, W > 0 = a sliding window of W tokens
  // (a query sees itself and the W - 1 before it). Empty: every layer global.
  std::vector<std::int32_t> layer_windows;
  float rope_theta_windowed = 0.0f;  // > 0: windowed layers' RoPE base, unscaled (Gemma 3)
  bool qk_norm = false;              // RMSNorm over each q and k head before RoPE (Qwen3, Gemma 3)
  bool sandwich_norms = false;       // RMSNorm of attention and MLP outputs before the residual add
  MlpActivation activation = MlpActivation::kSilu;
  float embedding_scale = 1.0f;    // embeddings x this (Gemma: sqrt(hidden_size))
  float attention_scale = 0.0f;    // 0: 1 / sqrt(head_dim)
  float attention_softcap = 0.0f;  // > 0: scores s -> cap tanh(s / cap) (Gemma 2)
  float final_softcap = 0.0f;      // > 0: logits capped the same way (Gemma 2)
  // Mixture of experts (GGUF qwen2moe, qwen3moe): with num_experts > 0 every
  // layer's MLP is a router over num_experts gated MLPs of width
  // expert_intermediate_size, of which each token runs num_experts_used
  // (softmax over the router logits, the top num_experts_used weights,
  // renormalised to sum 1 when normalize_expert_weights), plus with
  // shared_expert_intermediate_size > 0 a shared gated MLP of that width
  // scaled by sigmoid(x . gate) (qwen2moe). intermediate_size is then unused
  // by the layers (but by deepseek2's leading dense layers). Under tensor
  // parallelism every rank routes each token and holds a 1 / shard.size
  // slice of every expert's intermediate features.
  std::int32_t num_experts = 0;
  std::int32_t num_experts_used = 0;
  std::int32_t expert_intermediate_size = 0;
  std::int32_t shared_expert_intermediate_size = 0;
  bool normalize_expert_weights = false;
  // DeepSeek's routing (GGUF deepseek2). Scores are softmax or sigmoid of
  // the router logits; the top num_experts_used by score (sigmoid: score +
  // the layer's selection bias) are chosen, with expert_groups > 1 only
  // among the experts of the expert_groups_used best groups (a group's
  // score: its best expert's under softmax, its best two's sum under
  // sigmoid); their scores, renormalised when normalize_expert_weights,
  // times expert_weights_scale, weight them. The shared expert is scaled
  // by sigmoid(x . gate) when shared_expert_gated (qwen2moe), else added as
  // it is. The first leading_dense_layers layers have a dense MLP of width
  // intermediate_size instead.
  ExpertGating expert_gating = ExpertGating::kSoftmax;
  float expert_weights_scale = 1.0f;
  std::int32_t expert_groups = 0;
  std::int32_t expert_groups_used = 0;
  bool shared_expert_gated = true;
  std::int32_t leading_dense_layers = 0;
  // Multi-head latent attention (GGUF deepseek2) when kv_lora_rank > 0: each
  // head's query is qk_nope_head_dim + rotary_dim wide (from the hidden
  // state, or through a q_lora_rank bottleneck when q_lora_rank > 0); keys
  // and values come from one shared latent of kv_lora_rank (RMS-normed) and
  // one shared RoPE key of rotary_dim. The model runs the absorbed form:
  // the cache holds one KV head (num_kv_heads must be 1) of head_dim =
  // kv_lora_rank + rotary_dim per token, the value being its first
  // kv_lora_rank elements; each head's output is up-projected to
  // v_head_dim. attention_scale 0 then means 1 / sqrt(qk_nope_head_dim +
  // rotary_dim). Weights come from a GGUF file only (no synthetic draw).
  std::int32_t q_lora_rank = 0;
  std::int32_t kv_lora_rank = 0;
  std::int32_t qk_nope_head_dim = 0;
  std::int32_t v_head_dim = 0;
  // Tensor parallelism: the slice this process computes (see
  // tensor_parallel_shard.h). Every field above describes the whole model;
  // the model's spec() reports this shard's head counts. num_qo_heads, the
  // intermediate sizes of the layers that have them (dense, expert,
  // shared expert) must be multiples of shard.size, and num_kv_heads a
  // multiple or divisor of it (latent attention's one KV head is on every
  // rank).
  TensorParallelShard shard{};
};

// Presets: "tiny" (fast demo, ~3M parameters), "small" (~100M), "1b"
// (Llama-3.2-1B shapes, ~1.2B parameters, ~5 GB of f32 weights).
// InvalidArgument for any other name.
LlamaConfig llama_preset(std::string_view name);
std::int64_t llama_parameter_count(const LlamaConfig& config);

// Builds the model and draws its weights (seeded, so two builds are equal).
// With config.shard.size > 1: draws the whole model's weights and keeps the
// shard's slice, so the shards of one config add up to its whole model.
std::unique_ptr<Model> make_llama_model(const LlamaConfig& config);

struct GgufModelOptions {
  std::int32_t max_position = 0;  // longest sequence; 0: the file's context length
  // Tensor parallelism (see LlamaConfig.shard). Quantised weights also need
  // the shard's attention-output and down-projection input columns
  // (num_qo_heads / size x head_dim, intermediate_size / size) to be whole
  // blocks: 32 weights for Q8_0 / Q4_0 / Q4_1, 256 for the K-quants.
  TensorParallelShard shard{};
  // Scan every tensor of the file for NaN and infinity before loading
  // (decoded values, so a quantised block's non-finite f16 scale shows):
  // InvalidArgument naming the tensor and its first bad element. Off by
  // default: it reads and decodes every weight once more.
  bool check_tensors = false;
};

// Loads a GGUF decoder (architectures llama, qwen2, qwen3, gemma2, gemma3,
// phi3, qwen2moe, qwen3moe, deepseek2, see gguf_model.h; weights F32, F16, BF16, Q8_0,
// Q4_0, Q4_1, Q4_K, Q5_K, Q6_K). Quantised weights the in-place kernels read are kept as
// stored; the other types are dequantised to f32 at load. InvalidArgument /
// Unsupported naming the file and the key or tensor for a file that cannot
// be served.
std::unique_ptr<Model> make_gguf_model(const std::string& path,
                                       const GgufModelOptions& options = {});
// The same from an open file (weights are copied out of it: the file may close).
std::unique_ptr<Model> make_gguf_model(const GgufFile& file, const GgufModelOptions& options = {});

}  // namespace pagedattn
