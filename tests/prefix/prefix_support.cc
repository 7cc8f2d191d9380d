#include "prefix_support.h"

#include <gtest/gtest.h>

#include "support/kv_values.h"

namespace pagedattn::test {

KVCacheConfig prefix_config(std::int32_t page_size, std::int64_t num_pages, std::int64_t host_pages,
                            DType dtype, AttentionKind kind) {
  KVCacheConfig c;
  c.num_layers = 2;
  c.num_qo_heads = 4;
  c.num_kv_heads = kind == AttentionKind::kMLA ? 1 : 2;
  c.attention_kind = kind;
  c.head_dim = 4;
  c.v_head_dim = 3;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.kv_dtype = dtype;
  c.enable_prefix_caching = true;
  c.host_num_pages = host_pages;
  return c;
}

std::vector<std::uint64_t> prefix_uids(std::span<const std::int32_t> tokens, std::uint64_t salt) {
  std::vector<std::uint64_t> uids;
  std::uint64_t h = 0x9e3779b97f4a7c15ull ^ salt;
  for (std::int32_t t : tokens) {
    h = (h ^ static_cast<std::uint32_t>(t)) * 0x100000001b3ull;
    h ^= h >> 29;
    uids.push_back(h);
  }
  return uids;
}

namespace {

void compute(PagedKVCache& kv, SeqId id, std::span<const std::int32_t> tokens, std::int64_t from,
             std::uint64_t salt) {
  const std::vector<SeqId> ids = {id};
  const std::vector<std::int64_t> lens = {std::ssize(tokens) - from};
  kv.begin_forward(ids, lens);
  const std::vector<std::uint64_t> uids = prefix_uids(tokens, salt);
  write_kv(kv, id, from, std::span<const std::uint64_t>(uids).subspan(std::size_t(from)));
  kv.end_forward();
  kv.set_sequence_tokens(id, tokens);
}

}  // namespace

std::int64_t prefill(PagedKVCache& kv, SeqId id, std::span<const std::int32_t> tokens,
                     std::uint64_t salt) {
  const std::int64_t held = kv.add_sequence_with_prefix(id, tokens, salt);
  compute(kv, id, tokens, held, salt);
  return held;
}

void decode(PagedKVCache& kv, SeqId id, std::vector<std::int32_t>& tokens,
            std::span<const std::int32_t> more, std::uint64_t salt) {
  const std::int64_t from = std::ssize(tokens);
  tokens.insert(tokens.end(), more.begin(), more.end());
  compute(kv, id, tokens, from, salt);
}

std::string check_prefix_kv(const PagedKVCache& kv, SeqId id, std::span<const std::int32_t> tokens,
                            std::uint64_t salt) {
  return check_tokens(kv, id, 0, prefix_uids(tokens, salt));
}

void expect_ok(const PagedKVCache& kv) {
  EXPECT_NO_THROW(kv.check_invariants());
}

std::vector<std::int32_t> token_run(std::int32_t first, std::int64_t n) {
  std::vector<std::int32_t> t;
  for (std::int64_t i = 0; i < n; ++i) t.push_back(first + static_cast<std::int32_t>(i));
  return t;
}

}  // namespace pagedattn::test
