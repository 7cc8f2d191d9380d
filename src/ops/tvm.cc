// TVM-named entry points: thin forwarding to PagedKVCache, plus tensor checks
// for the fused-QKV attention.
#include "pagedattn/ops/tvm.h"

#include "op_checks.h"
#include "op_support.h"
#include "pagedattn/errors.h"

namespace pagedattn::ops::tvm {

void kv_state_add_sequence(PagedKVCache& cache, std::int64_t seq_id) {
  cache.add_sequence(seq_id);
}

void kv_state_remove_sequence(PagedKVCache& cache, std::int64_t seq_id) {
  cache.remove_sequence(seq_id);
}

void kv_state_fork_sequence(PagedKVCache& cache, std::int64_t parent_seq_id,
                            std::int64_t child_seq_id, std::int64_t fork_pos) {
  cache.fork_sequence(parent_seq_id, child_seq_id, fork_pos);
}

void kv_state_popn(PagedKVCache& cache, std::int64_t seq_id, std::int64_t n) {
  cache.pop_n(seq_id, n);
}

void kv_state_begin_forward(PagedKVCache& cache, std::span<const std::int64_t> seq_ids,
                            std::span<const std::int64_t> append_lengths) {
  cache.begin_forward(seq_ids, append_lengths);
}

void kv_state_end_forward(PagedKVCache& cache) {
  cache.end_forward();
}

void attention_kv_cache_enable_sliding_window_for_seq(PagedKVCache& cache, std::int64_t seq_id,
                                                      std::int32_t sliding_window_size,
                                                      std::int32_t attn_sink_size) {
  cache.enable_sliding_window(seq_id, sliding_window_size, attn_sink_size);
}

std::int64_t attention_kv_cache_get_num_available_pages(const PagedKVCache& cache) {
  return cache.num_free_pages();
}

std::int64_t attention_kv_cache_get_total_sequence_length(const PagedKVCache& cache) {
  return cache.total_sequence_length();
}

void attention_kv_cache_attention_with_fused_qkv(PagedKVCache& cache,
                                                 const AttentionWithFusedQKVParams& p) {
  using namespace checks;
  constexpr const char* kCall = "tvm::attention_kv_cache_attention_with_fused_qkv";
  const KVCacheConfig& c = cache.config();
  require<InvalidState>(cache.in_forward(), kCall,
                        ": no forward is in progress (call kv_state_begin_forward first)");
  const std::int64_t tokens = cache.plan().num_tokens();
  check_finite(kCall, "sm_scale", p.sm_scale);
  check_shape(kCall, "qkv", p.qkv, {tokens, c.num_qo_heads + 2 * c.num_kv_heads, c.head_dim});
  check_shape(kCall, "o", p.o, {tokens, c.num_qo_heads, c.v_head_dim});
  for (const auto& [t, name] : {std::pair{&p.qkv, "qkv"}, std::pair{&p.o, "o"}}) {
    check_activation_dtype(kCall, name, *t);
    check_rows_contiguous(kCall, name, *t);
    check_present(kCall, name, t->data, tokens);
  }
  AttentionOptions options;
  options.scale = p.sm_scale;
  cache.attention_with_fused_qkv(p.layer_id, head_tensor(p.qkv, p.qkv.stride(0), p.qkv.stride(1)),
                                 head_tensor(p.o, p.o.stride(0), p.o.stride(1)), options, nullptr,
                                 tokens);  // refused if the step changed meanwhile
}

}  // namespace pagedattn::ops::tvm
