// BatchPlan contents checked exactly against hand-computed arrays for small
// cases. A fresh pool hands out page ids lowest first, and pages are taken in
// batch order.
#include <gtest/gtest.h>

#include <vector>

#include "support/cache_driver.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using I32 = std::vector<std::int32_t>;
using I64 = std::vector<std::int64_t>;

class PlanScenarios : public ScenarioTest {};

// No forks. Page size 4. Before the step:
//   10: 6 tokens in pages 0 1 (page 1 holds 2)
//   20: empty
//   30: 4 tokens in page 2 (full)
//   40: empty
// Step [30:+1, 10:+3, 20:+5, 40:+0] takes pages in batch order:
//   30 -> page 3 (slot 4), 10 -> fills page 1 then page 4, 20 -> pages 5 6.
TEST_P(PlanScenarios, MixedBatchCsrArraysAreExact) {
  CacheDriver d(config(4, 16));
  for (SeqId id : {10, 20, 30, 40}) d.add(id);
  d.step({10}, {6});
  d.step({30}, {4});
  const BatchPlan plan = d.step({30, 10, 20, 40}, {1, 3, 5, 0});

  EXPECT_EQ(plan.seq_ids, (std::vector<SeqId>{30, 10, 20, 40}));
  EXPECT_EQ(plan.batch_size(), 4);
  EXPECT_EQ(plan.num_tokens(), 9);
  EXPECT_EQ(plan.page_size, 4);
  EXPECT_EQ(plan.qo_indptr, (I32{0, 1, 4, 9, 9}));
  EXPECT_EQ(plan.kv_indptr, (I32{0, 2, 5, 7, 7}));
  EXPECT_EQ(plan.kv_indices, (I32{2, 3, 0, 1, 4, 5, 6}));
  EXPECT_EQ(plan.kv_last_page_len, (I32{1, 1, 1, 0}));
  EXPECT_EQ(plan.kv_lens, (I32{5, 9, 5, 0}));
  EXPECT_EQ(plan.kv_sink_lens, (I32{0, 0, 0, 0}));
  EXPECT_EQ(plan.kv_gap_lens, (I32{0, 0, 0, 0}));
  EXPECT_FALSE(plan.has_gaps);
  EXPECT_EQ(plan.positions, (I32{4, 6, 7, 8, 0, 1, 2, 3, 4}));
  EXPECT_EQ(plan.slot_mapping, (I64{12, 6, 7, 16, 20, 21, 22, 23, 24}));

  const PagedKVTable t = plan.table();
  EXPECT_EQ(t.batch_size, 4);
  EXPECT_EQ(t.page_size, 4);
  EXPECT_EQ(t.kv_sink_lens, nullptr);
  EXPECT_EQ(t.kv_gap_lens, nullptr);
  EXPECT_EQ(t.num_pages_of(1), 3);
  EXPECT_EQ(t.q_len(2), 5);
  EXPECT_EQ(t.q_len(3), 0);
  EXPECT_EQ(t.page_of_key(1, 8), 4);
  EXPECT_EQ(t.offset_of_key(1, 5), 1);
}

// One windowed sequence, page size 4, window 6, sink 2.
//   prefill 10 -> pages 0 1 2 (slots 0-9); the step slides: tokens 2-5 are
//   evicted, gap = 4 (slots 2-5), no page is wholly in the gap.
//   step +3 -> slots 10 11 (page 2) and 12 (new page 3); kv_lens 9, gap 4;
//   then slides 3: gap covers slots 2-8, page 1 (slots 4-7) is released,
//   gap = 4 + 3 - 4 = 3, pages 0 2 3.
//   step +1 -> slot 9 of the list = page 3 offset 1.
TEST_P(PlanScenarios, GapArraysOfAWindowedSequenceAreExact) {
  CacheDriver d(config(4, 8, true));
  d.add(5);
  d.enable_window(5, 6, 2);
  d.step({5}, {10});
  EXPECT_EQ(d.kv().sequence_length(5), 6);
  EXPECT_EQ(d.kv().sequence_pages(5), (I32{0, 1, 2}));

  const BatchPlan a = d.step({5}, {3});
  EXPECT_EQ(a.kv_indices, (I32{0, 1, 2, 3}));
  EXPECT_EQ(a.kv_lens, (I32{9}));
  EXPECT_EQ(a.kv_sink_lens, (I32{2}));
  EXPECT_EQ(a.kv_gap_lens, (I32{4}));
  EXPECT_TRUE(a.has_gaps);
  EXPECT_EQ(a.kv_last_page_len, (I32{1}));
  EXPECT_EQ(a.positions, (I32{6, 7, 8}));
  EXPECT_EQ(a.slot_mapping, (I64{10, 11, 12}));
  const PagedKVTable ta = a.table();
  ASSERT_NE(ta.kv_gap_lens, nullptr);
  EXPECT_EQ(ta.slot_of_key(0, 1), 1);  // a sink
  EXPECT_EQ(ta.slot_of_key(0, 2), 6);  // first key after the gap
  EXPECT_EQ(ta.page_of_key(0, 8), 3);
  EXPECT_EQ(ta.offset_of_key(0, 8), 0);

  EXPECT_EQ(d.kv().sequence_pages(5), (I32{0, 2, 3}));
  const BatchPlan b = d.step({5}, {1});
  EXPECT_EQ(b.kv_indices, (I32{0, 2, 3}));
  EXPECT_EQ(b.kv_lens, (I32{7}));
  EXPECT_EQ(b.kv_gap_lens, (I32{3}));
  EXPECT_EQ(b.kv_last_page_len, (I32{2}));
  EXPECT_EQ(b.positions, (I32{6}));
  EXPECT_EQ(b.slot_mapping, (I64{13}));
  // Retained after the slide: uids 1 2 (sinks) then the 4 most recent of 14.
  EXPECT_EQ(d.kv().sequence_length(5), 6);
  EXPECT_TRUE(check_tokens(d.kv(), 5, 0, std::vector<std::uint64_t>{1, 2, 11, 12, 13, 14}).empty());
}

// No forks: a batch where only the middle sequence appends. Zero-length
// entries appear in the plan with their current pages and no new tokens.
TEST_P(PlanScenarios, ZeroLengthAppendsInABatch) {
  CacheDriver d(config(4, 8));
  for (SeqId id : {1, 2, 3}) d.add(id);
  d.step({1, 3}, {5, 2});  // 1: pages 0 1, 3: page 2
  const std::int64_t free_before = d.kv().num_free_pages();
  const BatchPlan plan = d.step({1, 2, 3}, {0, 3, 0});
  EXPECT_EQ(plan.qo_indptr, (I32{0, 0, 3, 3}));
  EXPECT_EQ(plan.kv_indptr, (I32{0, 2, 3, 4}));
  EXPECT_EQ(plan.kv_indices, (I32{0, 1, 3, 2}));
  EXPECT_EQ(plan.kv_last_page_len, (I32{1, 3, 2}));
  EXPECT_EQ(plan.kv_lens, (I32{5, 3, 2}));
  EXPECT_EQ(plan.positions, (I32{0, 1, 2}));
  EXPECT_EQ(plan.slot_mapping, (I64{12, 13, 14}));
  EXPECT_EQ(d.kv().num_free_pages(), free_before - 1);
  d.expect_matches();

  // An all-zero batch is a valid empty step.
  const BatchPlan empty = d.step({3}, {0});
  EXPECT_EQ(empty.num_tokens(), 0);
  EXPECT_TRUE(empty.positions.empty());
  EXPECT_TRUE(empty.slot_mapping.empty());
  EXPECT_EQ(empty.kv_indices, (I32{2}));
}

// An empty batch is allowed and plans nothing.
TEST_P(PlanScenarios, EmptyBatch) {
  CacheDriver d(config(4, 4));
  const BatchPlan plan = d.step({}, {});
  EXPECT_EQ(plan.batch_size(), 0);
  EXPECT_EQ(plan.num_tokens(), 0);
  EXPECT_EQ(plan.qo_indptr, (I32{0}));
  EXPECT_EQ(plan.kv_indptr, (I32{0}));
}

// The plan is re-built by every begin_forward, and plan() returns it only
// inside a step.
TEST_P(PlanScenarios, PlanIsAvailableOnlyDuringTheStep) {
  PagedKVCache kv(config(4, 4));
  kv.add_sequence(1);
  const std::vector<SeqId> ids = {1};
  const std::vector<std::int64_t> lens = {2};
  const BatchPlan& plan = kv.begin_forward(ids, lens);
  EXPECT_TRUE(kv.in_forward());
  EXPECT_EQ(&kv.plan(), &plan);
  EXPECT_EQ(kv.plan().num_tokens(), 2);
  end_metadata_step(kv);
  EXPECT_FALSE(kv.in_forward());
  EXPECT_THROW((void)kv.plan(), InvalidState);
  const std::vector<std::int64_t> one = {1};
  const BatchPlan& next = kv.begin_forward(ids, one);
  EXPECT_EQ(next.positions, (I32{2}));
  EXPECT_EQ(next.qo_indptr, (I32{0, 1}));
  end_metadata_step(kv);
}

INSTANTIATE_TEST_SUITE_P(Kinds, PlanScenarios,
                         ::testing::Values(AttentionKind::kMHA, AttentionKind::kMLA), kind_name);

}  // namespace
}  // namespace pagedattn::test
