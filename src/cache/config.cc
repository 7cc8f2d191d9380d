#include "config.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "page_storage.h"

namespace pagedattn::cache {
namespace {

void require_positive(std::int64_t value, const char* field) {
  require(value >= 1, "KVCacheConfig.", field, " = ", value, " must be >= 1");
}

void validate_scales(const KVCacheConfig& c) {
  auto good = [](float s) { return std::isfinite(s) && s > 0.0f; };
  require(good(c.k_scale) && good(c.v_scale), "KVCacheConfig.k_scale = ", c.k_scale,
          " and v_scale = ", c.v_scale, " must be finite and > 0");
  for (const auto* v : {&c.k_head_scales, &c.v_head_scales}) {
    require(v->empty() || std::ssize(*v) == c.num_kv_heads, "KVCacheConfig.",
            v == &c.k_head_scales ? "k" : "v", "_head_scales has ", v->size(),
            " entries; give none or num_kv_heads = ", c.num_kv_heads);
    for (std::size_t h = 0; h < v->size(); ++h)
      require(good((*v)[h]), "KVCacheConfig.", v == &c.k_head_scales ? "k" : "v", "_head_scales[",
              h, "] = ", (*v)[h], " must be finite and > 0");
  }
}

void validate_rope(const KVCacheConfig& c) {
  require(static_cast<int>(c.rope_mode) <= static_cast<int>(RopeMode::kInline),
          "KVCacheConfig.rope_mode = ", static_cast<int>(c.rope_mode), " is not a RopeMode");
  require(c.rope.cos_cache == nullptr && c.rope.sin_cache == nullptr,
          "KVCacheConfig.rope.cos_cache/sin_cache must be null (the cache builds its own table)");
  if (c.rope_mode == RopeMode::kNone) return;
  const std::int32_t r = c.rope.rotary_dim == 0 ? c.head_dim : c.rope.rotary_dim;
  require(r >= 2 && r % 2 == 0 && r <= c.head_dim,
          "KVCacheConfig.rope.rotary_dim = ", c.rope.rotary_dim,
          " must be even and in [2, head_dim = ", c.head_dim, "]");
  require(std::isfinite(c.rope.theta) && c.rope.theta > 0.0f && std::isfinite(c.rope.scale) &&
              c.rope.scale > 0.0f,
          "KVCacheConfig.rope.theta = ", c.rope.theta, " and rope.scale = ", c.rope.scale,
          " must be finite and > 0");
}

// MLA keeps one row per token: a single KV head whose leading v_head_dim
// elements are V, its scales serving both. RoPE applies to the row's tail
// only, which the model rotates before the append (no cache-level RoPE).
void validate_mla(const KVCacheConfig& c) {
  require(c.attention_kind == AttentionKind::kMHA || c.attention_kind == AttentionKind::kMLA,
          "KVCacheConfig.attention_kind = ", static_cast<int>(c.attention_kind),
          " is not an AttentionKind");
  if (c.attention_kind != AttentionKind::kMLA) return;
  require(c.num_kv_heads == 1, "KVCacheConfig.num_kv_heads = ", c.num_kv_heads,
          " must be 1 for attention_kind = MLA (one latent row per token)");
  require(c.v_head_dim <= c.head_dim, "KVCacheConfig.v_head_dim = ", c.v_head_dim,
          " must be <= head_dim = ", c.head_dim, " for MLA (V is the head of each K row)");
  require(c.rope_mode == RopeMode::kNone,
          "KVCacheConfig.rope_mode = ", static_cast<int>(c.rope_mode),
          " must be kNone for MLA (the model rotates the RoPE key before the append)");
  require(c.v_head_scales.empty() && (c.v_scale == 1.0f || c.v_scale == c.k_scale),
          "KVCacheConfig.v_scale = ", c.v_scale, " / v_head_scales (", c.v_head_scales.size(),
          " entries): MLA stores no V; its scale is k_scale's");
}

// host_num_pages from host_memory_budget_bytes (both 0: no host tier).
void resolve_host_tier(KVCacheConfig& c, std::int64_t page_bytes) {
  require(c.host_num_pages >= 0 && c.host_memory_budget_bytes >= 0,
          "KVCacheConfig.host_num_pages = ", c.host_num_pages,
          " and host_memory_budget_bytes = ", c.host_memory_budget_bytes, " must be >= 0");
  require(c.host_num_pages == 0 || c.host_memory_budget_bytes == 0,
          "KVCacheConfig: give host_num_pages (", c.host_num_pages,
          ") or host_memory_budget_bytes (", c.host_memory_budget_bytes, "), not both");
  constexpr std::int64_t kMaxPages = std::numeric_limits<std::int32_t>::max();
  if (c.host_num_pages == 0 && c.host_memory_budget_bytes > 0) {
    c.host_num_pages = std::min(c.host_memory_budget_bytes / page_bytes, kMaxPages);
    require(c.host_num_pages >= 1,
            "KVCacheConfig.host_memory_budget_bytes = ", c.host_memory_budget_bytes,
            " holds no page (one page over all layers is ", page_bytes, " bytes)");
  }
  constexpr std::int64_t kMaxBytes = std::numeric_limits<std::int64_t>::max();
  require(c.host_num_pages <= kMaxPages && c.host_num_pages <= kMaxBytes / page_bytes,
          "KVCacheConfig.host_num_pages = ", c.host_num_pages, " exceeds ", kMaxPages,
          " or overflows 64 bits of storage");
}

}  // namespace

KVCacheConfig resolve_config(const KVCacheConfig& in) {
  KVCacheConfig c = in;
  require_positive(c.num_layers, "num_layers");
  require_positive(c.num_qo_heads, "num_qo_heads");
  require_positive(c.num_kv_heads, "num_kv_heads");
  require(c.num_qo_heads % c.num_kv_heads == 0, "KVCacheConfig.num_kv_heads = ", c.num_kv_heads,
          " must divide num_qo_heads = ", c.num_qo_heads);
  require_positive(c.head_dim, "head_dim");
  require(c.v_head_dim >= 0, "KVCacheConfig.v_head_dim = ", c.v_head_dim,
          " must be >= 0 (0 means head_dim)");
  if (c.v_head_dim == 0) c.v_head_dim = c.head_dim;
  validate_mla(c);
  require_positive(c.page_size, "page_size");
  require(static_cast<int>(c.kv_dtype) <= static_cast<int>(DType::kINT8),
          "KVCacheConfig.kv_dtype = ", static_cast<int>(c.kv_dtype), " is not a KV storage dtype");
  validate_scales(c);
  validate_rope(c);
  const AttentionPlanOptions& ap = c.attention_plan;
  require(ap.num_threads >= 0 && ap.fixed_kv_chunk >= 0 && ap.min_kv_chunk >= 1,
          "KVCacheConfig.attention_plan: num_threads = ", ap.num_threads,
          ", fixed_kv_chunk = ", ap.fixed_kv_chunk, ", min_kv_chunk = ", ap.min_kv_chunk,
          " must be >= 0, >= 0 and >= 1");
  require(c.device == KVDevice::kCpu || c.device == KVDevice::kCuda,
          "KVCacheConfig.device = ", static_cast<int>(c.device), " is not a KVDevice");
  require(c.layout == KVLayout::kHND || c.layout == KVLayout::kNHD,
          "KVCacheConfig.layout = ", static_cast<int>(c.layout), " is not HND or NHD");
  require(c.num_pages >= 0, "KVCacheConfig.num_pages = ", c.num_pages, " must be >= 0");
  require(c.memory_budget_bytes >= 0, "KVCacheConfig.memory_budget_bytes = ", c.memory_budget_bytes,
          " must be >= 0");
  require(c.num_pages == 0 || c.memory_budget_bytes == 0, "KVCacheConfig: give num_pages (",
          c.num_pages, ") or memory_budget_bytes (", c.memory_budget_bytes, "), not both");

  // Per-page bytes: dims x heads x 4 (the widest dtype) x page_size x layers
  // must fit in int64. Checked by division so that no product can overflow.
  constexpr std::int64_t kMax = std::numeric_limits<std::int64_t>::max();
  const std::int64_t dims = std::int64_t{c.head_dim} + c.v_head_dim;
  require(dims <= kMax / 4 / c.num_kv_heads / c.page_size / c.num_layers,
          "KVCacheConfig: one page over all layers exceeds 2^63 bytes");
  const std::int64_t page_bytes = PageStorage::page_bytes(c);

  if (c.num_pages == 0) {
    require(c.memory_budget_bytes > 0,
            "KVCacheConfig: num_pages = 0 and memory_budget_bytes = 0;"
            " give one of them");
    c.num_pages = c.memory_budget_bytes / page_bytes;
    require(c.num_pages >= 1, "KVCacheConfig.memory_budget_bytes = ", c.memory_budget_bytes,
            " holds no page (one page over all layers is ", page_bytes, " bytes)");
  }
  constexpr std::int64_t kMaxPages = std::numeric_limits<std::int32_t>::max();
  if (c.num_pages > kMaxPages) {
    require(in.num_pages == 0, "KVCacheConfig.num_pages = ", c.num_pages, " exceeds ", kMaxPages);
    c.num_pages = kMaxPages;  // a huge budget is capped, page ids are 32-bit
  }
  require(c.num_pages <= kMax / page_bytes, "KVCacheConfig: num_pages = ", c.num_pages, " x ",
          page_bytes, " bytes per page overflows 64 bits");
  resolve_host_tier(c, page_bytes);
  return c;
}

const char* device_name(KVDevice device) {
  switch (device) {
    case KVDevice::kCpu:
      return "cpu";
    case KVDevice::kCuda:
      return "cuda";
  }
  return "unknown";
}

}  // namespace pagedattn::cache
