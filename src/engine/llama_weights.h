// The built-in Llama model's weights, whatever their source (seeded
// synthetic draws or a GGUF file), and the factory that takes them.
#pragma once

#include <memory>
#include <vector>

#include "engine/stacked_matrix.h"
#include "engine/weight_matrix.h"
#include "pagedattn/llama.h"

namespace pagedattn::engine {

// Optional vectors are empty when the architecture has none.
struct LlamaLayerWeights {
  std::vector<float> attn_norm;       // [H]
  StackedMatrix qkv;                  // [(Hq + 2 Hkv) D][H]: q heads, k heads, v heads
  std::vector<float> qkv_bias;        // [(Hq + 2 Hkv) D] (Qwen2), or empty
  std::vector<float> q_norm;          // [D] (config.qk_norm)
  std::vector<float> k_norm;          // [D] (config.qk_norm)
  WeightMatrix o;                     // [H][Hq D]
  std::vector<float> post_attn_norm;  // [H] (config.sandwich_norms)
  std::vector<float> mlp_norm;        // [H]
  StackedMatrix gate_up;              // [2 I][H]: gate rows, then up rows
  WeightMatrix down;                  // [H][I]
  std::vector<float> post_mlp_norm;   // [H] (config.sandwich_norms)
};

struct LlamaWeights {
  WeightMatrix embedding;                 // [V][H]
  WeightMatrix lm_head;                   // [V][H]; empty when tied to the embedding
  std::vector<float> final_norm;          // [H]
  std::vector<LlamaLayerWeights> layers;  // [num_layers]
};

// InvalidArgument naming the field when the whole-model config cannot be
// split `shard.size` ways (heads or intermediate size not divisible).
void validate_shard(const LlamaConfig& config);
// Keeps only config.shard's slice of every split matrix (whole-model
// weights in, shard weights out; replicated tensors untouched).
void shard_llama_weights(const LlamaConfig& config, LlamaWeights& weights);

// InvalidArgument naming the tensor when a shape does not match the config.
// `weights` are the whole model's; config.shard selects the slice kept.
std::unique_ptr<Model> make_llama_model(const LlamaConfig& config, LlamaWeights weights);

}  // namespace pagedattn::engine
