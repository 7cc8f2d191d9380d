// Sequence life-cycle scenarios: prefill then decode, removal and re-add,
// page recycling. CacheDriver compares the cache with the shadow model after
// each step; the tests add explicit expectations on lengths and page ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Pages = std::vector<std::int32_t>;

class LifecycleScenarios : public ScenarioTest {};

// No forks:  1  2  3 prefilled together; 4 joins later; 2 leaves.
// Page size 16: lengths 7, 16 and 33 hold 1, 1 and 3 pages.
TEST_P(LifecycleScenarios, PrefillThenMixedDecode) {
  CacheDriver d(config(16, 32));
  d.add(1);
  d.add(2);
  d.add(3);
  const BatchPlan prefill = d.step({1, 2, 3}, {7, 16, 33});
  EXPECT_EQ(prefill.qo_indptr, (std::vector<std::int32_t>{0, 7, 23, 56}));
  EXPECT_EQ(prefill.kv_indptr, (std::vector<std::int32_t>{0, 1, 2, 5}));
  EXPECT_EQ(d.kv().num_free_pages(), 27);

  for (int step = 0; step < 24; ++step) {
    std::vector<SeqId> ids = {1, 3};
    std::vector<std::int64_t> lens = {1, 1};
    if (step < 10) {  // 2 decodes until it leaves
      ids.push_back(2);
      lens.push_back(1);
    }
    if (step == 5) d.add(4);
    if (step >= 5) {  // 4 prefills 20 tokens, then decodes
      ids.insert(ids.begin(), 4);
      lens.insert(lens.begin(), step == 5 ? 20 : 1);
    }
    if (step == 12) lens[ids.size() - 2] = 5;  // a chunk for sequence 1
    if (step == 10) d.remove(2);
    d.step(ids, lens);
    d.expect_matches();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << step;
  }
  EXPECT_EQ(d.kv().sequence_length(1), 7 + 24 + 4);
  EXPECT_EQ(d.kv().sequence_length(3), 33 + 24);
  EXPECT_EQ(d.kv().sequence_length(4), 20 + 18);
  EXPECT_FALSE(d.kv().has_sequence(2));
  EXPECT_EQ(d.kv().total_sequence_length(), 35 + 57 + 38);
  EXPECT_EQ(d.kv().num_free_pages(), 32 - (3 + 4 + 3));
}

// No forks: 7 is removed and added again; the new 7 starts empty and never
// sees the old tokens, whatever pages it gets.
TEST_P(LifecycleScenarios, RemoveAndReAddTheSameId) {
  CacheDriver d(config(4, 8));
  d.add(7);
  d.add(8);
  d.step({7, 8}, {10, 3});
  const Pages old_pages = d.kv().sequence_pages(7);
  d.remove(7);
  EXPECT_FALSE(d.kv().has_sequence(7));
  EXPECT_EQ(d.kv().num_free_pages(), 7);
  d.add(7);
  EXPECT_EQ(d.kv().sequence_length(7), 0);
  EXPECT_TRUE(d.kv().sequence_pages(7).empty());
  d.step({7}, {6});
  const Pages new_pages = d.kv().sequence_pages(7);
  // The old pages are recycled (most recently freed first).
  for (std::int32_t p : new_pages)
    EXPECT_TRUE(std::find(old_pages.begin(), old_pages.end(), p) != old_pages.end()) << p;
  d.expect_matches();
  d.remove(7);
  d.add(7);
  d.fork(8, 9);
  d.step({7, 9}, {1, 1});
  d.expect_matches();
}

// No forks: fill the pool, free some sequences, refill: the freed pages are
// exactly the ones reused; removing everything returns every page.
TEST_P(LifecycleScenarios, PagesAreRecycledAfterRemovals) {
  CacheDriver d(config(4, 8));
  for (SeqId id = 1; id <= 4; ++id) d.add(id);
  d.step({1, 2, 3, 4}, {8, 8, 8, 8});
  EXPECT_EQ(d.kv().num_free_pages(), 0);
  expect_rejected<OutOfPages>(d.kv(), [&] {
    const std::vector<SeqId> ids = {1};
    const std::vector<std::int64_t> lens = {1};
    d.kv().begin_forward(ids, lens);
  });

  std::set<std::int32_t> freed;
  for (SeqId id : {2, 3})
    for (std::int32_t p : d.kv().sequence_pages(id)) freed.insert(p);
  d.remove(2);
  d.remove(3);
  EXPECT_EQ(d.kv().num_free_pages(), 4);
  d.add(5);
  d.step({5}, {16});
  const Pages reused = d.kv().sequence_pages(5);
  EXPECT_EQ(std::set<std::int32_t>(reused.begin(), reused.end()), freed);
  EXPECT_EQ(d.kv().num_free_pages(), 0);
  d.expect_matches();

  for (int round = 0; round < 3; ++round) {  // churn: remove all, refill
    for (SeqId id : d.kv().sequence_ids()) d.remove(id);
    EXPECT_TRUE(d.kv().empty());
    EXPECT_EQ(d.kv().num_free_pages(), 8);
    d.add(10 + round);
    d.step({10 + round}, {29});
    EXPECT_EQ(d.kv().num_free_pages(), 0);
    d.expect_matches();
  }
}

// No forks: a batch where the first sequences would fit but the last does
// not is refused whole; nothing is half-applied.
TEST_P(LifecycleScenarios, OutOfPagesBatchIsAllOrNothing) {
  CacheDriver d(config(4, 6));
  d.add(1);
  d.add(2);
  d.add(3);
  d.step({1}, {5});  // pages 0 1
  const std::vector<SeqId> ids = {1, 2, 3};
  const std::vector<std::int64_t> lens = {3, 4, 13};  // 0 + 1 + 4 pages, 4 free
  EXPECT_EQ(d.kv().pages_needed(ids, lens), 5);
  EXPECT_FALSE(d.kv().can_append(ids, lens));
  expect_rejected<OutOfPages>(d.kv(), [&] { d.kv().begin_forward(ids, lens); },
                              {"begin_forward", "needs 5 free pages, 4 of 6 are free"});
  EXPECT_FALSE(d.kv().in_forward());
  EXPECT_EQ(d.kv().sequence_length(1), 5);
  EXPECT_EQ(d.kv().sequence_length(2), 0);
  d.expect_matches();
  d.step(ids, {3, 4, 12});  // 0 + 1 + 3 pages: exactly fits
  EXPECT_EQ(d.kv().num_free_pages(), 0);
  d.expect_matches();
}

INSTANTIATE_TEST_SUITE_P(Kinds, LifecycleScenarios,
                         ::testing::Values(AttentionKind::kMHA, AttentionKind::kMLA), kind_name);

}  // namespace
}  // namespace pagedattn::test
