// Automatic prefix caching and the host-memory tier, end to end: outputs
// with caching on equal outputs with it off (greedy and seeded sampling,
// deterministic mode) on shared-prefix and multi-turn request sets, n > 1,
// and under memory pressure with and without a host tier; cache_salt keeps
// tenants apart; nothing leaks.
#include <gtest/gtest.h>

#include <map>

#include "pagedattn/engine.h"
#include "pagedattn/llama.h"
#include "support/engine_jobs.h"
#include "support/small_llama.h"

namespace pagedattn {
namespace {
namespace prefix_caching_test {  // this file's own names in a unity batch

using test::Job;
using test::Tokens;
constexpr std::int32_t kVocab = test::kSmallLlamaVocab;
constexpr std::int32_t kPageSize = 8;
// 2 (K, V) x 2 layers x 2 KV heads x 24 dims x 8 tokens x 2 bytes.
constexpr std::int64_t kPageBytes = 2 * 2 * 2 * 24 * 8 * 2;

std::shared_ptr<Model> test_model() {
  return test::small_llama();
}

EngineConfig config(bool caching, std::int64_t pages = 1024, std::int64_t host_pages = 0) {
  EngineConfig c;
  c.model = test_model();
  c.kv_memory_bytes = pages * kPageBytes;
  c.host_kv_memory_bytes = host_pages * kPageBytes;
  c.page_size = kPageSize;
  c.max_num_seqs = 16;
  c.max_num_batched_tokens = 64;
  c.deterministic = true;
  c.enable_prefix_caching = caching;
  return c;
}

Tokens stream(std::int32_t len, std::int32_t seed) {
  return test::token_stream(len, seed, kVocab);
}

Tokens concat(Tokens a, const Tokens& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

using Outputs = test::JobOutputs;

// Every page is free or cached and the cache's bookkeeping holds.
void expect_no_leaks(const Engine& engine) {
  engine.cache().check_invariants();
  EXPECT_EQ(engine.cache().num_sequences(), 0);
  EXPECT_EQ(engine.cache().num_free_pages(), engine.cache().num_pages());
  const EngineStats st = engine.stats();
  EXPECT_EQ(st.free_host_pages, st.num_host_pages);
}

// Runs the jobs through one engine (all queued at once); tokens per (job, sample).
Outputs run(Engine& engine, const std::vector<Job>& jobs) {
  Outputs out = test::run_jobs(engine, jobs);
  expect_no_leaks(engine);
  return out;
}

// A few long system prompts shared by many requests with their own
// questions; greedy, seeded sampling and n = 3 mixed.
std::vector<Job> shared_prefix_jobs(std::int32_t count) {
  std::vector<Job> jobs;
  for (std::int32_t j = 0; j < count; ++j) {
    SamplingParams p;
    p.max_tokens = 4 + j % 7;
    p.ignore_eos = true;
    if (j % 4 == 1) {
      p.temperature = 0.9f;
      p.seed = 500 + j;
    }
    if (j % 5 == 2) {
      p.n = 3;
      p.temperature = 1.0f;
      p.seed = 900 + j;
    }
    const Tokens system = stream(40 + 13 * (j % 3), 1000 + j % 3);  // 3 system prompts
    jobs.push_back({concat(system, stream(3 + j % 11, j)), p});
  }
  return jobs;
}

TEST(PrefixCaching, SharedPrefixOutputsEqualCachingOff) {
  const std::vector<Job> jobs = shared_prefix_jobs(14);
  Engine off(config(false)), on(config(true));
  const Outputs expected = run(off, jobs);
  EXPECT_EQ(off.stats().prefix_hit_tokens, 0);
  EXPECT_EQ(run(on, jobs), expected);
  const EngineStats st = on.stats();
  EXPECT_GT(st.prefix_hit_tokens, 0);
  EXPECT_GT(st.cached_pages, 0);
  // The prompts come in after their system prompt is cached: nearly all of it hits.
  Engine later(config(true));
  run(later, {jobs[0], jobs[1], jobs[2]});
  const std::int64_t before = later.stats().prefix_hit_tokens;
  EXPECT_EQ(run(later, jobs), expected);
  EXPECT_GE(later.stats().prefix_hit_tokens - before, 14 * 40 / kPageSize * kPageSize);
}

// Conversations whose turns resend the history (previous prompt + output).
TEST(PrefixCaching, MultiTurnOutputsEqualCachingOffAndHitTheHistory) {
  constexpr std::int32_t kConversations = 3, kTurns = 4;
  std::vector<Outputs> got(2);
  std::int64_t history_tokens = 0;
  std::vector<std::int64_t> hits(2);
  for (bool caching : {false, true}) {
    Engine engine(config(caching));
    std::vector<Tokens> history(kConversations);
    for (std::int32_t t = 0; t < kTurns; ++t) {
      std::vector<Job> turn;
      for (std::int32_t c = 0; c < kConversations; ++c) {
        if (!caching) history_tokens += std::ssize(history[std::size_t(c)]);
        history[std::size_t(c)] =
            concat(history[std::size_t(c)], stream(5 + 3 * c + t, 10 * c + t));
        turn.push_back({history[std::size_t(c)], {.max_tokens = 6 + c, .ignore_eos = true}});
      }
      const Outputs out = run(engine, turn);
      for (std::int32_t c = 0; c < kConversations; ++c) {
        const Tokens& answer = out.at({std::size_t(c), 0});
        history[std::size_t(c)] = concat(history[std::size_t(c)], answer);
        got[caching ? 1 : 0][{std::size_t(t * kConversations + c), 0}] = answer;
      }
    }
    hits[caching ? 1 : 0] = engine.stats().prefix_hit_tokens;
  }
  EXPECT_EQ(got[1], got[0]);
  EXPECT_EQ(hits[0], 0);
  // Every full page of the history hits (the partial last page is computed).
  EXPECT_GE(double(hits[1]), 0.6 * double(history_tokens));
}

// Memory so tight that requests are preempted: by recompute, or (with a host
// tier) by swap; caching on or off, the tokens are those of a roomy run.
TEST(PrefixCaching, PreemptionUnderTightMemoryGivesTheSameTokens) {
  const std::vector<Job> jobs = shared_prefix_jobs(12);
  Engine roomy(config(false));
  const Outputs expected = run(roomy, jobs);
  for (bool caching : {false, true})
    for (std::int64_t host_pages : {0, 64}) {
      SCOPED_TRACE(::testing::Message() << "caching " << caching << " host pages " << host_pages);
      Engine tight(config(caching, 16, host_pages));
      EXPECT_EQ(run(tight, jobs), expected);
      const EngineStats st = tight.stats();
      EXPECT_GT(st.num_preemptions, 0);
      EXPECT_EQ(st.num_swap_ins, st.num_swap_outs);
      if (host_pages > 0) {
        EXPECT_GT(st.num_swap_outs, 0);  // the test model recomputes slower than it copies
        EXPECT_GT(st.swapped_tokens, 0);
      } else {
        EXPECT_EQ(st.num_swap_outs, 0);
      }
    }
}

TEST(PrefixCaching, CacheSaltKeepsTenantsApart) {
  Engine engine(config(true));
  const Tokens prompt = stream(64, 3);
  auto hits_of = [&](std::uint64_t salt) {
    const std::int64_t before = engine.stats().prefix_hit_tokens;
    run(engine, {{prompt, {.max_tokens = 2, .ignore_eos = true, .cache_salt = salt}}});
    return engine.stats().prefix_hit_tokens - before;
  };
  EXPECT_EQ(hits_of(1), 0);
  EXPECT_EQ(hits_of(2), 0);   // same tokens, other tenant
  EXPECT_EQ(hits_of(0), 0);   // the unsalted default is a tenant too
  EXPECT_EQ(hits_of(1), 56);  // 7 of 8 pages: the last token always runs
  EXPECT_EQ(hits_of(2), 56);
}

TEST(PrefixCaching, AbortsAndPreemptionsLeakNoPages) {
  std::vector<Job> jobs = shared_prefix_jobs(10);
  for (std::int64_t host_pages : {0, 32}) {
    Engine engine(config(true, 20, host_pages));
    std::vector<RequestId> ids;
    for (const Job& j : jobs) ids.push_back(engine.add_request(j.prompt, j.params));
    for (int step = 0; engine.has_unfinished(); ++step) {
      engine.step();
      engine.cache().check_invariants();
      if (step % 3 == 2 && step / 3 < std::ssize(ids)) {
        const RequestId victim = ids[std::size_t(step / 3)];
        try {
          engine.abort(victim);  // running, waiting or swapped out
        } catch (const InvalidArgument&) {
          // already finished
        }
      }
    }
    EXPECT_GT(engine.stats().num_preemptions, 0);
    expect_no_leaks(engine);
  }
}

TEST(PrefixCaching, ConfigIsValidated) {
  EngineConfig c = config(true);
  c.host_kv_memory_bytes = -1;
  EXPECT_THROW(Engine{c}, InvalidArgument);
}

}  // namespace prefix_caching_test
}  // namespace
}  // namespace pagedattn
