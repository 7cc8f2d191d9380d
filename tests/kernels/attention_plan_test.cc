// plan_attention is a pure function: it must cover every (sequence, KV head,
// query token, visible key) exactly once, split long KV when threads would
// idle, honour fixed chunks, and balance threads.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <numeric>
#include <tuple>

#include "pagedattn/attention.h"
#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

struct Batch {
  std::vector<std::int32_t> qo_indptr{0}, kv_lens;
  PagedKVTable table() const {
    PagedKVTable t;
    t.batch_size = static_cast<std::int32_t>(kv_lens.size());
    t.qo_indptr = qo_indptr.data();
    t.kv_lens = kv_lens.data();
    t.page_size = 16;
    return t;
  }
  void add(std::int32_t q_len, std::int32_t kv_len) {
    qo_indptr.push_back(qo_indptr.back() + q_len);
    kv_lens.push_back(kv_len);
  }
};

const AttentionShape kShape{32, 8, 128, 128};

std::int64_t work(const AttentionWorkItem& w) {
  return std::int64_t{w.kv_end - w.kv_begin} * (w.q_end - w.q_begin) *
         (w.kv_head_end - w.kv_head_begin);
}

// Each thread's work when threads of equal speed take the plan's items in
// order, each the next one as it finishes its last (as the kernel does).
std::vector<std::int64_t> thread_loads(const AttentionPlan& plan) {
  std::vector<std::int64_t> load(static_cast<std::size_t>(plan.num_threads), 0);
  for (const AttentionWorkItem& w : plan.items)
    *std::min_element(load.begin(), load.end()) += work(w);
  return load;
}

// Every (batch, head, token) row sees every visible key exactly once.
void expect_exact_cover(const Batch& batch, const AttentionPlan& plan, bool causal) {
  const std::int32_t kv_heads = plan.shape.num_kv_heads;
  const PagedKVTable t = batch.table();
  std::map<std::tuple<int, int, int>, std::vector<int>> seen;  // row -> key hit counts
  for (const AttentionWorkItem& w : plan.items)
    for (int h = w.kv_head_begin; h < w.kv_head_end; ++h)
      for (int q = w.q_begin; q < w.q_end; ++q) {
        auto& keys = seen[{w.batch, h, q}];
        keys.resize(static_cast<std::size_t>(t.kv_lens[w.batch]));
        for (int j = w.kv_begin; j < w.kv_end; ++j) ++keys[j];
      }
  for (int b = 0; b < t.batch_size; ++b)
    for (int h = 0; h < kv_heads; ++h)
      for (int q = 0; q < t.q_len(b); ++q) {
        auto& keys = seen[{b, h, q}];
        keys.resize(static_cast<std::size_t>(t.kv_lens[b]));
        const int visible_end = causal ? t.kv_lens[b] - t.q_len(b) + q + 1 : t.kv_lens[b];
        for (int j = 0; j < visible_end; ++j)
          ASSERT_EQ(keys.at(j), 1) << "batch " << b << " head " << h << " q " << q << " key " << j;
      }
}

TEST(AttentionPlan, OneLongDecodeIsSplitAcrossThreads) {
  Batch batch;
  batch.add(1, 32768);
  AttentionOptions opt;
  const AttentionPlan plan =
      plan_attention(batch.table(), AttentionShape{8, 1, 128, 128}, opt,
                     AttentionPlanOptions{4, 0, 256, false, false, false, false, false});
  EXPECT_GE(plan.num_partials, 4);
  ASSERT_EQ(plan.merges.size(), 1u);
  const std::vector<std::int64_t> loads = thread_loads(plan);
  for (int t = 0; t < 4; ++t) EXPECT_GT(loads[t], 0) << "thread " << t << " idles";
  expect_exact_cover(batch, plan, true);
}

TEST(AttentionPlan, ManyShortSequencesAreNotSplit) {
  Batch batch;
  for (int b = 0; b < 64; ++b) batch.add(1, 300 + b);
  const AttentionPlan plan =
      plan_attention(batch.table(), kShape, {},
                     AttentionPlanOptions{2, 0, 256, false, false, false, false, false});
  EXPECT_EQ(plan.num_partials, 0);
  EXPECT_EQ(plan.items.size(), 64u);  // decode: one item per sequence, all KV heads
  for (const AttentionWorkItem& w : plan.items) EXPECT_EQ(w.kv_head_end - w.kv_head_begin, 8);
  expect_exact_cover(batch, plan, true);
}

// Fewer sequences than threads: their KV heads are split first, with no
// merge; the keys only where threads would still idle.
TEST(AttentionPlan, FewSequencesSplitTheirHeadsBeforeTheirKeys) {
  Batch batch;
  batch.add(1, 300);  // too short to cut into min_kv_chunk (256) chunks
  for (const std::int32_t threads : {2, 4, 8, 16}) {
    SCOPED_TRACE(threads);
    const AttentionPlan plan =
        plan_attention(batch.table(), kShape, {},
                       AttentionPlanOptions{threads, 0, 256, false, false, false, false, false});
    // Up to 8 threads, one item per head range; 16 threads: each of the 8
    // heads also cut in two by keys (chunks of at least 256 / 4 keys).
    EXPECT_EQ(plan.num_partials, threads <= 8 ? 0 : 16);
    EXPECT_EQ(plan.items.size(), std::size_t(threads));
    for (const std::int64_t load : thread_loads(plan)) EXPECT_GT(load, 0) << "a thread idles";
    expect_exact_cover(batch, plan, true);
  }
  Batch two;  // four threads: the long one split by keys, the short one by heads
  two.add(1, 32768);
  two.add(1, 100);
  const AttentionPlan plan = plan_attention(
      two.table(), kShape, {}, AttentionPlanOptions{4, 0, 256, false, false, false, false, false});
  for (const AttentionWorkItem& w : plan.items)
    EXPECT_EQ(w.kv_head_end - w.kv_head_begin, w.batch == 0 ? 8 : 4) << "sequence " << w.batch;
  EXPECT_GT(plan.num_partials, 0);
  expect_exact_cover(two, plan, true);
  // Fixed chunks (deterministic mode): a sequence within one chunk is split
  // by heads, a longer one by its chunks.
  Batch fixed;
  fixed.add(1, 256);
  fixed.add(1, 600);
  const AttentionPlan chunked =
      plan_attention(fixed.table(), kShape, {},
                     AttentionPlanOptions{4, 256, 256, false, false, false, false, false});
  for (const AttentionWorkItem& w : chunked.items)
    EXPECT_EQ(w.kv_head_end - w.kv_head_begin, w.batch == 0 ? 4 : 8) << "sequence " << w.batch;
  expect_exact_cover(fixed, chunked, true);
  // One thread, or as many tiles as threads: heads stay whole.
  for (const std::int32_t threads : {1, 2}) {
    const AttentionPlan whole =
        plan_attention(two.table(), kShape, {},
                       AttentionPlanOptions{threads, 0, 256, false, false, false, false, false});
    for (const AttentionWorkItem& w : whole.items) EXPECT_EQ(w.kv_head_end - w.kv_head_begin, 8);
  }
}

// One KV head (latent attention, multi-query): nothing to split by heads, so
// a short sequence is cut by keys into a part per thread, in chunks of at
// least min_kv_chunk / 4 keys; a batch of as many tiles as threads is not.
TEST(AttentionPlan, OneShortSequenceOfOneHeadGivesEveryThreadAPart) {
  const AttentionShape latent{16, 1, 576, 512};
  Batch one;
  one.add(1, 384);
  for (const auto& [threads, min_chunk, parts] :
       {std::tuple{2, 256, 2}, {4, 256, 4}, {16, 256, 6}, {16, 1024, 1}, {16, 32, 16}}) {
    SCOPED_TRACE(::testing::Message() << threads << " threads, min_kv_chunk " << min_chunk);
    const AttentionPlan plan = plan_attention(
        one.table(), latent, {},
        AttentionPlanOptions{threads, 0, min_chunk, false, false, false, false, false});
    EXPECT_EQ(plan.items.size(), std::size_t(parts));
    EXPECT_EQ(plan.merges.size(), parts > 1 ? 1u : 0u);
    for (const AttentionWorkItem& w : plan.items)
      EXPECT_GE(w.kv_end - w.kv_begin, std::min(384, min_chunk / 4));
    expect_exact_cover(one, plan, true);
  }
  Batch two;  // two sequences on two threads: one item each, as before
  two.add(1, 400);
  two.add(1, 400);
  const AttentionPlan plan = plan_attention(
      two.table(), latent, {}, AttentionPlanOptions{2, 0, 256, false, false, false, false, false});
  EXPECT_EQ(plan.items.size(), 2u);
  EXPECT_EQ(plan.num_partials, 0);
  // Deterministic mode keeps its fixed chunks whatever the threads.
  const AttentionPlan fixed =
      plan_attention(one.table(), latent, {},
                     AttentionPlanOptions{16, 256, 256, false, false, false, false, false});
  EXPECT_EQ(fixed.items.size(), 2u);
}

TEST(AttentionPlan, LoadIsBalancedForMixedBatches) {
  Batch batch;
  batch.add(1, 16384);
  for (int b = 0; b < 7; ++b) batch.add(1, 1000);
  batch.add(200, 4000);
  const AttentionPlan plan =
      plan_attention(batch.table(), kShape, {},
                     AttentionPlanOptions{2, 0, 256, false, false, false, false, false});
  const std::vector<std::int64_t> loads = thread_loads(plan);
  const std::int64_t a = loads[0], b = loads[1];
  EXPECT_LT(std::max(a, b), 1.15 * std::min(a, b)) << a << " vs " << b;
  expect_exact_cover(batch, plan, true);
}

// Threads take items in plan order, so the longest go first and the short
// ones fill in at the end, whichever thread runs slower.
TEST(AttentionPlan, ItemsComeLongestFirst) {
  Batch batch;
  for (int b = 0; b < 40; ++b) batch.add(1, 100 + (b * 7919) % 3000);
  const AttentionPlan plan =
      plan_attention(batch.table(), kShape, {},
                     AttentionPlanOptions{2, 0, 256, false, false, false, false, false});
  ASSERT_EQ(plan.items.size(), 40u);
  for (std::size_t i = 1; i < plan.items.size(); ++i)
    EXPECT_GE(work(plan.items[i - 1]), work(plan.items[i])) << "item " << i;
  expect_exact_cover(batch, plan, true);
}

TEST(AttentionPlan, FixedChunksDependOnlyOnTheSequence) {
  AttentionPlanOptions po{2, 512, 256};
  Batch alone, crowded;
  alone.add(1, 3000);
  crowded.add(1, 3000);
  for (int b = 0; b < 20; ++b) crowded.add(1, 100 + 37 * b);
  auto chunks_of_first = [&](const Batch& batch) {
    std::vector<std::pair<int, int>> r;
    for (const AttentionWorkItem& w : plan_attention(batch.table(), kShape, {}, po).items)
      if (w.batch == 0 && w.kv_head_begin == 0) r.push_back({w.kv_begin, w.kv_end});
    std::sort(r.begin(), r.end());
    return r;
  };
  const auto a = chunks_of_first(alone), b = chunks_of_first(crowded);
  EXPECT_EQ(a, b);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a[1], std::make_pair(512, 1024));
  expect_exact_cover(crowded, plan_attention(crowded.table(), kShape, {}, po), true);
}

TEST(AttentionPlan, WindowAndCausalLimitTheKeys) {
  Batch batch;
  batch.add(3, 1000);
  AttentionOptions opt;
  opt.window_left = 10;
  const AttentionPlan plan =
      plan_attention(batch.table(), AttentionShape{4, 4, 64, 64}, opt,
                     AttentionPlanOptions{1, 0, 256, false, false, false, false, false});
  for (const AttentionWorkItem& w : plan.items) {
    EXPECT_EQ(w.kv_begin, 997 - 10);
    EXPECT_EQ(w.kv_end, 1000);
  }
}

TEST(AttentionPlan, PrefillTilesQueriesAndCoversCausally) {
  Batch batch;
  batch.add(70, 70);
  batch.add(33, 100);
  batch.add(0, 5);
  const AttentionPlan plan =
      plan_attention(batch.table(), AttentionShape{12, 2, 64, 64}, {},
                     AttentionPlanOptions{3, 0, 16, false, false, false, false, false});
  for (const AttentionWorkItem& w : plan.items)
    EXPECT_LE((w.kv_head_end - w.kv_head_begin) * (w.q_end - w.q_begin) * 6, plan.max_rows);
  expect_exact_cover(batch, plan, true);
  EXPECT_GT(plan.workspace_bytes, 0u);
}

TEST(AttentionPlan, RejectsBadShapes) {
  Batch batch;
  batch.add(1, 10);
  EXPECT_THROW(plan_attention(batch.table(), AttentionShape{6, 4, 64, 64}, {}), InvalidArgument);
  EXPECT_THROW(plan_attention(batch.table(), AttentionShape{8, 8, 0, 64}, {}), InvalidArgument);
  EXPECT_THROW(plan_attention(batch.table(), kShape, {},
                              AttentionPlanOptions{-1, 0, 256, false, false, false, false, false}),
               InvalidArgument);
}

}  // namespace
}  // namespace pagedattn
