#include "validate.h"

#include <cmath>

#include "core/cpu_dispatch.h"
#include "pagedattn/errors.h"

namespace pagedattn::kernels {
namespace {

void validate_table(const PagedKVTable& t, const PagedKVStorage& kv, const char* call) {
  require(t.batch_size >= 0, call, ": table.batch_size = ", t.batch_size, " must be >= 0");
  require(t.page_size == kv.page_size, call, ": table.page_size = ", t.page_size,
          " differs from kv.page_size = ", kv.page_size);
  require(t.qo_indptr && t.kv_indptr && t.kv_lens, call,
          ": table qo_indptr, kv_indptr and kv_lens must be non-null");
  require((t.kv_sink_lens == nullptr) == (t.kv_gap_lens == nullptr), call,
          ": table.kv_sink_lens and kv_gap_lens must both be given or both be null");
  require(t.qo_indptr[0] == 0 && t.kv_indptr[0] == 0, call,
          ": table.qo_indptr[0] and kv_indptr[0] must be 0");
  require(t.kv_indices || t.kv_indptr[t.batch_size] == 0, call,
          ": table.kv_indices must be non-null when kv_indptr[batch_size] = ",
          t.kv_indptr[t.batch_size], " pages are used");
  for (std::int32_t b = 0; b < t.batch_size; ++b) {
    require(t.qo_indptr[b + 1] >= t.qo_indptr[b], call, ": table.qo_indptr decreases at [", b + 1,
            "] = ", t.qo_indptr[b + 1]);
    require(t.kv_indptr[b + 1] >= t.kv_indptr[b], call, ": table.kv_indptr decreases at [", b + 1,
            "] = ", t.kv_indptr[b + 1]);
    const std::int64_t kv_len = t.kv_lens[b];
    const std::int64_t sink = t.kv_sink_lens ? t.kv_sink_lens[b] : 0;
    const std::int64_t gap = t.kv_gap_lens ? t.kv_gap_lens[b] : 0;
    require(kv_len >= 0 && sink >= 0 && gap >= 0, call, ": table kv_lens[", b, "] = ", kv_len,
            ", kv_sink_lens = ", sink, ", kv_gap_lens = ", gap, " must be >= 0");
    const std::int64_t slots = kv_len + (kv_len > sink ? gap : 0);
    const std::int64_t capacity = std::int64_t{t.num_pages_of(b)} * t.page_size;
    require(slots <= capacity, call, ": table.kv_lens[", b, "] = ", kv_len, " needs ", slots,
            " slots but the sequence has ", t.num_pages_of(b), " pages of ", t.page_size);
    for (std::int32_t i = t.kv_indptr[b]; i < t.kv_indptr[b + 1]; ++i)
      require(t.kv_indices[i] >= 0 && t.kv_indices[i] < kv.num_pages, call, ": table.kv_indices[",
              i, "] = ", t.kv_indices[i], " is outside [0, ", kv.num_pages, ")");
  }
}

// Inline RoPE rotates key j at position j: the cos/sin cache (if any) must
// reach the longest sequence.
void validate_key_rope(const RopeConfig& rope, const AttentionParams& p, const char* call) {
  const std::int32_t r = rope.rotary_dim == 0 ? p.kv.head_dim : rope.rotary_dim;
  require(r >= 2 && r % 2 == 0 && r <= p.kv.head_dim, call,
          ": options.key_rope->rotary_dim = ", rope.rotary_dim,
          " must be even and at most head_dim = ", p.kv.head_dim);
  require(rope.theta > 0.0f && rope.scale > 0.0f, call, ": options.key_rope theta = ", rope.theta,
          " and scale = ", rope.scale, " must be > 0");
  require((rope.cos_cache == nullptr) == (rope.sin_cache == nullptr), call,
          ": options.key_rope needs both cos_cache and sin_cache or neither");
  if (!rope.cos_cache) return;
  for (std::int32_t b = 0; b < p.table.batch_size; ++b)
    require(p.table.kv_lens[b] <= rope.cache_max_position, call, ": kv_lens[", b,
            "] = ", p.table.kv_lens[b],
            " exceeds options.key_rope->cache_max_position = ", rope.cache_max_position);
}

// The tree arrays must describe a forest over keys [tree_begin, kv_len) of
// each sequence that holds every query of that sequence.
void validate_tree_mask(const AttentionParams& p, const char* call) {
  const TokenTreeMask& m = p.tree_mask;
  const PagedKVTable& t = p.table;
  require(m.node_indptr != nullptr, call, ": tree_mask needs node_indptr with tree_begin");
  require((m.enter && m.exit && m.positions) || m.node_indptr[t.batch_size] == 0, call,
          ": tree_mask has ", m.node_indptr[t.batch_size],
          " nodes but null enter, exit or positions");
  require(p.options.window_left < 0, call, ": options.window_left = ", p.options.window_left,
          " cannot be combined with a token-tree mask");
  require(m.node_indptr[0] == 0, call, ": tree_mask.node_indptr[0] = ", m.node_indptr[0],
          " must be 0");
  for (std::int32_t b = 0; b < t.batch_size; ++b) {
    const std::int64_t begin = m.tree_begin[b], kv_len = t.kv_lens[b];
    require(begin == kv_len || (begin >= 0 && begin <= kv_len - t.q_len(b)), call,
            ": tree_mask.tree_begin[", b, "] = ", begin, " must be kv_len = ", kv_len,
            " (no tree) or in [0, kv_len - q_len = ", kv_len - t.q_len(b),
            "]: every query must be a tree node");
    const std::int64_t nodes = std::int64_t{m.node_indptr[b + 1]} - m.node_indptr[b];
    require(nodes == kv_len - begin, call, ": tree_mask.node_indptr gives sequence ", b, " ", nodes,
            " nodes, kv_len - tree_begin = ", kv_len - begin);
    for (std::int64_t i = 0; i < nodes; ++i) {
      const std::int64_t n = m.node_indptr[b] + i;
      require(m.enter[n] >= 0 && m.enter[n] <= m.exit[n] && m.exit[n] < nodes, call,
              ": tree_mask node ", n, " has enter = ", m.enter[n], ", exit = ", m.exit[n],
              "; need 0 <= enter <= exit < ", nodes);
      require(m.positions[n] >= 0 && m.positions[n] <= begin + i, call, ": tree_mask.positions[", n,
              "] = ", m.positions[n], " must be in [0, its key index ", begin + i, "]");
    }
  }
}

}  // namespace

void validate_attention_params(const AttentionParams& p, const char* call) {
  core::require_valid_dispatch_environment(call);
  const PagedKVStorage& kv = p.kv;
  require(kv.k_data && kv.v_data, call, ": kv.k_data and kv.v_data must be non-null");
  require(kv.num_kv_heads >= 1 && kv.head_dim >= 1 && kv.v_head_dim >= 1 && kv.page_size >= 1, call,
          ": kv num_kv_heads = ", kv.num_kv_heads, ", head_dim = ", kv.head_dim,
          ", v_head_dim = ", kv.v_head_dim, ", page_size = ", kv.page_size, " must all be >= 1");
  require(!kv.v_in_k ||
              (kv.v_data == kv.k_data && kv.v_head_dim <= kv.head_dim &&
               kv.v_page_stride == kv.k_page_stride && kv.v_head_stride == kv.k_head_stride &&
               kv.v_token_stride == kv.k_token_stride && kv.v_token_scales == kv.k_token_scales &&
               kv.v_scale == kv.k_scale && kv.v_head_scales == kv.k_head_scales),
          call,
          ": a kv with v_in_k (MLA) needs V's pointers, strides and scales equal to K's and "
          "v_head_dim = ",
          kv.v_head_dim, " <= head_dim = ", kv.head_dim, " (PagedKVStorage::latent)");
  require(kv.dtype != DType::kINT8 || (kv.k_token_scales && kv.v_token_scales), call,
          ": int8 KV needs kv.k_token_scales and kv.v_token_scales");
  const bool fp8 = is_fp8(kv.dtype);
  require(!fp8 || (std::isfinite(kv.k_scale) && kv.k_scale > 0.0f && std::isfinite(kv.v_scale) &&
                   kv.v_scale > 0.0f),
          call, ": fp8 KV needs finite positive kv.k_scale and kv.v_scale, got ", kv.k_scale, ", ",
          kv.v_scale);
  require(p.num_qo_heads >= 1 && p.num_qo_heads % kv.num_kv_heads == 0, call,
          ": num_qo_heads = ", p.num_qo_heads,
          " must be a positive multiple of num_kv_heads = ", kv.num_kv_heads);
  require(is_activation_dtype(p.q.dtype) && is_activation_dtype(p.o.dtype), call,
          ": q.dtype = ", dtype_name(p.q.dtype), " and o.dtype = ", dtype_name(p.o.dtype),
          " must be float32, float16 or bfloat16");
  validate_table(p.table, kv, call);
  const std::int32_t num_tokens = p.table.qo_indptr[p.table.batch_size];
  require(num_tokens == 0 || (p.q.data && p.o.data), call,
          ": q.data and o.data must be non-null for ", num_tokens, " tokens");
  const AttentionOptions& opt = p.options;
  require(!opt.scale || std::isfinite(*opt.scale), call,
          ": options.scale = ", opt.scale.value_or(0.0f), " must be finite");
  require(opt.window_left >= -1, call, ": options.window_left = ", opt.window_left,
          " must be -1 (off) or >= 0");
  require(opt.softcap >= 0.0f && std::isfinite(opt.softcap), call,
          ": options.softcap = ", opt.softcap, " must be 0 (off) or a positive finite value");
  if (opt.key_rope) validate_key_rope(*opt.key_rope, p, call);
  if (p.tree_mask.active()) validate_tree_mask(p, call);
}

}  // namespace pagedattn::kernels
