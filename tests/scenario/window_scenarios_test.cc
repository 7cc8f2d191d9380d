// Sliding-window scenarios (TVM semantics: after every step a windowed
// sequence keeps its first `sink` tokens plus the most recent ones, `window`
// in total; pages wholly outside are released). The expected retained tokens
// are computed here directly from the uids appended (1, 2, 3, ... in order),
// independently of the shadow model, which CacheDriver also checks.
#include <gtest/gtest.h>

#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Pages = std::vector<std::int32_t>;
using Uids = std::vector<std::uint64_t>;

// The uids a window keeps after `total` tokens 1..total were appended.
Uids retained_uids(std::uint64_t total, std::uint64_t window, std::uint64_t sink) {
  if (total <= window) return uid_range(1, static_cast<std::int64_t>(total));
  Uids kept = uid_range(1, static_cast<std::int64_t>(sink));
  const Uids recent =
      uid_range(total - (window - sink) + 1, static_cast<std::int64_t>(window - sink));
  kept.insert(kept.end(), recent.begin(), recent.end());
  return kept;
}

class WindowScenarios : public ScenarioTest {};

// One sequence, no forks: window 16, sink 4, page size 4; prefill 10 then
// 200 decode steps in a pool of 6 pages. The sink page plus at most 4 pages
// for the 12-13 recent tokens is all it may ever hold.
TEST_P(WindowScenarios, TwoHundredDecodeStepsKeepSinksAndMostRecent) {
  constexpr std::int64_t kWindow = 16, kSink = 4;
  CacheDriver d(config(4, 6, /*sliding_window=*/true));
  d.add(1);
  d.enable_window(1, kWindow, kSink);
  d.step({1}, {10});
  std::uint64_t total = 10;
  for (int step = 0; step < 200; ++step) {
    const std::int64_t len_before = d.kv().sequence_length(1);
    EXPECT_EQ(len_before, std::min<std::int64_t>(static_cast<std::int64_t>(total), kWindow));
    const BatchPlan plan = d.step({1}, {1});
    ++total;
    EXPECT_EQ(plan.positions, (std::vector<std::int32_t>{static_cast<std::int32_t>(len_before)}))
        << "positions are cache positions";
    EXPECT_EQ(plan.kv_lens[0], len_before + 1);
    EXPECT_EQ(plan.kv_sink_lens[0], kSink);
    EXPECT_LE(d.kv().sequence_pages(1).size(), 5u);
    EXPECT_TRUE(check_tokens(d.kv(), 1, 0, retained_uids(total, kWindow, kSink)).empty())
        << "step " << step;
    if (step % 16 == 0) d.expect_matches();
    ASSERT_FALSE(::testing::Test::HasFailure()) << "step " << step;
  }
  EXPECT_EQ(d.kv().sequence_length(1), kWindow);
  EXPECT_GE(d.kv().num_free_pages(), 1);
}

// No forks: a 100-token sequence (page size 4, 25 pages) gets window 20,
// sink 2. It is trimmed at once to tokens 1-2 and 83-100: page 0 (sinks)
// plus the pages holding tokens 82..99 (0-based), i.e. old pages 20-24.
TEST_P(WindowScenarios, EnablingOnALongSequenceTrimsImmediately) {
  CacheDriver d(config(4, 32, true));
  d.add(1);
  d.step({1}, {100});
  const Pages before = d.kv().sequence_pages(1);
  ASSERT_EQ(before.size(), 25u);
  d.enable_window(1, 20, 2);
  EXPECT_EQ(d.kv().sequence_length(1), 20);
  EXPECT_EQ(d.kv().sequence_pages(1),
            (Pages{before[0], before[20], before[21], before[22], before[23], before[24]}));
  EXPECT_EQ(d.kv().num_free_pages(), 32 - 6);
  EXPECT_TRUE(check_tokens(d.kv(), 1, 0, retained_uids(100, 20, 2)).empty());
  d.expect_matches();

  // The next step appends at cache position 20 after the gap.
  const BatchPlan plan = d.step({1}, {1});
  EXPECT_EQ(plan.positions[0], 20);
  EXPECT_EQ(plan.kv_gap_lens[0], 80 - 4 * 19);  // 80 evicted slots, 19 pages released
  EXPECT_TRUE(plan.has_gaps);
  EXPECT_TRUE(check_tokens(d.kv(), 1, 0, retained_uids(101, 20, 2)).empty());

  // A window that already holds the sequence trims nothing.
  d.add(2);
  d.step({2}, {7});
  d.enable_window(2, 7, 3);
  EXPECT_EQ(d.kv().sequence_length(2), 7);
  d.expect_matches();
}

// No forks: window 8, sink 3, page size 4. Evictions forbid popping sinks;
// popping back to exactly the sinks closes the gap, and appends continue
// right after them.
TEST_P(WindowScenarios, PopAfterEvictions) {
  CacheDriver d(config(4, 16, true));
  d.add(1);
  d.enable_window(1, 8, 3);
  d.step({1}, {5});
  d.pop(1, 4);  // no eviction yet: sinks may be popped
  EXPECT_EQ(d.kv().sequence_length(1), 1);
  d.step({1}, {19});  // 20 tokens, keeps 0-2 and 15-19
  ASSERT_EQ(d.kv().sequence_length(1), 8);
  expect_rejected<InvalidArgument>(d.kv(), [&] { d.kv().pop_n(1, 6); },
                                   {"pop_n", "n = 6", "[0, 5]", "attention sinks"});
  d.pop(1, 2);
  EXPECT_EQ(d.kv().sequence_length(1), 6);
  d.step({1}, {3});  // 9 -> slides to 8
  d.expect_matches();
  d.pop(1, 5);  // back to exactly the 3 sinks
  EXPECT_EQ(d.kv().sequence_length(1), 3);
  EXPECT_EQ(d.kv().sequence_pages(1).size(), 1u);
  const BatchPlan plan = d.step({1}, {2});
  EXPECT_EQ(plan.kv_gap_lens[0], 0);
  EXPECT_EQ(plan.slot_mapping[0], std::int64_t{plan.kv_indices[0]} * 4 + 3);
  for (int i = 0; i < 20; ++i) d.step({1}, {1 + i % 3});
  d.expect_matches();
  expect_rejected<InvalidArgument>(d.kv(), [&] { d.kv().pop_n(1, 6); }, {"attention sinks"});
}

// Window on a forked child (page size 4):
//
//   P (12 tokens: pages 0 1 2) ── C = fork(P, -1) shares 0 1 2
//   enable_sliding_window(C, 6, 2): C keeps tokens 0-1 and 8-11; page 1 lies
//   wholly in C's gap, so C drops its reference (refcount 2 -> 1).
//   C ── G = fork(C, 4): no window; keeps C's sinks and gap (tokens 1 2 9 10)
//   C ── S = fork(C, 1): inside the sinks, a plain sequence (token 1)
TEST_P(WindowScenarios, WindowOnAForkedChildReleasesOnlyItsReferences) {
  constexpr SeqId P = 1, C = 2;
  CacheDriver d(config(4, 16, true));
  d.add(P);
  d.step({P}, {12});
  d.fork(P, C);
  d.enable_window(C, 6, 2);
  EXPECT_EQ(d.kv().sequence_pages(C), (Pages{0, 2}));
  EXPECT_EQ(d.kv().page_refcount(0), 2);
  EXPECT_EQ(d.kv().page_refcount(1), 1);
  EXPECT_EQ(d.kv().page_refcount(2), 2);
  EXPECT_TRUE(check_tokens(d.kv(), P, 0, uid_range(1, 12)).empty());
  EXPECT_TRUE(check_tokens(d.kv(), C, 0, Uids{1, 2, 9, 10, 11, 12}).empty());

  constexpr SeqId G = 4, S = 5;
  d.fork(C, G, 4);
  d.fork(C, S, 1);
  EXPECT_TRUE(check_tokens(d.kv(), G, 0, Uids{1, 2, 9, 10}).empty());
  EXPECT_TRUE(check_tokens(d.kv(), S, 0, Uids{1}).empty());
  expect_rejected<InvalidArgument>(d.kv(), [&] { d.kv().enable_sliding_window(G, 8, 1); },
                                   {"seq_id = 4", "forked from a windowed"});
  expect_rejected<InvalidArgument>(d.kv(), [&] { d.kv().pop_n(G, 3); }, {"attention sinks"});
  expect_rejected<InvalidArgument>(d.kv(), [&] { write_kv(d.kv(), C, 0, Uids{77}); }, {"shared"});
  d.fork(P, 3, 5);  // the parent has no window: fine
  d.step({C, P, G, S}, {1, 1, 3, 2});
  d.step({C, G}, {3, 9});  // G grows past C's window: nothing is dropped
  EXPECT_EQ(d.kv().sequence_length(G), 16);
  d.expect_matches();
  d.remove(G);
  d.remove(S);
  d.remove(P);
  d.remove(3);
  d.step({C}, {9});
  d.expect_matches();
}

// Appends longer than the window in one step (sink 0, page size 3): during
// the step all new keys are visible; afterwards only the window remains.
TEST_P(WindowScenarios, AppendLongerThanTheWindowInOneStep) {
  CacheDriver d(config(3, 12, true));
  d.add(1);
  d.enable_window(1, 5, 0);
  std::uint64_t total = 0;
  for (std::int64_t n : {7, 1, 11, 2, 5, 13}) {
    const std::int64_t len_before = d.kv().sequence_length(1);
    const BatchPlan plan = d.step({1}, {n});
    total += static_cast<std::uint64_t>(n);
    EXPECT_EQ(plan.kv_lens[0], len_before + n);
    EXPECT_TRUE(check_tokens(d.kv(), 1, 0, retained_uids(total, 5, 0)).empty()) << n;
    EXPECT_LE(d.kv().sequence_pages(1).size(), 3u);
  }
  d.expect_matches();
}

// Page size 1: every evicted token frees its page at once.
TEST_P(WindowScenarios, PageSizeOneFreesEveryEvictedToken) {
  CacheDriver d(config(1, 8, true));
  d.add(1);
  d.enable_window(1, 4, 1);
  for (int step = 0; step < 30; ++step) {
    const BatchPlan plan = d.step({1}, {1});
    EXPECT_EQ(plan.kv_gap_lens[0], 0) << "no dead slots with one token per page";
    EXPECT_EQ(d.kv().num_free_pages(), 8 - std::min(step + 1, 4));
  }
  EXPECT_TRUE(check_tokens(d.kv(), 1, 0, retained_uids(30, 4, 1)).empty());
  d.expect_matches();
}

INSTANTIATE_TEST_SUITE_P(Kinds, WindowScenarios,
                         ::testing::Values(AttentionKind::kMHA, AttentionKind::kMLA), kind_name);

}  // namespace
}  // namespace pagedattn::test
