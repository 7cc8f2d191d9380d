// The host-memory tier: a second page pool and storage with the device
// pages' shape (every layer, K and V, int8 token scales), holding the pages
// of swapped-out sequences and cached prefix pages demoted from the device.
// Its pool works like the device pool: refcounts for swapped sequences
// (pages they share stay shared), an LRU list of cached pages.
#pragma once

#include <cstdint>
#include <span>
#include <utility>

#include "page_pool.h"
#include "page_storage.h"

namespace pagedattn::cache {

// `device_config` resolved; its host_num_pages (> 0) sizes the tier.
KVCacheConfig host_tier_config(const KVCacheConfig& device_config);

struct HostTier {
  explicit HostTier(const KVCacheConfig& device_config)
      : pool(device_config.host_num_pages), storage(host_tier_config(device_config)) {}

  PagePool pool;
  PageStorage storage;
};

// Copies whole pages (every layer; pairs of (source page, destination page))
// from one storage to another of the same page shape, with the kernels'
// copy_pages (vLLM swap_blocks).
void copy_pages_between(const PageStorage& src, const PageStorage& dst,
                        std::span<const std::pair<std::int64_t, std::int64_t>> pairs);

}  // namespace pagedattn::cache
