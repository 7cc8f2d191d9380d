#pragma once

#include "pagedattn/kv_cache.h"

namespace pagedattn::cache {

// Validates every field (InvalidArgument naming it) and returns the config
// with v_head_dim and num_pages resolved.
KVCacheConfig resolve_config(const KVCacheConfig& config);

// "cpu", "cuda" (for messages).
const char* device_name(KVDevice device);

}  // namespace pagedattn::cache
