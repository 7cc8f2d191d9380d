// The keys a tile of query tokens may see: what both planners (CPU and CUDA)
// cut their work items by.
#pragma once

#include <algorithm>
#include <cstdint>
#include <utility>

#include "pagedattn/attention.h"

namespace pagedattn::kernels {

// Keys [begin, end) that any query of tokens [q_begin, q_end) of sequence b
// can see under the causal and window limits (the kernels mask per row
// inside the range).
inline std::pair<std::int32_t, std::int32_t> visible_keys(const PagedKVTable& t,
                                                          const AttentionOptions& o, std::int32_t b,
                                                          std::int32_t q_begin,
                                                          std::int32_t q_end) {
  const std::int64_t kv_len = t.kv_lens[b];
  const std::int64_t first_pos = kv_len - t.q_len(b) + q_begin;
  const std::int64_t last_pos = kv_len - t.q_len(b) + q_end - 1;
  std::int64_t end = o.causal ? std::min<std::int64_t>(kv_len, last_pos + 1) : kv_len;
  std::int64_t begin =
      o.window_left >= 0 ? std::max<std::int64_t>(0, first_pos - o.window_left) : 0;
  end = std::max<std::int64_t>(end, 0);
  begin = std::min(begin, end);
  return {static_cast<std::int32_t>(begin), static_cast<std::int32_t>(end)};
}

}  // namespace pagedattn::kernels
