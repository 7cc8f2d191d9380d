// The built-in Llama model's weights, whatever their source (seeded
// synthetic draws or a GGUF file), and the factory that takes them.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/mla_attention.h"
#include "engine/moe.h"
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
  MlaLayerWeights mla;                // config.kv_lora_rank > 0: instead of qkv (and its norms)
  WeightMatrix o;                     // [H][Hq D] (latent attention: [H][Hq v_head_dim])
  std::vector<float> post_attn_norm;  // [H] (config.sandwich_norms)
  std::vector<float> mlp_norm;        // [H]
  StackedMatrix gate_up;              // [2 I][H]: gate rows, then up rows (empty with experts)
  WeightMatrix down;                  // [H][I] (empty with experts)
  MoeLayerWeights moe;  // config.num_experts > 0 (past leading_dense_layers): the experts instead
  std::vector<float> post_mlp_norm;  // [H] (config.sandwich_norms)
};

struct LlamaWeights {
  WeightMatrix embedding;  // [V][H]
  // [V][H]; empty when tied to the embedding. A vocab-parallel shard keeps
  // rows vocab_slice(...) only (tied: reads those rows of the embedding).
  WeightMatrix lm_head;
  std::vector<float> final_norm;          // [H]
  std::vector<LlamaLayerWeights> layers;  // [num_layers]
};

// InvalidArgument naming the fields and the rank counts that work when the
// whole-model config cannot be split `shard.size` ways.
void validate_shard(const LlamaConfig& config);
// This rank's query heads, and its KV heads: num_kv_heads / size, or 1 when
// size > num_kv_heads (each KV head then replicated on size / num_kv_heads
// ranks).
std::int32_t shard_qo_heads(const LlamaConfig& config);
std::int32_t shard_kv_heads(const LlamaConfig& config);
// Keeps only config.shard's slice of every split matrix (whole-model
// weights in, shard weights out; replicated tensors untouched).
void shard_llama_weights(const LlamaConfig& config, LlamaWeights& weights);

// Vocabulary-parallel LM head: with shard.size > 1 and shard.all_gather
// set, rank r multiplies only the vocabulary rows vocab_slice(...) of the
// LM head (or tied embedding) and the logits are all-gathered.
bool vocab_parallel(const LlamaConfig& config);
struct VocabSlice {
  std::int32_t begin = 0, count = 0;  // rows [begin, begin + count); count may be 0
};
// Whole kColumnBlock-row blocks spread as evenly as blocks allow (the last
// block cut at vocab_size): in deterministic mode (and with one thread)
// every logit then comes out of a block of the same rows as in one
// process, so of the same products.
VocabSlice vocab_slice(std::int32_t vocab_size, std::int32_t rank, std::int32_t size);
// The LM head's rows this rank keeps: vocab_size, or its slice's count.
std::int32_t lm_head_rows(const LlamaConfig& config);
// logits[rows][vocab_size] = x[rows][hidden_size] head^T with the LM head
// (or tied embedding) of `weights` (shard_llama_weights's output); under
// vocab_parallel this rank's slice, then shard.all_gather, using `gathered`
// as the buffer. Collective then: every rank calls it with the same rows.
void project_lm_head(const LlamaConfig& config, const LlamaWeights& weights, const float* x,
                     std::int32_t rows, std::span<float> logits, bool deterministic,
                     LinearScratch& scratch, std::vector<float>& gathered);

// InvalidArgument naming the tensor when a shape does not match the config.
// `weights` are the whole model's; config.shard selects the slice kept.
std::unique_ptr<Model> make_llama_model(const LlamaConfig& config, LlamaWeights weights);

}  // namespace pagedattn::engine
