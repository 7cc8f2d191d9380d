#include "host_pool.h"

namespace pagedattn::cache {

KVCacheConfig host_tier_config(const KVCacheConfig& device_config) {
  KVCacheConfig c = device_config;
  c.num_pages = device_config.host_num_pages;
  c.memory_budget_bytes = 0;
  c.prefault_pages = false;  // swap space: mapped as swaps fill it
  return c;
}

}  // namespace pagedattn::cache
