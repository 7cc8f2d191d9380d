// A step's paged attention inside the model's layer team (core/team.h):
// each layer's new K/V appended and its attention run by the team's threads
// as pieces of the one region the step's layers share, where
// PagedKVCache::attention_with_fused_qkv opens regions of its own (and runs
// a small batch on one thread while the team's others wait).
//
// It does what that call does for a CPU cache that leaves RoPE to the model,
// on the cache's public parts (plan(), layer_storage(), the kernels'
// plan_attention, mark_layer_appended), split in two: prepare(), before the
// team, checks and plans everything (it may throw: nothing may throw inside
// a team), then append() and attend() run inside it and cannot fail.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kernels/cpu/product_paths.h"
#include "pagedattn/attention.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::engine {

class TeamAttention {
 public:
  // Whether `cache`'s attention can run this way: pages in host memory, no
  // RoPE applied by the cache, head dims the vector kernels take (multiples
  // of 8), and the reference kernels not forced
  // (PAGEDATTN_FORCE_REFERENCE). Latent-attention layouts (kMLA) qualify.
  static bool supports(const PagedKVCache& cache);

  // The step's tensors, the same for every layer (the layer's own values
  // written there before its append and attend):
  //   q   [num_tokens][num_qo_heads][head_dim]
  //   k   [num_tokens][num_kv_heads][head_dim]
  //   v   [num_tokens][num_kv_heads][v_head_dim]; none (null data) for a
  //       kMLA cache, whose V is the first v_head_dim elements of K
  //   out [num_tokens][num_qo_heads][v_head_dim]
  struct Tensors {
    HeadTensor q, k, v, out;
  };
  // The tensors of a fused projection's rows (attention_with_fused_qkv's):
  //   qkv [num_tokens][num_qo_heads + 2 num_kv_heads][head_dim] (q, k, v heads)
  //   out [num_tokens][num_qo_heads][head_dim]
  static Tensors fused_qkv(const KVCacheConfig& config, float* qkv, float* out);

  // For the open step of `cache` (supports(cache)), its layers'
  // `options` [num_layers]: plans the step once per distinct window for a
  // team of `team_threads`, and checks each layer's append and attention as
  // the cache's call would (InvalidArgument / InvalidState, nothing
  // changed). The tensors must stay where they are until finish().
  void prepare(PagedKVCache& cache, std::span<const AttentionOptions> options,
               const Tensors& tensors, std::int32_t team_threads);

  // Tokens [begin, end) of `layer`'s K/V (from the tensors' k and v) into
  // their pages, on the calling thread: inside the team, each thread its
  // range of the rows it has just finished (RoPE), before the barrier that
  // ends that piece.
  void append(std::int32_t layer, std::int32_t begin, std::int32_t end) const;

  // `layer`'s attention into out, on every thread of the team (a piece of
  // it: a barrier after); its K/V must have been appended.
  void attend(std::int32_t layer);

  // After the team: declares every layer's K/V written, so that the cache
  // ends the step (mark_layer_appended).
  void finish(PagedKVCache& cache) const;

 private:
  struct Layer {
    AttentionParams params;  // q, o, table and this layer's storage and options
    AppendParams append;     // k and v from qkv, the step's slot mapping
    std::int32_t plan = 0;   // into plans_
  };
  std::vector<Layer> layers_;
  // The KV shape and plan options whose product paths were last timed
  // (kernels::prepare_product_choice, before the team: never inside it).
  struct TimedPaths {
    kernels::ProductShape shape;
    AttentionPlanOptions options;
    friend bool operator==(const TimedPaths&, const TimedPaths&) = default;
  };
  std::optional<TimedPaths> timed_;
  std::vector<AttentionPlan> plans_;  // one per distinct window of the step
  std::vector<std::byte> workspace_;  // for the largest plan (kernels::aligned_workspace)
  std::byte* aligned_ = nullptr;
  StepId step_ = kAnyStep;
};

}  // namespace pagedattn::engine
