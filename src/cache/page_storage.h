// PageStorage owns the K/V bytes of every layer: per layer, num_pages K pages,
// then num_pages V pages; an int8 K page holds the page's per-token-head K
// and V scales after its K block (layer() says how). A CPU
// cache's memory comes from an anonymous mapping, so untouched pages cost
// nothing and read as zero; a device cache's from its KVDeviceBackend (zeroed
// too), and every byte moves through the backend. All offsets are 64-bit.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <utility>

#include "hasher.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/kv_device.h"

namespace pagedattn::cache {

// Where a storage's bytes live.
enum class StorageKind : std::uint8_t {
  kHost,         // an anonymous mapping, with e4m3 NaN flags: a CPU cache's pages and host tier
  kHostStaging,  // an anonymous mapping without NaN flags: a device cache's passing host copies
  kHostPinned,   // backend->allocate_host, without NaN flags: a device cache's host tier
  kDevice,       // backend->allocate_zeroed, without NaN flags: a device cache's pages
};

class PageStorage {
 public:
  // `config` must be validated and resolved (num_pages, v_head_dim set).
  // kHostPinned and kDevice need `backend`. Only kHost keeps e4m3 NaN flags:
  // nothing attends over a device cache's host copies, and the device
  // kernels look for NaN codes themselves.
  explicit PageStorage(const KVCacheConfig& config, StorageKind kind = StorageKind::kHost,
                       std::shared_ptr<KVDeviceBackend> backend = nullptr);
  ~PageStorage();
  PageStorage(const PageStorage&) = delete;
  PageStorage& operator=(const PageStorage&) = delete;

  // K+V bytes of one page, one layer / all layers.
  static std::int64_t layer_page_bytes(const KVCacheConfig& config);
  static std::int64_t page_bytes(const KVCacheConfig& config);

  std::int64_t total_bytes() const { return total_bytes_; }
  std::int32_t num_layers() const { return config_.num_layers; }
  bool on_device() const { return kind_ == StorageKind::kDevice; }
  // The backend of a kDevice or kHostPinned storage (else null).
  KVDeviceBackend* backend() const { return backend_.get(); }
  // Pointers into device memory for a kDevice storage (fp8 head scales too).
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
  // theirs from flag_nan_pages. No-ops for other dtypes and kinds.
  void clear_nan_flags(std::int32_t page);
  void flag_nan_pages(std::int32_t page);
  // Hashes the K/V (and int8 scales) of slots [0, num_slots) of `page` in
  // every layer (a device page is copied to the host first).
  void hash_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const;

 private:
  std::byte* layer_base(std::int32_t layer) const { return base_ + layer * layer_bytes_; }
  // A layer's row of nan_flags_ (null for other dtypes).
  std::uint8_t* nan_flags(std::int32_t layer) const {
    return nan_flags_ ? nan_flags_.get() + std::int64_t{layer} * config_.num_pages : nullptr;
  }
  void allocate();
  void copy_slots_on_device(std::int32_t src, std::int32_t src_slot, std::int32_t dst,
                            std::int32_t dst_slot, std::int32_t num_slots);
  void hash_device_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const;

  KVCacheConfig config_;
  StorageKind kind_ = StorageKind::kHost;
  std::shared_ptr<KVDeviceBackend> backend_;
  std::int64_t k_page_bytes_ = 0;
  std::int64_t v_page_bytes_ = 0;
  std::int64_t scale_page_bytes_ = 0;  // int8 token scales of one page, K or V (in its K page)
  std::int64_t layer_bytes_ = 0;
  std::int64_t total_bytes_ = 0;
  std::byte* base_ = nullptr;
  std::unique_ptr<std::uint8_t[]> nan_flags_;  // e4m3: [num_layers][num_pages]
  // kDevice with fp8 per-head scales: [k_head_scales][v_head_scales] on the device.
  float* device_head_scales_ = nullptr;
};

// Copies whole pages (every layer; pairs of (source page, destination page))
// from one storage to another of the same page shape, with the kernels'
// copy_pages (vLLM swap_blocks); through the backend when one side is a
// device storage (the other then a host one).
void copy_pages_between(const PageStorage& src, const PageStorage& dst,
                        std::span<const std::pair<std::int64_t, std::int64_t>> pairs);

}  // namespace pagedattn::cache
