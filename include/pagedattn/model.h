// The model interface the engine drives. A model owns its weights and, per
// step, turns the batch's new tokens into logits, handing each layer's
// q/k/v to the cache (PagedKVCache::attention): the cache appends K/V and
// attends over every sequence of the ragged batch.
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "pagedattn/kv_cache.h"

namespace pagedattn {

// What the engine needs to know to build the cache and sample.
struct ModelSpec {
  std::string name;
  std::int32_t num_layers = 1;
  std::int32_t num_qo_heads = 1;
  std::int32_t num_kv_heads = 1;
  std::int32_t head_dim = 64;
  std::int32_t vocab_size = 1;
  std::int32_t max_position = 4096;      // longest sequence (prompt + output)
  std::int32_t eos_token_id = -1;        // -1: none
  RopeMode rope_mode = RopeMode::kNone;  // applied by the cache
  RopeConfig rope;
  // > 0: no layer attends further back than this many tokens (every layer
  // has this sliding window), so the engine lets the cache drop older
  // tokens' pages (PagedKVCache::enable_sliding_window); the model then
  // takes its RoPE positions as plan().positions + num_dropped_tokens.
  std::int32_t sliding_window = 0;
  // > 0: multi-head latent attention (DeepSeek): the single KV head's rows
  // are [latent | RoPE key] (head_dim wide) and attention reads each row's
  // first latent_dim elements as its value. kv_cache_config decides how the
  // cache stores that.
  std::int32_t latent_dim = 0;
};

// The cache shape a model needs (layers, heads, head dim, RoPE mode and
// parameters); the caller adds page size, memory, KV dtype and planning.
KVCacheConfig kv_cache_config(const ModelSpec& spec);

// One step's input. Tokens are ordered as in the cache's current plan
// (cache.plan(): qo_indptr, positions).
struct ForwardBatch {
  std::span<const std::int32_t> token_ids;   // [num_tokens]
  std::span<const std::int32_t> logit_rows;  // token indices whose logits are wanted, ascending
  // Results of a token must not depend on the other tokens of the batch
  // (fixed-size row blocks in every matrix product).
  bool deterministic = false;
  // Products with quantised weights take activations rounded to int8 per 32
  // values (llama.cpp's Q8_0 activations; the error bound is in
  // docs/models.md), on AVX2 and up (larger batches on the int8 tiles:
  // AVX512-VNNI, AVX-VNNI or AVX2). Ignored in deterministic mode.
  bool int8_activations = false;
  // Weight products in batches of more than 8 rows that int8_activations
  // leaves alone (float weights; every batch where the CPU lacks
  // AVX512-VNNI) round x and the weights to bf16 and run on AVX512-BF16 dot
  // products where the CPU has them (f32 elsewhere; the error bound is in
  // docs/models.md). Ignored in deterministic mode.
  bool bf16_products = false;
};

class Model {
 public:
  virtual ~Model() = default;
  virtual const ModelSpec& spec() const = 0;
  // Called once by the Engine with the cache it built from spec(), before
  // any request: a model that keeps other caches in step with it (tensor
  // parallelism) starts observing it here. Default: nothing.
  virtual void attach_cache(PagedKVCache& cache) { (void)cache; }
  // Runs every layer for the batch inside cache.begin_forward/end_forward
  // (the caller brackets the step) and writes
  // logits [logit_rows.size()][vocab_size].
  virtual void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) = 0;
};

}  // namespace pagedattn
