// C ABI of PagedKVCache: an opaque handle owning the C++ object.
#include <span>

#include "c_api_support.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/ops/tvm.h"

struct pagedattn_kv_cache {
  pagedattn::PagedKVCache cache;
};

namespace pagedattn::capi {
namespace {

KVCacheConfig to_config(const pagedattn_kv_cache_config& c) {
  constexpr const char* kCall = "pagedattn_kv_cache_create";
  const int kv_dtype = raw_enum_value(c.kv_dtype);
  require(kv_dtype >= PAGEDATTN_FLOAT32 && kv_dtype <= PAGEDATTN_INT8, kCall,
          ": config.kv_dtype = ", kv_dtype, " is not a KV storage type");
  require(c.layout == 0 || c.layout == 1, kCall, ": config.layout = ", c.layout,
          " must be 0 (HND) or 1 (NHD)");
  require(c.rope_mode >= 0 && c.rope_mode <= 2, kCall, ": config.rope_mode = ", c.rope_mode,
          " must be 0 (none), 1 (normal) or 2 (inline)");
  KVCacheConfig config;
  config.num_layers = c.num_layers;
  config.num_qo_heads = c.num_qo_heads;
  config.num_kv_heads = c.num_kv_heads;
  config.head_dim = c.head_dim;
  config.v_head_dim = c.v_head_dim;
  config.page_size = c.page_size;
  config.num_pages = c.num_pages;
  config.memory_budget_bytes = c.memory_budget_bytes;
  config.kv_dtype = static_cast<DType>(kv_dtype);
  config.k_scale = c.k_scale;
  config.v_scale = c.v_scale;
  config.layout = static_cast<KVLayout>(c.layout);
  config.support_sliding_window = c.support_sliding_window != 0;
  config.rope_mode = static_cast<RopeMode>(c.rope_mode);
  config.rope.style = c.rope_interleaved ? RopeStyle::kGptJ : RopeStyle::kNeox;
  config.rope.rotary_dim = c.rotary_dim;
  config.rope.theta = c.rope_theta;
  config.rope.scale = c.rope_scale;
  return config;
}

// Runs `body(cache)` for a non-null handle.
template <typename Handle, typename Body>
pagedattn_status with_cache(Handle* handle, const char* call, Body&& body) noexcept {
  return guarded([&] {
    require_pointer(handle, call, "cache");
    body(handle->cache);
  });
}

}  // namespace
}  // namespace pagedattn::capi

using pagedattn::capi::guarded;
using pagedattn::capi::require_pointer;
using pagedattn::capi::with_cache;

extern "C" {

void pagedattn_kv_cache_config_init(pagedattn_kv_cache_config* config) {
  if (config == nullptr) return;
  const pagedattn::KVCacheConfig d;
  *config = {};
  config->num_layers = d.num_layers;
  config->num_qo_heads = d.num_qo_heads;
  config->num_kv_heads = d.num_kv_heads;
  config->head_dim = d.head_dim;
  config->page_size = d.page_size;
  config->kv_dtype = static_cast<pagedattn_dtype>(d.kv_dtype);
  config->k_scale = d.k_scale;
  config->v_scale = d.v_scale;
  config->layout = static_cast<int32_t>(d.layout);
  config->rope_theta = d.rope.theta;
  config->rope_scale = d.rope.scale;
}

pagedattn_status pagedattn_kv_cache_create(const pagedattn_kv_cache_config* config,
                                           pagedattn_kv_cache** out) {
  return guarded([&] {
    require_pointer(config, "pagedattn_kv_cache_create", "config");
    require_pointer(out, "pagedattn_kv_cache_create", "out");
    *out = new pagedattn_kv_cache{pagedattn::PagedKVCache(pagedattn::capi::to_config(*config))};
  });
}

void pagedattn_kv_cache_destroy(pagedattn_kv_cache* cache) {
  delete cache;
}

pagedattn_status pagedattn_kv_cache_add_sequence(pagedattn_kv_cache* cache, int64_t seq_id) {
  return with_cache(cache, "pagedattn_kv_cache_add_sequence",
                    [&](pagedattn::PagedKVCache& c) { c.add_sequence(seq_id); });
}

pagedattn_status pagedattn_kv_cache_remove_sequence(pagedattn_kv_cache* cache, int64_t seq_id) {
  return with_cache(cache, "pagedattn_kv_cache_remove_sequence",
                    [&](pagedattn::PagedKVCache& c) { c.remove_sequence(seq_id); });
}

pagedattn_status pagedattn_kv_cache_fork_sequence(pagedattn_kv_cache* cache, int64_t parent_id,
                                                  int64_t child_id, int64_t fork_pos) {
  return with_cache(cache, "pagedattn_kv_cache_fork_sequence", [&](pagedattn::PagedKVCache& c) {
    c.fork_sequence(parent_id, child_id, fork_pos);
  });
}

pagedattn_status pagedattn_kv_cache_pop_n(pagedattn_kv_cache* cache, int64_t seq_id, int64_t n) {
  return with_cache(cache, "pagedattn_kv_cache_pop_n",
                    [&](pagedattn::PagedKVCache& c) { c.pop_n(seq_id, n); });
}

pagedattn_status pagedattn_kv_cache_enable_sliding_window(pagedattn_kv_cache* cache, int64_t seq_id,
                                                          int64_t window_size,
                                                          int64_t attn_sink_size) {
  return with_cache(cache, "pagedattn_kv_cache_enable_sliding_window",
                    [&](pagedattn::PagedKVCache& c) {
                      c.enable_sliding_window(seq_id, window_size, attn_sink_size);
                    });
}

pagedattn_status pagedattn_kv_cache_begin_forward(pagedattn_kv_cache* cache, const int64_t* seq_ids,
                                                  const int64_t* append_lengths, size_t count) {
  constexpr const char* kCall = "pagedattn_kv_cache_begin_forward";
  return with_cache(cache, kCall, [&](pagedattn::PagedKVCache& c) {
    if (count > 0) {
      require_pointer(seq_ids, kCall, "seq_ids");
      require_pointer(append_lengths, kCall, "append_lengths");
    }
    c.begin_forward(std::span<const int64_t>(seq_ids, count),
                    std::span<const int64_t>(append_lengths, count));
  });
}

pagedattn_status pagedattn_kv_cache_end_forward(pagedattn_kv_cache* cache) {
  return with_cache(cache, "pagedattn_kv_cache_end_forward",
                    [&](pagedattn::PagedKVCache& c) { c.end_forward(); });
}

pagedattn_status pagedattn_kv_cache_attention_with_fused_qkv(pagedattn_kv_cache* cache,
                                                             int32_t layer,
                                                             const pagedattn_tensor* qkv,
                                                             const pagedattn_tensor* out,
                                                             float sm_scale) {
  constexpr const char* kCall = "pagedattn_kv_cache_attention_with_fused_qkv";
  return with_cache(cache, kCall, [&](pagedattn::PagedKVCache& c) {
    require_pointer(qkv, kCall, "qkv");
    require_pointer(out, kCall, "out");
    pagedattn::ops::tvm::AttentionWithFusedQKVParams p;
    p.layer_id = layer;
    p.sm_scale = sm_scale;
    p.qkv = pagedattn::capi::to_tensor(*qkv, kCall, "qkv");
    p.o = pagedattn::capi::to_tensor(*out, kCall, "out");
    pagedattn::ops::tvm::attention_kv_cache_attention_with_fused_qkv(c, p);
  });
}

pagedattn_status pagedattn_kv_cache_num_free_pages(const pagedattn_kv_cache* cache, int64_t* out) {
  constexpr const char* kCall = "pagedattn_kv_cache_num_free_pages";
  return with_cache(cache, kCall, [&](const pagedattn::PagedKVCache& c) {
    require_pointer(out, kCall, "out");
    *out = c.num_free_pages();
  });
}

pagedattn_status pagedattn_kv_cache_sequence_length(const pagedattn_kv_cache* cache, int64_t seq_id,
                                                    int64_t* out) {
  constexpr const char* kCall = "pagedattn_kv_cache_sequence_length";
  return with_cache(cache, kCall, [&](const pagedattn::PagedKVCache& c) {
    require_pointer(out, kCall, "out");
    *out = c.sequence_length(seq_id);
  });
}

pagedattn_status pagedattn_kv_cache_debug_get_kv(const pagedattn_kv_cache* cache, int64_t seq_id,
                                                 int64_t start, int64_t end, float* k_out,
                                                 size_t k_count, float* v_out, size_t v_count) {
  constexpr const char* kCall = "pagedattn_kv_cache_debug_get_kv";
  return with_cache(cache, kCall, [&](const pagedattn::PagedKVCache& c) {
    if (k_count > 0) require_pointer(k_out, kCall, "k_out");
    if (v_count > 0) require_pointer(v_out, kCall, "v_out");
    c.debug_get_kv(seq_id, start, end, std::span<float>(k_out, k_count),
                   std::span<float>(v_out, v_count));
  });
}

pagedattn_status pagedattn_kv_cache_state_digest(const pagedattn_kv_cache* cache, uint64_t* out) {
  constexpr const char* kCall = "pagedattn_kv_cache_state_digest";
  return with_cache(cache, kCall, [&](const pagedattn::PagedKVCache& c) {
    require_pointer(out, kCall, "out");
    *out = c.state_digest();
  });
}

}  // extern "C"
