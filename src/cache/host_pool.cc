#include "host_pool.h"

#include "pagedattn/kv_ops.h"

namespace pagedattn::cache {

KVCacheConfig host_tier_config(const KVCacheConfig& device_config) {
  KVCacheConfig c = device_config;
  c.num_pages = device_config.host_num_pages;
  c.memory_budget_bytes = 0;
  return c;
}

void copy_pages_between(const PageStorage& src, const PageStorage& dst,
                        std::span<const std::pair<std::int64_t, std::int64_t>> pairs) {
  if (pairs.empty()) return;
  for (std::int32_t layer = 0; layer < src.num_layers(); ++layer)
    copy_pages(src.layer(layer), dst.layer(layer), pairs);
}

}  // namespace pagedattn::cache
