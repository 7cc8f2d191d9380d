#include "page_storage.h"

#include <sys/mman.h>

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "core/placement.h"
#include "kernels/nan_flags.h"
#include "pagedattn/errors.h"
#include "pagedattn/kv_ops.h"

namespace pagedattn::cache {
namespace {

bool has_v(const KVCacheConfig& c) {
  return c.attention_kind != AttentionKind::kMLA;
}

std::int64_t round_up(std::int64_t bytes, std::int64_t to) {
  return (bytes + to - 1) / to * to;
}

// int8 keeps a float scale per token and head for K and for V (MLA: for its
// one row): one such block of each per page.
std::int64_t scale_bytes_per_page(const KVCacheConfig& c) {
  return c.kv_dtype == DType::kINT8 ? std::int64_t{c.page_size} * c.num_kv_heads * 4 : 0;
}

// Bytes of one page's block of `dim`-element rows (K or V).
std::int64_t block_bytes(const KVCacheConfig& c, std::int32_t dim) {
  return std::int64_t{c.page_size} * c.num_kv_heads * dim *
         static_cast<std::int64_t>(dtype_size(c.kv_dtype));
}

// Where an int8 page's K token scales start inside its K page: after the K
// block, 16-byte aligned. The V token scales follow them.
std::int64_t k_scales_offset(const KVCacheConfig& c) {
  return round_up(block_bytes(c, c.head_dim), 16);
}

// One page's K stride in bytes: the K block, then (int8) the page's K and V
// token scales, rounded up to a 64-byte line so that a page never starts
// less aligned than the block alone would (no padding where blocks and
// scales fill whole lines, as with page_size 16).
std::int64_t k_bytes_per_page(const KVCacheConfig& c) {
  if (c.kv_dtype != DType::kINT8) return block_bytes(c, c.head_dim);
  return round_up(k_scales_offset(c) + (has_v(c) ? 2 : 1) * scale_bytes_per_page(c), 64);
}
// One page's V stride in bytes: the V block (MLA: none).
std::int64_t v_bytes_per_page(const KVCacheConfig& c) {
  return has_v(c) ? block_bytes(c, c.v_head_dim) : 0;
}

}  // namespace

std::int64_t PageStorage::layer_page_bytes(const KVCacheConfig& c) {
  return k_bytes_per_page(c) + v_bytes_per_page(c);
}

std::int64_t PageStorage::page_bytes(const KVCacheConfig& c) {
  return layer_page_bytes(c) * c.num_layers;
}

PageStorage::PageStorage(const KVCacheConfig& config, StorageKind kind,
                         std::shared_ptr<KVDeviceBackend> backend)
    : config_(config),
      kind_(kind),
      backend_(std::move(backend)),
      k_page_bytes_(k_bytes_per_page(config)),
      v_page_bytes_(v_bytes_per_page(config)),
      scale_page_bytes_(scale_bytes_per_page(config)),
      layer_bytes_(layer_page_bytes(config) * config.num_pages),
      total_bytes_(layer_bytes_ * config.num_layers) {
  allocate();
  if (kind == StorageKind::kHost && config.kv_dtype == DType::kFP8E4M3)
    nan_flags_ = std::make_unique<std::uint8_t[]>(
        static_cast<std::size_t>(std::int64_t{config.num_layers} * config.num_pages));
}

void PageStorage::allocate() {
  const auto bytes = static_cast<std::size_t>(total_bytes_);
  if (kind_ == StorageKind::kDevice) {
    base_ = static_cast<std::byte*>(backend_->allocate_zeroed(bytes));
    const std::vector<float>& k = config_.k_head_scales;
    const std::vector<float>& v = config_.v_head_scales;
    if (k.empty() && v.empty()) return;
    std::vector<float> scales = k;  // [k_head_scales][v_head_scales], as the device reads them
    scales.insert(scales.end(), v.begin(), v.end());
    const std::size_t scale_bytes = scales.size() * sizeof(float);
    try {
      device_head_scales_ = static_cast<float*>(backend_->allocate_zeroed(scale_bytes));
      backend_->from_host(device_head_scales_, scales.data(), scale_bytes);
    } catch (...) {
      if (device_head_scales_) backend_->release(device_head_scales_, scale_bytes);
      backend_->release(base_, bytes);
      throw;
    }
    return;
  }
  if (kind_ == StorageKind::kHostPinned) {
    base_ = static_cast<std::byte*>(backend_->allocate_host(bytes));
    return;
  }
  const bool prefault = config_.prefault_pages && kind_ == StorageKind::kHost;
  // Touching a pool larger than the memory left would end the process (the
  // OOM killer) instead of failing here with a reason.
  const std::int64_t available = prefault ? core::available_memory_bytes() : -1;
  if (available >= 0 && total_bytes_ > available)
    throw OutOfPages(detail::concat("PagedKVCache: ", total_bytes_,
                                    " bytes of K/V storage (num_pages = ", config_.num_pages,
                                    ") are more than the ", available,
                                    " bytes of memory available (MemAvailable); give the cache "
                                    "a smaller budget"));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (p == MAP_FAILED)
    throw OutOfPages(detail::concat("PagedKVCache: could not map ", total_bytes_,
                                    " bytes of K/V storage (num_pages = ", config_.num_pages, ")"));
  base_ = static_cast<std::byte*>(p);
  // Huge pages: attention streams whole pages, 4 KiB TLB entries would thrash.
  madvise(p, bytes, MADV_HUGEPAGE);
  // Any thread reads any sequence's pages: spread them over the NUMA nodes
  // (core/placement.h), before the first touch places them.
  if (core::spread_memory_over_nodes()) core::interleave_pages(p, bytes);
  if (prefault) core::touch_pages(p, bytes);
}

PageStorage::~PageStorage() {
  if (base_ == nullptr) return;
  const auto bytes = static_cast<std::size_t>(total_bytes_);
  if (kind_ == StorageKind::kHost || kind_ == StorageKind::kHostStaging) {
    munmap(base_, bytes);
    return;
  }
  // Copies into or out of these bytes may still be queued.
  try {
    backend_->synchronize();
  } catch (...) {  // a device fault: nothing left to wait for
  }
  if (kind_ == StorageKind::kHostPinned) {
    backend_->release_host(base_, bytes);
    return;
  }
  if (device_head_scales_)
    backend_->release(
        device_head_scales_,
        (config_.k_head_scales.size() + config_.v_head_scales.size()) * sizeof(float));
  backend_->release(base_, bytes);
}

// A layer's region: its K pages, then its V pages (MLA: rows only). An int8
// K page is [K block][K token scales][V token scales][padding]: one K page
// stride holds everything of the page but its V block, for any v_head_dim
// (K and V share token_scale_page_stride), so a page moves as two
// contiguous runs, K and V, as with float storage.
PagedKVStorage PageStorage::layer(std::int32_t layer) const {
  std::byte* k = layer_base(layer);
  std::byte* v = k + k_page_bytes_ * config_.num_pages;
  const KVCacheConfig& c = config_;
  // fp8 per-head scales: the config's (host), or their device copy.
  const float* k_heads = c.k_head_scales.empty() ? nullptr : c.k_head_scales.data();
  const float* v_heads = c.v_head_scales.empty() ? nullptr : c.v_head_scales.data();
  if (device_head_scales_ != nullptr) {
    k_heads = k_heads ? device_head_scales_ : nullptr;
    v_heads = v_heads ? device_head_scales_ + c.k_head_scales.size() : nullptr;
  }
  // int8: elements are bytes, so the K page stride is k_page_bytes_.
  auto* const k_scales = reinterpret_cast<float*>(k + k_scales_offset(c));
  const std::int64_t scale_stride = k_page_bytes_ / static_cast<std::int64_t>(sizeof(float));
  if (c.attention_kind == AttentionKind::kMLA) {
    PagedKVStorage s = PagedKVStorage::latent(k, c.kv_dtype, c.layout, c.page_size, c.head_dim,
                                              c.v_head_dim, c.num_pages);
    s.k_scale = c.k_scale;
    s.k_head_scales = k_heads;
    if (scale_page_bytes_ > 0) {
      s.k_page_stride = s.v_page_stride = k_page_bytes_;
      s.k_token_scales = k_scales;
      s.token_scale_page_stride = scale_stride;
    }
    s.share_k_scales_with_v();
    s.page_may_hold_nan = nan_flags(layer);
    return s;
  }
  PagedKVStorage s = PagedKVStorage::dense(k, v, c.kv_dtype, c.layout, c.page_size, c.num_kv_heads,
                                           c.head_dim, c.v_head_dim, c.num_pages);
  s.page_may_hold_nan = nan_flags(layer);
  s.k_scale = c.k_scale;
  s.v_scale = c.v_scale;
  s.k_head_scales = k_heads;
  s.v_head_scales = v_heads;
  if (scale_page_bytes_ > 0) {
    s.k_page_stride = k_page_bytes_;
    s.k_token_scales = k_scales;
    s.v_token_scales = k_scales + scale_page_bytes_ / static_cast<std::int64_t>(sizeof(float));
    s.token_scale_page_stride = scale_stride;
  }
  return s;
}

void PageStorage::copy_slots(std::int32_t src, std::int32_t src_slot, std::int32_t dst,
                             std::int32_t dst_slot, std::int32_t num_slots) {
  if (kind_ == StorageKind::kDevice)
    return copy_slots_on_device(src, src_slot, dst, dst_slot, num_slots);
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

// The same copies as strided device copies: per layer one for K, one for V
// and one per int8 scale array, each over every head's run.
void PageStorage::copy_slots_on_device(std::int32_t src, std::int32_t src_slot, std::int32_t dst,
                                       std::int32_t dst_slot, std::int32_t num_slots) {
  const auto elem = static_cast<std::int64_t>(dtype_size(config_.kv_dtype));
  const bool hnd = config_.layout == KVLayout::kHND;
  const auto rows = static_cast<std::size_t>(hnd ? config_.num_kv_heads : 1);
  const std::int64_t heads_per_run = hnd ? 1 : config_.num_kv_heads;
  // Copies `row_elems` elements of `size` bytes per run, runs `pitch` elements apart.
  const auto copy_runs = [&](void* base, std::int64_t dst_at, std::int64_t src_at,
                             std::int64_t row_elems, std::int64_t pitch, std::int64_t size,
                             std::size_t num_rows) {
    DeviceCopy c;
    c.dst = static_cast<std::byte*>(base) + dst_at * size;
    c.src = static_cast<const std::byte*>(base) + src_at * size;
    c.row_bytes = static_cast<std::size_t>(row_elems * size);
    c.rows = num_rows;
    c.dst_pitch = c.src_pitch = static_cast<std::size_t>(pitch * size);
    backend_->copy(c);
  };
  for (std::int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const PagedKVStorage s = this->layer(layer);
    copy_runs(s.k_data, s.k_offset(dst, 0, dst_slot), s.k_offset(src, 0, src_slot),
              num_slots * heads_per_run * config_.head_dim, s.k_head_stride, elem, rows);
    if (!s.v_in_k)
      copy_runs(s.v_data, s.v_offset(dst, 0, dst_slot), s.v_offset(src, 0, src_slot),
                num_slots * heads_per_run * config_.v_head_dim, s.v_head_stride, elem, rows);
    if (s.k_token_scales == nullptr) continue;
    const auto heads = static_cast<std::size_t>(config_.num_kv_heads);
    constexpr std::int64_t kFloat = sizeof(float);
    copy_runs(s.k_token_scales, s.token_scale_index(dst, 0, dst_slot),
              s.token_scale_index(src, 0, src_slot), num_slots, s.page_size, kFloat, heads);
    if (!s.v_in_k)
      copy_runs(s.v_token_scales, s.token_scale_index(dst, 0, dst_slot),
                s.token_scale_index(src, 0, src_slot), num_slots, s.page_size, kFloat, heads);
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

namespace {

// Hashes slots [0, num_slots) of one page of one layer of `s`: `k` and `v`
// point at the page's K and V blocks, `k_scales` and `v_scales` at its int8
// token scales (null without), all host memory.
void hash_page(const PagedKVStorage& s, const std::byte* k, const std::byte* v,
               const float* k_scales, const float* v_scales, std::int32_t num_slots, Hasher& h) {
  const auto elem = static_cast<std::size_t>(dtype_size(s.dtype));
  const auto k_row = static_cast<std::size_t>(s.head_dim) * elem;
  const auto v_row = static_cast<std::size_t>(s.v_head_dim) * elem;
  for (std::int32_t head = 0; head < s.num_kv_heads; ++head) {
    for (std::int32_t slot = 0; slot < num_slots; ++slot) {
      h.add_bytes(k + s.k_offset(0, head, slot) * static_cast<std::int64_t>(elem), k_row);
      if (!s.v_in_k)
        h.add_bytes(v + s.v_offset(0, head, slot) * static_cast<std::int64_t>(elem), v_row);
    }
    if (k_scales == nullptr) continue;
    const auto n = static_cast<std::size_t>(num_slots);
    h.add_span(std::span<const float>(k_scales + s.token_scale_index(0, head, 0), n));
    if (!s.v_in_k)
      h.add_span(std::span<const float>(v_scales + s.token_scale_index(0, head, 0), n));
  }
}

}  // namespace

void PageStorage::hash_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const {
  if (kind_ == StorageKind::kDevice) return hash_device_slots(page, num_slots, h);
  if (kind_ == StorageKind::kHostPinned) backend_->synchronize();  // copies into it may be queued
  const auto elem = static_cast<std::int64_t>(dtype_size(config_.kv_dtype));
  for (std::int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const PagedKVStorage s = this->layer(layer);
    const auto* k = static_cast<const std::byte*>(s.k_data) + s.k_offset(page, 0, 0) * elem;
    const auto* v = static_cast<const std::byte*>(s.v_data) + s.v_offset(page, 0, 0) * elem;
    const float* k_scales =
        s.k_token_scales ? s.k_token_scales + s.token_scale_index(page, 0, 0) : nullptr;
    const float* v_scales =
        s.v_token_scales ? s.v_token_scales + s.token_scale_index(page, 0, 0) : nullptr;
    hash_page(s, k, v, k_scales, v_scales, num_slots, h);
  }
}

// The page's blocks of each layer copied to the host, then hashed as above.
void PageStorage::hash_device_slots(std::int32_t page, std::int32_t num_slots, Hasher& h) const {
  const auto elem = static_cast<std::int64_t>(dtype_size(config_.kv_dtype));
  std::vector<std::byte> k(static_cast<std::size_t>(k_page_bytes_));
  std::vector<std::byte> v(static_cast<std::size_t>(v_page_bytes_));
  const std::size_t scale_floats = static_cast<std::size_t>(scale_page_bytes_) / sizeof(float);
  std::vector<float> k_scales(scale_floats), v_scales(scale_floats);
  for (std::int32_t layer = 0; layer < config_.num_layers; ++layer) {
    const PagedKVStorage s = this->layer(layer);
    backend_->to_host(k.data(),
                      static_cast<const std::byte*>(s.k_data) + s.k_offset(page, 0, 0) * elem,
                      k.size());
    if (!s.v_in_k)
      backend_->to_host(v.data(),
                        static_cast<const std::byte*>(s.v_data) + s.v_offset(page, 0, 0) * elem,
                        v.size());
    if (s.k_token_scales != nullptr) {
      const std::size_t bytes = scale_floats * sizeof(float);
      backend_->to_host(k_scales.data(), s.k_token_scales + s.token_scale_index(page, 0, 0), bytes);
      if (!s.v_in_k)
        backend_->to_host(v_scales.data(), s.v_token_scales + s.token_scale_index(page, 0, 0),
                          bytes);
    }
    hash_page(s, k.data(), v.data(), s.k_token_scales ? k_scales.data() : nullptr,
              s.v_token_scales ? v_scales.data() : nullptr, num_slots, h);
  }
}

void copy_pages_between(const PageStorage& src, const PageStorage& dst,
                        std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  if (pairs.empty()) return;
  if (!src.on_device() && !dst.on_device()) {
    for (std::int32_t layer = 0; layer < src.num_layers(); ++layer)
      copy_pages(src.layer(layer), dst.layer(layer), pairs);
    return;
  }
  // A device cache's pages and its host tier (or a passing host copy).
  KVDeviceBackend& backend = src.on_device() ? *src.backend() : *dst.backend();
  const PageCopyDirection direction =
      src.on_device() ? PageCopyDirection::kDeviceToHost : PageCopyDirection::kHostToDevice;
  for (std::int32_t layer = 0; layer < src.num_layers(); ++layer)
    backend.copy_pages(src.layer(layer), dst.layer(layer), pairs, direction);
}

}  // namespace pagedattn::cache
