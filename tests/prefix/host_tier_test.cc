// The host-memory tier: cached pages demoted from the device pool and hit
// from the host, and swap_out / swap_in of whole sequences (bit-exact,
// sharing preserved, transactional).
#include <gtest/gtest.h>

#include <vector>

#include "prefix_support.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

TEST(HostTier, EvictedCachedPagesAreDemotedAndHitFromTheHost) {
  PagedKVCache kv(prefix_config(4, 4, /*host_pages=*/3));
  const std::vector<std::int32_t> a = token_run(1, 9);
  prefill(kv, 1, a);  // pages a1 a2 (cached) + a partial one
  kv.remove_sequence(1);
  prefill(kv, 2, token_run(50, 16));  // all 4 device pages: a1, a2 are demoted
  PrefixCacheStats s = kv.prefix_cache_stats();
  EXPECT_EQ(s.evictions, 2);
  EXPECT_EQ(s.demotions, 2);
  EXPECT_EQ(kv.num_free_host_pages(), 3);  // cached host pages count as free
  kv.pop_n(2, 13);  // seq 2's pages 2-4 become cached again: 3 free device pages
  const PrefixMatch m = kv.match_prefix(a);
  EXPECT_EQ(m.num_tokens, 8);
  EXPECT_EQ(m.host_pages, 2);
  EXPECT_EQ(m.pages_taken, 2);
  EXPECT_EQ(prefill(kv, 3, a), 8);
  EXPECT_EQ(check_prefix_kv(kv, 3, a), "");
  s = kv.prefix_cache_stats();
  EXPECT_EQ(s.host_hit_tokens, 8);
  // Promoted: the pages are device pages again, matchable without a copy.
  EXPECT_EQ(kv.match_prefix(a).device_pages, 2);
  expect_ok(kv);
}

TEST(HostTier, HostHitsNeedFreeDevicePages) {
  PagedKVCache kv(prefix_config(4, 3, /*host_pages=*/2));
  const std::vector<std::int32_t> a = token_run(1, 9);
  prefill(kv, 1, a);
  kv.remove_sequence(1);
  prefill(kv, 2, token_run(50, 12));  // a's pages go to the host
  EXPECT_EQ(kv.num_free_pages(), 0);
  EXPECT_EQ(kv.match_prefix(a).host_pages, 2);
  expect_rejected<OutOfPages>(kv, [&] { kv.add_sequence_with_prefix(3, a); }, {"free pages"});
  EXPECT_FALSE(kv.has_sequence(3));
  expect_ok(kv);
}

// Reads every token of a sequence as float (compared exactly).
KVBuffers all_kv(const PagedKVCache& kv, SeqId id) {
  return read_kv(kv, id, 0, kv.sequence_length(id));
}

TEST(HostTier, SwapRoundTripIsBitExactAndKeepsSharing) {
  for (const auto& [dtype, kind] :
       {std::pair{DType::kF32, AttentionKind::kMHA}, std::pair{DType::kBF16, AttentionKind::kMHA},
        std::pair{DType::kINT8, AttentionKind::kMHA}, std::pair{DType::kBF16, AttentionKind::kMLA},
        std::pair{DType::kINT8, AttentionKind::kMLA}}) {
    SCOPED_TRACE(::testing::Message() << dtype_name(dtype) << ", kind " << int(kind));
    KVCacheConfig c = prefix_config(4, 12, /*host_pages=*/8, dtype, kind);
    c.enable_prefix_caching = false;  // swapping works without caching too
    PagedKVCache kv(c);
    prefill(kv, 1, token_run(1, 10));
    kv.fork_sequence(1, 2, 9);  // shares 2 pages, copies the partial third
    prefill(kv, 3, token_run(30, 3));
    const KVBuffers one = all_kv(kv, 1), two = all_kv(kv, 2);
    const std::vector<SeqId> both = {1, 2};
    const std::int64_t free_before = kv.num_free_pages();
    kv.swap_out(both);
    EXPECT_TRUE(kv.is_swapped(1));
    EXPECT_FALSE(kv.is_swapped(3));
    EXPECT_EQ(kv.num_free_pages() - free_before, 4);
    EXPECT_EQ(kv.num_free_host_pages(), 4);  // 4 distinct pages, not 5
    EXPECT_EQ(kv.prefix_cache_stats().swapped_out_pages, 4);
    EXPECT_EQ(kv.swap_in_pages_needed(both), 4);
    const std::vector<SeqId> one_id = {1};
    const std::vector<std::int64_t> lens = {1};
    expect_rejected<InvalidState>(kv, [&] { kv.begin_forward(one_id, lens); }, {"swapped"});
    expect_rejected<InvalidState>(kv, [&] { kv.fork_sequence(1, 5); }, {"swapped"});
    expect_rejected<InvalidState>(kv, [&] { kv.pop_n(1, 1); }, {"swapped"});
    expect_rejected<InvalidState>(kv, [&] { (void)all_kv(kv, 1); }, {"swapped"});
    expect_rejected<InvalidState>(kv, [&] { kv.swap_out(one_id); }, {"already swapped"});
    const std::vector<SeqId> three = {3};
    expect_rejected<InvalidState>(kv, [&] { kv.swap_in(three); }, {"not swapped"});
    expect_ok(kv);
    kv.swap_in(both);
    EXPECT_FALSE(kv.is_swapped(1));
    EXPECT_EQ(kv.num_free_host_pages(), 8);
    EXPECT_EQ(kv.num_free_pages(), free_before);
    const std::vector<std::int32_t> p1 = kv.sequence_pages(1), p2 = kv.sequence_pages(2);
    EXPECT_EQ(p1[0], p2[0]);
    EXPECT_EQ(p1[1], p2[1]);
    EXPECT_NE(p1[2], p2[2]);
    EXPECT_EQ(all_kv(kv, 1).k, one.k);
    EXPECT_EQ(all_kv(kv, 1).v, one.v);
    EXPECT_EQ(all_kv(kv, 2).k, two.k);
    EXPECT_EQ(all_kv(kv, 2).v, two.v);
    expect_ok(kv);
    kv.remove_sequence(1);
    kv.remove_sequence(2);
    kv.remove_sequence(3);
    EXPECT_TRUE(kv.empty());
  }
}

TEST(HostTier, SwapOfOneSharerKeepsTheDeviceCopyForTheOther) {
  PagedKVCache kv(prefix_config(4, 8, /*host_pages=*/4));
  const std::vector<std::int32_t> a = token_run(1, 8);
  prefill(kv, 1, a);
  kv.fork_sequence(1, 2);
  const KVBuffers two = all_kv(kv, 2);
  const std::vector<SeqId> one = {1};
  kv.swap_out(one);
  EXPECT_EQ(kv.page_refcount(kv.sequence_pages(2)[0]), 1);
  EXPECT_EQ(kv.num_free_host_pages(), 2);
  // A swapped sequence can be removed; its host pages return.
  kv.remove_sequence(1);
  EXPECT_EQ(kv.num_free_host_pages(), 4);
  EXPECT_EQ(all_kv(kv, 2).k, two.k);
  expect_ok(kv);
}

TEST(HostTier, SwapFailuresLeaveTheCacheUnchanged) {
  PagedKVCache kv(prefix_config(4, 6, /*host_pages=*/2));
  prefill(kv, 1, token_run(1, 10));  // 3 pages
  const std::vector<SeqId> one = {1};
  expect_rejected<OutOfPages>(kv, [&] { kv.swap_out(one); }, {"host pages"});
  kv.pop_n(1, 4);  // 2 pages
  kv.swap_out(one);
  prefill(kv, 2, token_run(50, 20));  // 5 pages, 6th... the device is full but one
  EXPECT_EQ(kv.num_free_pages(), 1);
  expect_rejected<OutOfPages>(kv, [&] { kv.swap_in(one); }, {"free pages"});
  kv.pop_n(2, 8);
  kv.swap_in(one);
  EXPECT_EQ(check_prefix_kv(kv, 1, token_run(1, 6)), "");
  const std::vector<SeqId> twice = {1, 1}, missing = {7};
  expect_rejected<InvalidArgument>(kv, [&] { kv.swap_out(twice); }, {"more than once"});
  expect_rejected<InvalidArgument>(kv, [&] { kv.swap_out(missing); }, {"does not exist"});
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {0};
  kv.begin_forward(ids, lens);
  expect_rejected<InvalidState>(kv, [&] { kv.swap_out(one); }, {"forward"});
  kv.end_forward();
  PagedKVCache no_host(prefix_config(4, 4));
  no_host.add_sequence(1);
  expect_rejected<InvalidState>(no_host, [&] { no_host.swap_out(one); }, {"no host tier"});
  expect_ok(kv);
}

TEST(HostTier, SwapOutRefusesOpenTokenTrees) {
  PagedKVCache kv(prefix_config(4, 6, /*host_pages=*/4));
  prefill(kv, 1, token_run(1, 5));
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {2}, parents = {-1, -1};
  kv.begin_forward(ids, lens, parents);
  end_metadata_step(kv);
  expect_rejected<InvalidState>(kv, [&] { kv.swap_out(ids); }, {"token tree"});
}

TEST(HostTier, ConfigValidatesTheHostFields) {
  KVCacheConfig c = prefix_config(4, 4);
  c.host_num_pages = -1;
  EXPECT_THROW(PagedKVCache{c}, InvalidArgument);
  c.host_num_pages = 2;
  c.host_memory_budget_bytes = 100;
  EXPECT_THROW(PagedKVCache{c}, InvalidArgument);
  c.host_num_pages = 0;
  c.host_memory_budget_bytes = 1;  // less than a page
  EXPECT_THROW(PagedKVCache{c}, InvalidArgument);
  PagedKVCache probe(prefix_config(4, 4));
  c.host_memory_budget_bytes = 5 * probe.bytes_per_page() + 1;
  PagedKVCache kv(c);
  EXPECT_EQ(kv.config().host_num_pages, 5);
  EXPECT_EQ(kv.num_host_pages(), 5);
}

}  // namespace
}  // namespace pagedattn::test
