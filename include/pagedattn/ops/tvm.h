// TVM's PagedKVCache entry points under TVM's names (the relax VM builtins
// "vm.builtin.kv_state_*" and "vm.builtin.attention_kv_cache_*"), over
// pagedattn::PagedKVCache. Same semantics as the cache's own methods; TVM's
// sliding window is cache retention with pinned sink tokens, not a mask
// (docs/ops.md). Errors are the cache's typed exceptions.
#pragma once

#include <cstdint>
#include <span>

#include "pagedattn/kv_cache.h"
#include "pagedattn/ops/tensor.h"

namespace pagedattn::ops::tvm {

// vm.builtin.kv_state_*
void kv_state_add_sequence(PagedKVCache& cache, std::int64_t seq_id);
void kv_state_remove_sequence(PagedKVCache& cache, std::int64_t seq_id);
void kv_state_fork_sequence(PagedKVCache& cache, std::int64_t parent_seq_id,
                            std::int64_t child_seq_id, std::int64_t fork_pos = -1);
void kv_state_popn(PagedKVCache& cache, std::int64_t seq_id, std::int64_t n);
void kv_state_begin_forward(PagedKVCache& cache, std::span<const std::int64_t> seq_ids,
                            std::span<const std::int64_t> append_lengths);
void kv_state_end_forward(PagedKVCache& cache);

// vm.builtin.attention_kv_cache_*
void attention_kv_cache_enable_sliding_window_for_seq(PagedKVCache& cache, std::int64_t seq_id,
                                                      std::int32_t sliding_window_size,
                                                      std::int32_t attn_sink_size);
std::int64_t attention_kv_cache_get_num_available_pages(const PagedKVCache& cache);
std::int64_t attention_kv_cache_get_total_sequence_length(const PagedKVCache& cache);

struct AttentionWithFusedQKVParams {
  std::int32_t layer_id = 0;
  float sm_scale = 0.0f;  // the full logit scale (TVM passes head_dim^-0.5 explicitly)
  TensorView qkv;         // [T, Hq + 2 Hkv, D], T = tokens of this step; innermost axis contiguous
  TensorView o;           // [T, Hq, D], written
};
// vm.builtin.attention_kv_cache_attention_with_fused_qkv: RoPE per the
// cache's rope_mode, append this step's K/V for `layer_id`, attend.
void attention_kv_cache_attention_with_fused_qkv(PagedKVCache& cache,
                                                 const AttentionWithFusedQKVParams& params);

}  // namespace pagedattn::ops::tvm
