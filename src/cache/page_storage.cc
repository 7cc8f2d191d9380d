#include "page_storage.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include "kernels/nan_flags.h"
#include "pagedattn/errors.h"

namespace pagedattn::cache {
namespace {

std::int64_t k_bytes_per_page(const KVCacheConfig& c) {
  return std::int64_t{c.page_size} * c.num_kv_heads * c.head_dim *
         static_cast<std::int64_t>(dtype_size(c.kv_dtype));
}
bool has_v(const KVCacheConfig& c) {
  return c.attention_kind != AttentionKind::kMLA;
}
std::int64_t v_bytes_per_page(const KVCacheConfig& c) {
  if (!has_v(c)) return 0;
  return std::int64_t{c.page_size} * c.num_kv_heads * c.v_head_dim *
         static_cast<std::int64_t>(dtype_size(c.kv_dtype));
}

// int8 keeps a float scale per token and head beside each page, for K and
// V (MLA: for its one row).
std::int64_t scale_bytes_per_page(const KVCacheConfig& c) {
  return c.kv_dtype == DType::kINT8 ? std::int64_t{c.page_size} * c.num_kv_heads * 4 : 0;
}

}  // namespace

std::int64_t PageStorage::layer_page_bytes(const KVCacheConfig& c) {
  return k_bytes_per_page(c) + v_bytes_per_page(c) + (has_v(c) ? 2 : 1) * scale_bytes_per_page(c);
}

std::int64_t PageStorage::page_bytes(const KVCacheConfig& c) {
  return layer_page_bytes(c) * c.num_layers;
}

PageStorage::PageStorage(const KVCacheConfig& config)
    : config_(config),
      k_page_bytes_(k_bytes_per_page(config)),
      v_page_bytes_(v_bytes_per_page(config)),
      scale_page_bytes_(scale_bytes_per_page(config)),
      layer_bytes_(layer_page_bytes(config) * config.num_pages),
      total_bytes_(layer_bytes_ * config.num_layers) {
  void* p = mmap(nullptr, static_cast<std::size_t>(total_bytes_), PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw OutOfPages(detail::concat("PagedKVCache: could not map ", total_bytes_,
                                    " bytes of K/V storage (num_pages = ", config.num_pages, ")"));
  base_ = static_cast<std::byte*>(p);
  if (config.kv_dtype == DType::kFP8E4M3)
    nan_flags_ = std::make_unique<std::uint8_t[]>(
        static_cast<std::size_t>(std::int64_t{config.num_layers} * config.num_pages));
  // Huge pages: attention streams whole pages, 4 KiB TLB entries would thrash.
  madvise(p, static_cast<std::size_t>(total_bytes_), MADV_HUGEPAGE);
}

PageStorage::~PageStorage() {
  if (base_ != nullptr) munmap(base_, static_cast<std::size_t>(total_bytes_));
}

// A layer's region: [K pages][V pages][K token scales][V token scales]
// (MLA: [rows][row token scales]).
PagedKVStorage PageStorage::layer(std::int32_t layer) const {
  std::byte* k = layer_base(layer);
  std::byte* v = k + k_page_bytes_ * config_.num_pages;
  std::byte* scales = v + v_page_bytes_ * config_.num_pages;
  const KVCacheConfig& c = config_;
  if (c.attention_kind == AttentionKind::kMLA) {
    PagedKVStorage s = PagedKVStorage::latent(k, c.kv_dtype, c.layout, c.page_size, c.head_dim,
                                              c.v_head_dim, c.num_pages);
    s.k_scale = c.k_scale;
    s.k_head_scales = c.k_head_scales.empty() ? nullptr : c.k_head_scales.data();
    if (scale_page_bytes_ > 0) s.k_token_scales = reinterpret_cast<float*>(scales);
    s.share_k_scales_with_v();
    s.page_may_hold_nan = nan_flags(layer);
    return s;
  }
  PagedKVStorage s = PagedKVStorage::dense(k, v, c.kv_dtype, c.layout, c.page_size, c.num_kv_heads,
                                           c.head_dim, c.v_head_dim, c.num_pages);
  s.page_may_hold_nan = nan_flags(layer);
  s.k_scale = c.k_scale;
  s.v_scale = c.v_scale;
  s.k_head_scales = c.k_head_scales.empty() ? nullptr : c.k_head_scales.data();
  s.v_head_scales = c.v_head_scales.empty() ? nullptr : c.v_head_scales.data();
  if (scale_page_bytes_ > 0) {
    s.k_token_scales = reinterpret_cast<float*>(scales);
    s.v_token_scales = reinterpret_cast<float*>(scales + scale_page_bytes_ * c.num_pages);
  }
  return s;
}

void PageStorage::copy_slots(std::int32_t src, std::int32_t src_slot, std::int32_t dst,
                             std::int32_t dst_slot, std::int32_t num_slots) {
  const auto elem = static_cast<std::int64_t>(dtype_size(config_.kv_dtype));
  // HND keeps each head's slots contiguous (one run per head); NHD keeps the
  // whole slot range of the page contiguous (one run).
  const bool hnd = config_.layout == KVLayout::kHND;
  const std::int32_t runs = hnd ? config_.num_kv_heads : 1;
  const std::int64_t heads_per_run = hnd ? 1 : config_.num_kv_heads;
  const auto k_run = static_cast<std::size_t>(num_slots * heads_per_run * config_.head_dim * elem);
  const auto v_run =
      static_cast<std::size_t>(num_slots * heads_per_run * config_.v_head_dim * elem);
  for (std::int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const PagedKVStorage s = this->layer(layer);
    auto* k = static_cast<std::byte*>(s.k_data);
    auto* v = static_cast<std::byte*>(s.v_data);
    for (std::int32_t r = 0; r < runs; ++r) {
      std::memcpy(k + s.k_offset(dst, r, dst_slot) * elem, k + s.k_offset(src, r, src_slot) * elem,
                  k_run);
      if (!s.v_in_k)
        std::memcpy(v + s.v_offset(dst, r, dst_slot) * elem,
                    v + s.v_offset(src, r, src_slot) * elem, v_run);
    }
    if (std::uint8_t* flags = s.page_may_hold_nan) flags[dst] |= flags[src];
    if (s.k_token_scales == nullptr) continue;
    for (std::int32_t h = 0; h < config_.num_kv_heads; ++h) {
      std::copy_n(s.k_token_scales + s.token_scale_index(src, h, src_slot), num_slots,
                  s.k_token_scales + s.token_scale_index(dst, h, dst_slot));
      if (!s.v_in_k)
        std::copy_n(s.v_token_scales + s.token_scale_index(src, h, src_slot), num_slots,
                    s.v_token_scales + s.token_scale_index(dst, h, dst_slot));
    }
  }
}

void PageStorage::clear_nan_flags(std::int32_t page) {
  for (std::int32_t layer = 0; nan_flags_ && layer < config_.num_layers; ++layer)
    nan_flags(layer)[page] = 0;
}

void PageStorage::flag_nan_pages(std::int32_t page) {
  for (std::int32_t layer = 0; nan_flags_ && layer < config_.num_layers; ++layer)
    if (kernels::page_holds_e4m3_nan(this->layer(layer), page)) nan_flags(layer)[page] = 1;
}

void PageStorage::hash_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const {
  const auto elem = static_cast<std::size_t>(dtype_size(config_.kv_dtype));
  const auto k_row = static_cast<std::size_t>(config_.head_dim) * elem;
  const auto v_row = static_cast<std::size_t>(config_.v_head_dim) * elem;
  for (std::int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const PagedKVStorage s = this->layer(layer);
    const auto* k = static_cast<const std::byte*>(s.k_data);
    const auto* v = static_cast<const std::byte*>(s.v_data);
    for (std::int32_t head = 0; head < config_.num_kv_heads; ++head) {
      for (std::int32_t slot = 0; slot < num_slots; ++slot) {
        h.add_bytes(k + s.k_offset(page, head, slot) * static_cast<std::int64_t>(elem), k_row);
        if (!s.v_in_k)
          h.add_bytes(v + s.v_offset(page, head, slot) * static_cast<std::int64_t>(elem), v_row);
      }
      if (s.k_token_scales == nullptr) continue;
      const auto n = static_cast<std::size_t>(num_slots);
      h.add_span(std::span<const float>(s.k_token_scales + s.token_scale_index(page, head, 0), n));
      if (!s.v_in_k)
        h.add_span(
            std::span<const float>(s.v_token_scales + s.token_scale_index(page, head, 0), n));
    }
  }
}

}  // namespace pagedattn::cache
