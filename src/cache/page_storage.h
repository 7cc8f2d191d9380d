// PageStorage owns the K/V bytes of every layer: per layer, num_pages K pages,
// num_pages V pages, then (int8 only) their per-token-head scales. Memory comes from an anonymous
// mapping, so untouched pages cost nothing and read as zero. All offsets are 64-bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>

#include "hasher.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::cache {

class PageStorage {
 public:
  // `config` must be validated and resolved (num_pages, v_head_dim set).
  explicit PageStorage(const KVCacheConfig& config);
  ~PageStorage();
  PageStorage(const PageStorage&) = delete;
  PageStorage& operator=(const PageStorage&) = delete;

  // K+V bytes of one page, one layer / all layers.
  static std::int64_t layer_page_bytes(const KVCacheConfig& config);
  static std::int64_t page_bytes(const KVCacheConfig& config);

  std::int64_t total_bytes() const { return total_bytes_; }
  std::int32_t num_layers() const { return config_.num_layers; }
  PagedKVStorage layer(std::int32_t layer) const;

  // Copies slots [0, num_slots) of page `src` to page `dst` in every layer.
  void copy_page_prefix(std::int32_t src, std::int32_t dst, std::int32_t num_slots) {
    copy_slots(src, 0, dst, 0, num_slots);
  }
  // Copies slots [src_slot, src_slot + num_slots) of page `src` to
  // [dst_slot, ...) of page `dst` in every layer (K, V, int8 scales). The
  // ranges must not overlap.
  void copy_slots(std::int32_t src, std::int32_t src_slot, std::int32_t dst, std::int32_t dst_slot,
                  std::int32_t num_slots);
  // e4m3 NaN flags (PagedKVStorage::page_may_hold_nan, kept per layer and
  // page): a page taken for a new owner starts clear in every layer
  // (clear_nan_flags); bytes written past append_paged_kv and copy_pages get
  // theirs from flag_nan_pages. No-ops for other dtypes.
  void clear_nan_flags(std::int32_t page);
  void flag_nan_pages(std::int32_t page);
  // Hashes the K/V (and int8 scales) of slots [0, num_slots) of `page` in
  // every layer.
  void hash_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const;

 private:
  std::byte* layer_base(std::int32_t layer) const { return base_ + layer * layer_bytes_; }
  // A layer's row of nan_flags_ (null for other dtypes).
  std::uint8_t* nan_flags(std::int32_t layer) const {
    return nan_flags_ ? nan_flags_.get() + std::int64_t{layer} * config_.num_pages : nullptr;
  }

  KVCacheConfig config_;
  std::int64_t k_page_bytes_ = 0;
  std::int64_t v_page_bytes_ = 0;
  std::int64_t scale_page_bytes_ = 0;  // int8 token scales of one page, K or V
  std::int64_t layer_bytes_ = 0;
  std::int64_t total_bytes_ = 0;
  std::byte* base_ = nullptr;
  std::unique_ptr<std::uint8_t[]> nan_flags_;  // e4m3: [num_layers][num_pages]
};

}  // namespace pagedattn::cache
