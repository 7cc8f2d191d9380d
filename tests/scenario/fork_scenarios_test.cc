// Fork scenarios in the spirit of TVM's PagedKVCache tests. Every test drives
// the cache and the shadow model in lockstep (CacheDriver) and also states
// the page ids / refcounts it expects explicitly. Page ids come from the pool
// lowest first, so a fresh cache hands out 0, 1, 2, ...
#include <gtest/gtest.h>

#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Pages = std::vector<std::int32_t>;

class ForkScenarios : public ScenarioTest {};

// Fork tree (page_size 4, parent 0 holds 11 tokens = pages 0 1 2(3 used)):
//
//   0 (11) ─┬─ 1 @3  (ps-1)  copies page 0's first 3 slots
//           ├─ 2 @4  (ps)    shares page 0
//           ├─ 3 @5  (ps+1)  shares page 0, copies 1 slot of page 1
//           ├─ 4 @7  (2ps-1) shares page 0, copies 3 slots of page 1
//           ├─ 5 @8  (2ps)   shares pages 0 1
//           ├─ 6 @9  (2ps+1) shares pages 0 1, copies 1 slot of page 2
//           ├─ 7 @-1 (end)   shares pages 0 1, copies 3 slots of page 2
//           └─ 8 @0          empty
TEST_P(ForkScenarios, ForksAroundPageBoundariesAndAtTheEnd) {
  CacheDriver d(config(4, 32));
  d.add(0);
  d.step({0}, {11});
  ASSERT_EQ(d.kv().sequence_pages(0), (Pages{0, 1, 2}));

  const std::vector<std::pair<SeqId, std::int64_t>> forks = {{1, 3}, {2, 4}, {3, 5},  {4, 7},
                                                             {5, 8}, {6, 9}, {7, -1}, {8, 0}};
  for (const auto& [child, pos] : forks) d.fork(0, child, pos);
  d.expect_matches();

  // Shared full pages keep their ids; partial pages are fresh copies.
  const std::vector<std::pair<SeqId, std::size_t>> shared_prefix = {{1, 0}, {2, 1}, {3, 1}, {4, 1},
                                                                    {5, 2}, {6, 2}, {7, 2}, {8, 0}};
  for (const auto& [child, shared] : shared_prefix) {
    const Pages pages = d.kv().sequence_pages(child);
    const Pages parent = d.kv().sequence_pages(0);
    for (std::size_t i = 0; i < pages.size(); ++i)
      EXPECT_EQ(pages[i] == parent[i], i < shared) << "child " << child << " page " << i;
  }
  EXPECT_EQ(d.kv().page_refcount(0), 7);  // parent + children 2..7
  EXPECT_EQ(d.kv().page_refcount(1), 4);  // parent + children 5 6 7
  EXPECT_EQ(d.kv().page_refcount(2), 1);  // only the parent
  EXPECT_EQ(d.kv().sequence_length(4), 7);
  EXPECT_TRUE(d.kv().sequence_pages(8).empty());

  // Every sequence grows independently; nobody sees another's new tokens.
  d.step({0, 1, 2, 3, 4, 5, 6, 7, 8}, {2, 3, 1, 4, 1, 5, 2, 1, 6});
  d.step({1, 3, 5, 7}, {4, 4, 4, 4});
  d.expect_matches();
  for (SeqId child = 1; child <= 7; ++child)
    EXPECT_TRUE(check_tokens(d.kv(), child, 0, d.model().uids(0, 0, 3)).empty()) << child;
}

// Fork chain (page_size 4); every level appends 3 tokens, then forks at its end:
//
//   0 ── 1 ── 2 ── 3 ── 4 ── 5 ── 6 ── 7 ── 8 ── 9 ── 10
//
// Level k holds 3 + 3k tokens. Level 0's page is partial, so level 1 copies
// it; level 1's full first page (tokens 0-3) is then shared by levels 1..10.
// Level 3 fills its copy of page 2 (tokens 8-11), shared by levels 3..10.
TEST_P(ForkScenarios, ForkChainOfDepthTen) {
  constexpr SeqId kDepth = 10;
  CacheDriver d(config(4, 64));
  d.add(0);
  d.step({0}, {3});
  for (SeqId level = 1; level <= kDepth; ++level) {
    d.fork(level - 1, level);
    d.step({level}, {3});
    d.expect_matches();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "level " << level;
  }
  const std::int32_t page0 = d.kv().sequence_pages(kDepth)[0];
  EXPECT_EQ(d.kv().page_refcount(page0), kDepth);  // levels 1..10 (level 0 had a partial page)
  for (SeqId level = 0; level <= kDepth; ++level) {
    EXPECT_EQ(d.kv().sequence_length(level), 3 + 3 * level);
    // Each level starts with its parent's tokens.
    if (level > 0) {
      EXPECT_TRUE(check_tokens(d.kv(), level, 0, d.uids(level - 1)).empty()) << "level " << level;
    }
  }
  const std::int32_t page2 = d.kv().sequence_pages(3)[2];
  EXPECT_NE(d.kv().sequence_pages(2)[2], page2);
  for (SeqId level = 3; level <= kDepth; ++level)
    EXPECT_EQ(d.kv().sequence_pages(level)[2], page2) << "level " << level;
  EXPECT_EQ(d.kv().page_refcount(page2), kDepth - 2);

  // Removing the middle of the chain leaves every other level intact.
  d.remove(5);
  d.remove(2);
  d.expect_matches();
  EXPECT_EQ(d.kv().page_refcount(page0), kDepth - 2);
  // And a fork of the deepest level mid-page still works.
  d.fork(kDepth, 100, 17);
  d.step({100, kDepth}, {2, 2});
  d.expect_matches();
}

// Pop into a shared prefix, then append on both sides (page_size 4):
//
//   P (10 tokens: pages A=0 B=1 C=2(2 used))
//   ├── K = fork(P, -1)   shares A B, page 3 = copy of C
//   └── Q = fork(P, 4)    shares A
//
// pop_n(K, 4) -> K holds 6 tokens in A B (B shared, 2 slots used)
// pop_n(P, 3) -> P holds 7 tokens in A B (B shared, 3 slots used)
// append 2 to K -> B is shared: K copies it (copy-on-write), B drops to refcount 1
// append 1 to P -> B is P's alone now: written in place
TEST_P(ForkScenarios, PopIntoSharedPrefixThenAppendOnBothSides) {
  constexpr SeqId P = 1, K = 2, Q = 3;
  CacheDriver d(config(4, 16));
  d.add(P);
  d.step({P}, {10});
  d.fork(P, K);
  d.fork(P, Q, 4);
  ASSERT_EQ(d.kv().sequence_pages(K), (Pages{0, 1, 3}));
  ASSERT_EQ(d.kv().sequence_pages(Q), (Pages{0}));
  EXPECT_EQ(d.kv().page_refcount(0), 3);
  EXPECT_EQ(d.kv().page_refcount(1), 2);

  d.pop(K, 4);
  d.pop(P, 3);
  EXPECT_EQ(d.kv().sequence_pages(K), (Pages{0, 1}));
  EXPECT_EQ(d.kv().sequence_pages(P), (Pages{0, 1}));
  EXPECT_EQ(d.kv().num_free_pages(), 14);  // pages 2 and 3 came back
  d.expect_matches();
  const std::vector<std::uint64_t> q_before = d.uids(Q), p_before = d.uids(P);

  d.step({K}, {2});
  const Pages k_pages = d.kv().sequence_pages(K);
  EXPECT_EQ(k_pages[0], 0);
  EXPECT_NE(k_pages[1], 1) << "K must copy the shared page before writing";
  EXPECT_EQ(d.kv().page_refcount(1), 1);
  EXPECT_EQ(d.kv().page_refcount(k_pages[1]), 1);
  EXPECT_TRUE(check_tokens(d.kv(), P, 0, p_before).empty());

  d.step({P}, {1});
  EXPECT_EQ(d.kv().sequence_pages(P), (Pages{0, 1})) << "P's page is no longer shared";
  EXPECT_TRUE(check_tokens(d.kv(), Q, 0, q_before).empty());
  EXPECT_TRUE(
      check_tokens(d.kv(), K, 0, std::vector<std::uint64_t>(p_before.begin(), p_before.begin() + 6))
          .empty());
  EXPECT_EQ(d.kv().page_refcount(0), 3);
  d.expect_matches();
}

// Two sequences share one partially filled last page and both append in the
// same step (page_size 4, 3 pages):
//
//   P (8 tokens, pages 0 1) ── K = fork(P, -1) shares 0 1
//   pop_n(P, 1), pop_n(K, 2): both end inside shared page 1.
//
// Within the step P copies page 1 first; page 1 is then K's alone and K
// writes it in place. So the step takes exactly one page, and must succeed
// with the single free page (pages_needed is a dry run of begin_forward).
TEST_P(ForkScenarios, TwoSequencesCopyOnWriteTheSamePageInOneStep) {
  constexpr SeqId P = 1, K = 2;
  CacheDriver d(config(4, 3));
  d.add(P);
  d.step({P}, {8});
  d.fork(P, K);
  d.pop(P, 1);
  d.pop(K, 2);
  ASSERT_EQ(d.kv().num_free_pages(), 1);
  const std::vector<SeqId> ids = {P, K};
  const std::vector<std::int64_t> lens = {1, 1};
  EXPECT_EQ(d.kv().pages_needed(ids, lens), 1);
  EXPECT_TRUE(d.kv().can_append(ids, lens));
  d.step(ids, lens);
  EXPECT_EQ(d.kv().sequence_pages(P), (Pages{0, 2}));
  EXPECT_EQ(d.kv().sequence_pages(K), (Pages{0, 1}));
  EXPECT_EQ(d.kv().page_refcount(1), 1);
  EXPECT_EQ(d.kv().num_free_pages(), 0);
  d.expect_matches();
}

// A zero-length append never copies a shared page:
//
//   P (8 tokens, pages 0 1) ── K = fork(P, -1) shares 0 1
//   pop_n(K, 3) leaves K ending inside shared page 1; a step appending 0
//   tokens to K and P changes nothing at all.
TEST_P(ForkScenarios, ZeroLengthAppendDoesNotCopyASharedPage) {
  CacheDriver d(config(4, 8));
  d.add(1);
  d.step({1}, {8});
  d.fork(1, 2);
  d.pop(2, 3);  // K ends inside shared page 1
  const std::uint64_t digest = d.kv().state_digest();
  const BatchPlan plan = d.step({2, 1}, {0, 0});
  EXPECT_EQ(plan.num_tokens(), 0);
  EXPECT_EQ(d.kv().sequence_pages(2), (Pages{0, 1}));
  EXPECT_EQ(d.kv().page_refcount(1), 2);
  EXPECT_EQ(d.kv().state_digest(), digest);
}

// Removing a parent leaves its children intact (their shared pages survive):
//
//   1 (9 tokens) ─┬─ 2 @-1
//                 └─ 3 @4 ── 4 @-1
TEST_P(ForkScenarios, RemovingTheParentKeepsSharedPagesAlive) {
  CacheDriver d(config(4, 16));
  d.add(1);
  d.step({1}, {9});
  d.fork(1, 2);
  d.fork(1, 3, 4);
  d.fork(3, 4);
  d.remove(1);
  EXPECT_EQ(d.kv().page_refcount(0), 3);
  EXPECT_EQ(d.kv().page_refcount(1), 1);
  d.step({2, 3, 4}, {1, 2, 3});
  d.expect_matches();
  d.remove(3);
  d.remove(2);
  d.remove(4);
  EXPECT_TRUE(d.kv().empty());
}

INSTANTIATE_TEST_SUITE_P(Kinds, ForkScenarios,
                         ::testing::Values(AttentionKind::kMHA, AttentionKind::kMLA), kind_name);

}  // namespace
}  // namespace pagedattn::test
