// Helpers of the prefix-cache tests: a token's K/V test values are derived
// from its whole prefix of token ids (as a model's would be), so a page
// shared with the wrong content reads back wrong values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::test {

// A small config with prefix caching: 2 layers, GQA 4:2 (MLA: 4:1), head_dim
// 4, v_head_dim 3, f32, HND.
KVCacheConfig prefix_config(std::int32_t page_size, std::int64_t num_pages,
                            std::int64_t host_pages = 0, DType dtype = DType::kF32,
                            AttentionKind kind = AttentionKind::kMHA);

// uid of token j: a hash of (salt, tokens[0..j]).
std::vector<std::uint64_t> prefix_uids(std::span<const std::int32_t> tokens,
                                       std::uint64_t salt = 0);

// Adds `id` with add_sequence_with_prefix, computes the rest of `tokens` in
// one step (K/V from prefix_uids) and tells the cache all token ids.
// Returns the tokens that came from the cache.
std::int64_t prefill(PagedKVCache& kv, SeqId id, std::span<const std::int32_t> tokens,
                     std::uint64_t salt = 0);
// Appends `more` tokens to `id` (whose told tokens are `tokens`, extended in place).
void decode(PagedKVCache& kv, SeqId id, std::vector<std::int32_t>& tokens,
            std::span<const std::int32_t> more, std::uint64_t salt = 0);

// "" when the K/V of `id` equals prefix_uids(tokens, salt).
std::string check_prefix_kv(const PagedKVCache& kv, SeqId id, std::span<const std::int32_t> tokens,
                            std::uint64_t salt = 0);

// The cache's invariants hold (a gtest expectation).
void expect_ok(const PagedKVCache& kv);

// Token ids [first, first + n).
std::vector<std::int32_t> token_run(std::int32_t first, std::int64_t n);

}  // namespace pagedattn::test
