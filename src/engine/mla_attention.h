// Multi-head latent attention (DeepSeek-V2/V3, GGUF deepseek2) in the
// absorbed form the paged cache serves.
//
// Per token x (already RMS-normed), per head h:
//   q_h = [q_nope_h (nope) | q_pe_h (rope)]       from q(x) or q_b(norm(q_a(x)))
//   [c | k_pe] = kv_a(x);  c = rms_norm(c) (kv_lora_rank), k_pe: one RoPE key for all heads
//   RoPE (interleaved pairs) on q_pe_h and k_pe
// Hugging Face expands keys k_h = [W_UK_h c | k_pe] and values W_UV_h c per
// head. Since q_nope_h . (W_UK_h c) = (W_UK_h^T q_nope_h) . c, the model
// instead attends with the query [W_UK_h^T q_nope_h | q_pe_h] over cache
// rows [c | k_pe] (one KV head of kv_lora_rank + rope, shared by every
// query head), takes the value as the row's first kv_lora_rank elements (c
// itself), and up-projects each head's latent output o_h with W_UV_h:
// value_h = W_UV_h o_h (v_head_dim). The scores and outputs are those of
// the expanded form; only the order of the sums differs.
//
// A long prefill chunk instead expands (MlaForm::kExpanded): each sequence's
// cached rows become per-head keys [W_UK_h c | k_pe] and values W_UV_h c,
// and multi-head attention runs with the unabsorbed queries. Per key and
// head that costs (nope + rope + v) multiply-adds where the absorbed form
// costs 2 kv_lora_rank + rope (1,088 against 320 for DeepSeek's shapes),
// plus the expansion of every key once per step (docs/benchmarks.md,
// "Multi-head latent attention").
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gemm.h"
#include "engine/product_split.h"
#include "engine/stacked_matrix.h"
#include "engine/team_attention.h"
#include "engine/weight_matrix.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "pagedattn/rope.h"

namespace pagedattn::engine {

// One layer's MLA weights (the output projection is the layer's `o`).
struct MlaLayerWeights {
  // The projections of the normed hidden state, stacked: the query (q,
  // [Hq (nope + rope)] rows, or with q_lora_rank > 0 q_a, [q_lora_rank]
  // rows), then kv_a ([kv_lora_rank + rope] rows).
  StackedMatrix input;
  std::vector<float> q_a_norm;         // [q_lora_rank], or empty
  WeightMatrix q_b;                    // [Hq (nope + rope)][q_lora_rank], or empty
  std::vector<float> kv_a_norm;        // [kv_lora_rank]
  std::vector<WeightMatrix> k_absorb;  // [Hq] of [kv_lora_rank][nope]: W_UK_h^T
  std::vector<WeightMatrix> v_up;      // [Hq] of [v_head_dim][kv_lora_rank]: W_UV_h
  bool empty() const { return k_absorb.empty(); }
};

// The dimensions of an MLA layer (from LlamaConfig, see its MLA fields;
// heads: this tensor-parallel shard's).
struct MlaShape {
  std::int32_t hidden = 0, heads = 0, q_lora_rank = 0, kv_lora_rank = 0;
  std::int32_t nope = 0, rope = 0, v_head_dim = 0;
  float rms_norm_eps = 1e-6f;
  std::int32_t query_width() const { return heads * (nope + rope); }
  std::int32_t cache_head_dim() const { return kv_lora_rank + rope; }
};
MlaShape mla_shape(const LlamaConfig& config);

// InvalidArgument naming the field when the config's MLA fields are
// inconsistent (num_kv_heads must be 1, head_dim kv_lora_rank + rotary_dim).
// Under tensor parallelism each rank attends with its query heads over the
// whole latent rows, which every rank computes and caches (the one KV head
// is replicated, as for grouped-query attention with more ranks than KV
// heads).
void validate_mla_config(const LlamaConfig& config);
// InvalidArgument naming the weight and the layer when a shape does not match.
void validate_mla_weights(const MlaShape& shape, const MlaLayerWeights& weights,
                          std::int64_t layer);

// How a step's latent attention runs (see the top of this file).
enum class MlaForm : std::uint8_t { kAbsorbed, kExpanded };

// The expanded keys and values of one step may take at most this much
// memory; longer contexts stay absorbed.
inline constexpr std::int64_t kMlaExpandedBytes = std::int64_t{512} << 20;

// The form with fewer multiply-adds for the open step of `plan` (causal
// query-key pairs per sequence, the absorbed form's per-query projections
// against the expansion of every key): kAbsorbed in deterministic mode (a
// token's result must not depend on its batch), for token trees and
// windows with dropped tokens, and beyond kMlaExpandedBytes.
MlaForm mla_form(const MlaShape& shape, const BatchPlan& plan, bool deterministic);

// Buffers reused across calls; size_step sizes those of the projections
// and of the absorbed form for a step.
struct MlaScratch {
  std::vector<float> input, q_a, q, query, rows, head_in, attention;
  // The expanded form: one sequence's cached rows (and V's own copy of
  // their latent where the layout keeps one), their latent part, the key
  // up-projections as f32, and the step's per-head keys and values with
  // their page table.
  std::vector<float> cached, cached_v, latent, k_up, keys, values;
  std::vector<const float*> k_up_heads;  // [heads]: f32 weights or rows of k_up
  std::vector<std::int32_t> kv_indptr, kv_indices, last_page_len;
  AttentionRunner runner;
  // The per-head products: the heads' ids, their splits over the threads
  // (W_UK^T's and W_UV's, the same for every layer: size_step makes them
  // once a step), and each thread's scratch (head_in: a slice of gathered
  // columns each).
  std::vector<std::int32_t> heads;
  ProductSplit absorb_split, values_split;
  std::vector<LinearScratch> thread_scratch;
};

// values[tokens][heads * v_head_dim] = each head's up-projected attention
// output for the normed hidden states x[tokens][hidden] of the cache's
// current step; appends the step's [c | k_pe] rows to `layer` of the cache
// (one KV head, head_dim kv_lora_rank + rope, v_head_dim kv_lora_rank).
// positions[tokens]: RoPE positions; `rope` has a table covering them
// (rotary_dim = shape.rope). `form`: mla_form's choice, or either one (the
// tests run both). InvalidArgument when the weights do not match `shape`
// or tokens < 0 (before touching the cache). Outside a team: its products
// open regions of their own, and the attention is the cache's call.
void mla_attention(const MlaShape& shape, const MlaLayerWeights& weights, const float* x,
                   std::int32_t tokens, std::int32_t layer, const std::int32_t* positions,
                   const RopeConfig& rope, const AttentionOptions& options, PagedKVCache& cache,
                   float* values, bool deterministic, MlaForm form, MlaScratch& scratch,
                   LinearScratch& linear_scratch);

// The absorbed form inside a model's layer team (core/team.h), where the
// cache's attention call (which may throw, and opens regions of its own)
// cannot run. Before the team: size_step for the step's tokens and the
// team's size, then TeamAttention::prepare with latent_team_tensors. In
// it, mla_attention_in_team does what mla_attention does for kAbsorbed,
// every piece split over the team's threads: the projections, norms and
// RoPE by rows, the per-head products by columns, the append by each
// thread's rows, the attention through `attention`. The weights were
// checked at load (validate_mla_weights): nothing here throws.
void size_step(const MlaShape& shape, std::int32_t tokens, MlaForm form, std::int32_t threads,
               bool deterministic, MlaScratch& scratch);
// The step's attention tensors over the scratch (q, the cache rows, V for
// a multi-query layout, the latent outputs) for `cache`'s layout.
TeamAttention::Tensors latent_team_tensors(const MlaShape& shape, const KVCacheConfig& cache,
                                           MlaScratch& scratch);
void mla_attention_in_team(const MlaShape& shape, const MlaLayerWeights& weights, const float* x,
                           std::int32_t tokens, std::int32_t layer, const std::int32_t* positions,
                           const RopeConfig& rope, TeamAttention& attention, float* values,
                           bool deterministic, MlaScratch& scratch, LinearScratch& linear_scratch);

}  // namespace pagedattn::engine
