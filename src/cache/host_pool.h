// The host-memory tier: a second page pool and storage with the device
// pages' shape (every layer, K and V, int8 token scales), holding the pages
// of swapped-out sequences and cached prefix pages demoted from the device.
// Its pool works like the device pool: refcounts for swapped sequences
// (pages they share stay shared), an LRU list of cached pages.
#pragma once

#include <cstdint>
#include <memory>

#include "page_pool.h"
#include "page_storage.h"

namespace pagedattn::cache {

// `device_config` resolved; its host_num_pages (> 0) sizes the tier.
KVCacheConfig host_tier_config(const KVCacheConfig& device_config);

struct HostTier {
  // A device cache's tier (`backend` given) lives in the backend's host
  // memory (pinned for CUDA) and moves pages through it.
  explicit HostTier(const KVCacheConfig& device_config,
                    std::shared_ptr<KVDeviceBackend> backend = nullptr)
      : pool(device_config.host_num_pages),
        storage(host_tier_config(device_config),
                backend ? StorageKind::kHostPinned : StorageKind::kHost, backend) {}

  PagePool pool;
  PageStorage storage;
};

}  // namespace pagedattn::cache
