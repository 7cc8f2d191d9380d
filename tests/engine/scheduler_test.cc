// Scheduler against a bare cache: no model runs; a step is begin_forward /
// end_forward, and "sampling" appends token 7 (children are spawned the way
// the engine does).
#include "engine/scheduler.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "support/kv_values.h"

namespace pagedattn::engine {
namespace {

KVCacheConfig bare_cache(std::int64_t pages, std::int32_t page_size = 4) {
  KVCacheConfig c;
  c.num_layers = 1;
  c.head_dim = 1;
  c.kv_dtype = DType::kF32;
  c.page_size = page_size;
  c.num_pages = pages;
  return c;
}

std::unique_ptr<SequenceGroup> group(RequestId id, std::int32_t prompt_len, std::int32_t max_tokens,
                                     std::int32_t n = 1) {
  auto g = std::make_unique<SequenceGroup>();
  g->id = id;
  g->params.max_tokens = max_tokens;
  g->params.n = n;
  g->prompt_len = prompt_len;
  Sequence s;
  s.id = id * kMaxSamples;
  s.tokens.assign(static_cast<std::size_t>(prompt_len), 1);
  g->seqs.push_back(std::move(s));
  return g;
}

class SchedulerTest : public ::testing::Test {
 protected:
  void make(SchedulerConfig sc, std::int64_t pages, std::int32_t page_size = 4) {
    cache_ = std::make_unique<PagedKVCache>(bare_cache(pages, page_size));
    scheduler_ = std::make_unique<Scheduler>(sc, *cache_);
  }
  // One step: plan, "forward", sample. Returns the schedule for inspection.
  Schedule step() {
    Schedule s = scheduler_->schedule();
    if (s.empty()) return s;
    cache_->begin_forward(s.seq_ids, s.lengths);
    test::end_metadata_step(*cache_);  // no model: the K/V is never read
    scheduler_->complete(s);
    for (const ScheduledChunk& c : s.chunks) {
      EXPECT_EQ(cache_->sequence_length(c.group->seqs[c.seq].id), c.begin + c.length);
      if (!c.samples) continue;
      SequenceGroup& g = *c.group;
      if (std::ssize(g.seqs) < g.params.n)
        for (std::int32_t i = 1; i < g.params.n; ++i) {
          Sequence child;
          child.id = g.id * kMaxSamples + i;
          child.index = i;
          child.tokens = g.seqs[0].tokens;
          g.seqs.push_back(std::move(child));
        }
      for (Sequence& q : g.seqs) {
        const bool samples_now =
            std::ssize(q.tokens) == g.prompt_len || (&q == &g.seqs[std::size_t(c.seq)]);
        if (!samples_now || q.finished()) continue;
        q.tokens.push_back(7);
        if (std::ssize(q.tokens) - g.prompt_len >= g.params.max_tokens)
          q.finish = FinishReason::kLength;
      }
    }
    scheduler_->release_finished();
    cache_->check_invariants();
    return s;
  }
  std::int64_t run_to_end(std::int32_t max_steps = 10000) {
    std::int64_t steps = 0;
    while (scheduler_->has_unfinished() && steps < max_steps) {
      step();
      ++steps;
    }
    EXPECT_FALSE(scheduler_->has_unfinished());
    return steps;
  }
  std::unique_ptr<PagedKVCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
};

TEST_F(SchedulerTest, TokenBudgetAndSequenceLimitAreRespected) {
  make({.max_num_seqs = 5, .max_num_batched_tokens = 16}, 1000);
  for (RequestId id = 0; id < 12; ++id) scheduler_->add(group(id, 3 + 7 * id % 23, 5 + id % 4));
  while (scheduler_->has_unfinished()) {
    const Schedule s = step();
    EXPECT_LE(s.num_tokens, 16);
    EXPECT_LE(scheduler_->num_running_seqs(), 5);
  }
  EXPECT_TRUE(cache_->empty());
}

TEST_F(SchedulerTest, DecodesComeFirstAndAreNeverStarvedByPrefill) {
  make({.max_num_seqs = 8, .max_num_batched_tokens = 8}, 1000);
  scheduler_->add(group(0, 5, 20));
  step();  // prefill of request 0
  for (RequestId id = 1; id < 6; ++id) scheduler_->add(group(id, 40, 3));
  for (int i = 0; i < 10; ++i) {
    const Schedule s = step();
    ASSERT_FALSE(s.empty());
    EXPECT_EQ(s.chunks[0].group->id, 0) << "step " << i;  // the decode of request 0
    EXPECT_EQ(s.chunks[0].length, 1);
    EXPECT_GE(s.num_decodes, 1);
    for (std::size_t k = 0; k < s.chunks.size(); ++k)
      EXPECT_EQ(s.chunks[k].length == 1 && s.chunks[k].begin > 0 && k < std::size_t(s.num_decodes),
                k < std::size_t(s.num_decodes));
  }
}

TEST_F(SchedulerTest, LongPromptIsChunkedAndSamplesOnlyAtTheEnd) {
  make({.max_num_seqs = 4, .max_num_batched_tokens = 32}, 1000);
  scheduler_->add(group(0, 100, 2));
  std::vector<std::int32_t> lengths;
  for (int i = 0; i < 4; ++i) {
    const Schedule s = step();
    ASSERT_EQ(s.chunks.size(), 1u);
    lengths.push_back(s.chunks[0].length);
    EXPECT_EQ(s.chunks[0].samples, i == 3);
  }
  EXPECT_EQ(lengths, (std::vector<std::int32_t>{32, 32, 32, 4}));
}

TEST_F(SchedulerTest, WithoutChunkingAPromptRunsWhole) {
  make({.max_num_seqs = 4, .max_num_batched_tokens = 32, .chunked_prefill = false}, 1000);
  scheduler_->add(group(0, 20, 2));
  scheduler_->add(group(1, 20, 2));
  const Schedule s = step();
  ASSERT_EQ(s.chunks.size(), 1u);  // the second prompt does not fit the rest of the budget
  EXPECT_EQ(s.chunks[0].length, 20);
  run_to_end();
}

TEST_F(SchedulerTest, PreemptsTheMostRecentRequestAndResumesIt) {
  // 12 pages of 4 tokens; three requests of 8 + 12 tokens cannot all fit.
  make({.max_num_seqs = 8, .max_num_batched_tokens = 64}, 12);
  for (RequestId id = 0; id < 3; ++id) scheduler_->add(group(id, 8, 12));
  step();  // all three prefill (6 pages)
  ASSERT_EQ(scheduler_->running().size(), 3u);
  std::int64_t seen = 0;
  while (scheduler_->has_unfinished() && seen == 0) {
    step();
    seen = scheduler_->num_preemptions();
  }
  ASSERT_GT(seen, 0);
  ASSERT_FALSE(scheduler_->waiting().empty());
  EXPECT_EQ(scheduler_->waiting().front()->id, 2);  // the latest admitted went first
  EXPECT_FALSE(scheduler_->waiting().front()->seqs[0].in_cache);
  run_to_end();
  EXPECT_TRUE(cache_->empty());
  EXPECT_EQ(cache_->num_free_pages(), 12);
}

TEST_F(SchedulerTest, AbortReturnsEveryPage) {
  make({.max_num_seqs = 8, .max_num_batched_tokens = 64}, 100);
  scheduler_->add(group(0, 30, 50, 3));
  scheduler_->add(group(1, 10, 50));
  for (int i = 0; i < 3; ++i) step();
  EXPECT_LT(cache_->num_free_pages(), 100);
  EXPECT_NE(scheduler_->remove(0), nullptr);
  EXPECT_NE(scheduler_->remove(1), nullptr);
  EXPECT_EQ(scheduler_->remove(1), nullptr);
  EXPECT_TRUE(cache_->empty());
  EXPECT_FALSE(scheduler_->has_unfinished());
}

TEST_F(SchedulerTest, ParallelSamplesShareThePromptPages) {
  make({.max_num_seqs = 8, .max_num_batched_tokens = 64}, 100);
  scheduler_->add(group(0, 10, 6, 4));  // 10 tokens: 2 full pages + 2 tokens
  step();                               // prefill, 4 samples drawn
  step();                               // forks, then 4 decodes
  const SequenceGroup& g = *scheduler_->running().front();
  ASSERT_EQ(g.seqs.size(), 4u);
  const std::vector<std::int32_t> first = cache_->sequence_pages(g.seqs[0].id);
  for (const Sequence& s : g.seqs) {
    const std::vector<std::int32_t> pages = cache_->sequence_pages(s.id);
    EXPECT_EQ(pages[0], first[0]);
    EXPECT_EQ(pages[1], first[1]);
    EXPECT_EQ(cache_->page_refcount(pages[0]), 4);
    EXPECT_EQ(cache_->sequence_length(s.id), 11);
  }
  // 2 shared pages + one page of its own per sample.
  EXPECT_EQ(cache_->num_pages() - cache_->num_free_pages(), 2 + 4);
  run_to_end();
  EXPECT_TRUE(cache_->empty());
}

TEST_F(SchedulerTest, PreemptedParallelSamplesAreForkedAgain) {
  make({.max_num_seqs = 16, .max_num_batched_tokens = 64}, 20);
  for (RequestId id = 0; id < 3; ++id) scheduler_->add(group(id, 9, 14, 2));
  run_to_end();
  EXPECT_GT(scheduler_->num_preemptions(), 0);
  EXPECT_TRUE(cache_->empty());
}

TEST_F(SchedulerTest, PageAccountingReturnsToZeroUnderRandomLoad) {
  make({.max_num_seqs = 6, .max_num_batched_tokens = 24}, 40, 3);
  std::uint64_t x = 12345;
  auto next = [&](std::int32_t mod) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<std::int32_t>((x >> 33) % static_cast<std::uint64_t>(mod));
  };
  RequestId id = 0;
  for (int round = 0; round < 200; ++round) {
    if (next(3) == 0) scheduler_->add(group(id++, 1 + next(20), 1 + next(12), 1 + next(3)));
    if (next(17) == 0 && id > 0) scheduler_->remove(next(static_cast<std::int32_t>(id)));
    step();
  }
  run_to_end();
  EXPECT_TRUE(cache_->empty());
  EXPECT_EQ(cache_->num_free_pages(), 40);
}

}  // namespace
}  // namespace pagedattn::engine
