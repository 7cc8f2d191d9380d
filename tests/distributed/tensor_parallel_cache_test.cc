// Every cache feature under tensor parallelism on 2 ranks (tiny preset: one
// KV head per rank), against the single process doing the same:
//   - prefix caching: a prompt whose first pages are cached gives the single
//     process's logits (driven step by step) and, through the Engine, its
//     greedy tokens; the hits happen in every rank's cache (its counters);
//   - preemption by swap to the host tier under a KV budget too small for
//     the requests: the single process's greedy tokens, and every rank's
//     cache swapped the same pages out and in;
//   - token trees (speculative decoding, driven step by step: the Engine
//     has none): a branching tree, a chain, a tree grown over two forwards,
//     their commits and the decodes after them give the single process's
//     logits.
// Followers replay rank 0's logged cache calls and compare their cache's
// shape with rank 0's before every forward and at shutdown (a difference
// ends every rank), so a replay that drops or changes a call fails these
// tests even where the logits would not show it.
//
// Tolerance: the bound of tensor_parallel_test.cc, |tp - single| <= 2e-4 x
// (1 + max |single|) per logit (summation order of the all-reduces).
#include <gtest/gtest.h>

#include <cstdint>
#include <map>
#include <memory>
#include <vector>

#include "pagedattn/distributed/tensor_parallel.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_support.h"

namespace pagedattn::dist {
namespace {

constexpr double kRelativeTolerance = 2e-4;

LlamaConfig sharded_tiny(const MpiComm& world) {
  LlamaConfig c = llama_preset("tiny");
  c.shard = mpi_shard(world);
  return c;
}

LlamaConfig single_process(const LlamaConfig& c) {
  LlamaConfig whole = c;
  whole.shard = {};
  return whole;
}

// Rank 0's value on every rank (collective).
PrefixCacheStats rank0_stats(const MpiComm& world, const PrefixCacheStats& mine) {
  std::vector<PrefixCacheStats> stats{mine};
  world.broadcast_vector(stats, 0);
  return stats.at(0);
}

// A leader's cache and a single process's cache, driven alike: every call
// on both, every step's logits compared.
class Mirror {
 public:
  // 64 pages of 16 tokens.
  Mirror(TensorParallelLeader& leader, Model& single, bool prefix_caching)
      : leader_(leader),
        single_(single),
        tp_(sized(leader.spec(), prefix_caching)),
        one_(sized(single.spec(), prefix_caching)) {
    leader_.attach_cache(tp_);
  }
  template <class F>
  void both(F&& op) {
    op(tp_);
    op(one_);
  }
  // One step (a token tree when `parents` is not empty); logits compared.
  void step(const std::vector<SeqId>& seqs, const std::vector<std::int64_t>& lengths,
            const std::vector<std::int32_t>& tokens, const std::vector<std::int32_t>& rows,
            const std::vector<std::int64_t>& parents = {}) {
    const std::vector<float> tp = run(leader_, tp_, seqs, lengths, tokens, rows, parents);
    const std::vector<float> ref = run(single_, one_, seqs, lengths, tokens, rows, parents);
    ASSERT_EQ(tp.size(), ref.size());
    const double bound = kRelativeTolerance * (1.0 + max_abs(ref));
    const double worst = max_abs_difference(tp, ref);
    EXPECT_LE(worst, bound) << "logits differ by up to " << worst;
  }
  PagedKVCache& tp_cache() { return tp_; }

 private:
  static KVCacheConfig sized(const ModelSpec& spec, bool prefix_caching) {
    KVCacheConfig k = kv_cache_config(spec);
    k.page_size = 16;
    k.num_pages = 64;
    k.enable_prefix_caching = prefix_caching;
    // f32 attention products: the sharding's numbers, not those of a fast
    // path whose rounding depends on how each side splits its keys.
    k.attention_plan.fast_prefill_products = false;
    return k;
  }
  static std::vector<float> run(Model& model, PagedKVCache& cache, const std::vector<SeqId>& seqs,
                                const std::vector<std::int64_t>& lengths,
                                const std::vector<std::int32_t>& tokens,
                                const std::vector<std::int32_t>& rows,
                                const std::vector<std::int64_t>& parents) {
    if (parents.empty()) return run_step(model, cache, seqs, lengths, tokens, rows);
    std::vector<float> logits(rows.size() * std::size_t(model.spec().vocab_size));
    cache.begin_forward(seqs, lengths, parents);
    model.forward({tokens, rows, false}, cache, logits);
    cache.end_forward();
    return logits;
  }

  TensorParallelLeader& leader_;
  Model& single_;
  PagedKVCache tp_, one_;
};

TEST(TensorParallelCache, PrefixCacheHitsGiveTheSingleProcessLogitsOnEveryRank) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded_tiny(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  PrefixCacheStats mine;
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_TRUE(report.cache_empty);
    EXPECT_TRUE(report.checked_at_shutdown);
    mine = report.prefix_cache;
  } else {
    TensorParallelLeader leader(world, std::move(shard));
    const std::unique_ptr<Model> single = make_llama_model(single_process(config));
    Mirror m(leader, *single, true);
    const std::vector<std::int32_t> first = tokens_of(40, 0);
    m.both([](PagedKVCache& c) { c.add_sequence(0); });
    m.step({0}, {40}, first, {39});
    m.both([&](PagedKVCache& c) {
      c.set_sequence_tokens(0, first);  // publishes its 2 full pages
      c.remove_sequence(0);             // they stay cached
    });
    // 32 cached tokens of 41: only the last 9 are computed.
    std::vector<std::int32_t> second(first.begin(), first.begin() + 32);
    const std::vector<std::int32_t> tail = tokens_of(9, 5);
    second.insert(second.end(), tail.begin(), tail.end());
    m.both([&](PagedKVCache& c) { EXPECT_EQ(c.add_sequence_with_prefix(1, second), 32); });
    m.step({1}, {9}, tail, {0, 8});
    m.step({1}, {1}, {7}, {0});
    // A fork of the hit sequence, more told tokens, and a reset of the
    // cache once nothing holds it.
    m.both([&](PagedKVCache& c) {
      c.fork_sequence(1, 2, 36);
      std::vector<std::int32_t> told = second;
      told.push_back(7);
      c.set_sequence_tokens(1, told);
    });
    m.step({1, 2}, {1, 1}, {11, 12}, {0, 1});
    m.both([](PagedKVCache& c) {
      c.remove_sequence(1);
      c.remove_sequence(2);
      c.reset_prefix_cache();
    });
    mine = m.tp_cache().prefix_cache_stats();
    EXPECT_EQ(m.tp_cache().num_cached_pages(), 0);
    leader.shutdown();
  }
  // Rank 0's hits, and the same on this rank: its own cache served them.
  EXPECT_EQ(mine.queries, 1);
  EXPECT_EQ(mine.hit_tokens, 32);
  EXPECT_EQ(mine.device_hit_tokens, 32);
  EXPECT_EQ(rank0_stats(world, mine).hit_tokens, mine.hit_tokens);
}

// Requests sharing a 48-token prefix (3 pages): one runs first, the next
// three find its pages cached.
std::vector<std::vector<std::int32_t>> shared_prefix_prompts() {
  const std::vector<std::int32_t> prefix = tokens_of(48, 7);
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t i = 0; i < 4; ++i) {
    std::vector<std::int32_t> p = prefix;
    const std::vector<std::int32_t> tail = tokens_of(5 + 3 * i, 20 + i);
    p.insert(p.end(), tail.begin(), tail.end());
    prompts.push_back(p);
  }
  return prompts;
}

using Tokens = std::map<std::pair<RequestId, std::int32_t>, std::vector<std::int32_t>>;

// Adds `prompts` (greedy, max_tokens each) and steps until they finish.
void run_prompts(Engine& engine, const std::vector<std::vector<std::int32_t>>& prompts,
                 std::int32_t max_tokens, Tokens& out) {
  for (const auto& p : prompts)
    engine.add_request(p, {.max_tokens = max_tokens, .ignore_eos = true});
  while (engine.has_unfinished())
    for (const RequestOutput& o : engine.step())
      for (const SampleOutput& s : o.samples) {
        auto& tokens = out[{o.request_id, s.index}];
        tokens.insert(tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
      }
}

Tokens run_shared_prefix_requests(Engine& engine) {
  const auto prompts = shared_prefix_prompts();
  Tokens out;
  run_prompts(engine, {prompts[0]}, 12, out);
  run_prompts(engine, {prompts.begin() + 1, prompts.end()}, 12, out);
  return out;
}

EngineConfig engine_config(std::shared_ptr<Model> model, std::int64_t kv_bytes,
                           std::int64_t host_bytes, bool prefix_caching) {
  return {.model = std::move(model),
          .kv_memory_bytes = kv_bytes,
          .page_size = 16,
          .max_num_seqs = 4,
          .max_num_batched_tokens = 64,
          .deterministic = true,
          .enable_prefix_caching = prefix_caching,
          .host_kv_memory_bytes = host_bytes};
}

// A rank's pages hold its KV heads only: the same page count takes that
// share of the single process's bytes.
std::int64_t rank_bytes(std::int64_t bytes, const Model& shard, const LlamaConfig& whole) {
  return bytes * shard.spec().num_kv_heads / whole.num_kv_heads;
}

TEST(TensorParallelCache, PrefixCachingGivesTheSingleProcessTokensWithHitsOnEveryRank) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded_tiny(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  PrefixCacheStats mine;
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_TRUE(report.cache_empty);
    EXPECT_TRUE(report.checked_at_shutdown);
    mine = report.prefix_cache;
  } else {
    const std::int64_t kv_bytes = 2 << 20;
    auto leader = std::make_shared<TensorParallelLeader>(world, std::move(shard));
    Engine tp(engine_config(leader, rank_bytes(kv_bytes, *leader, config), 0, true));
    Engine single(engine_config(make_llama_model(single_process(config)), kv_bytes, 0, true));
    const Tokens tp_tokens = run_shared_prefix_requests(tp);
    const Tokens single_tokens = run_shared_prefix_requests(single);
    mine = tp.cache().prefix_cache_stats();
    leader->shutdown();
    EXPECT_EQ(tp_tokens.size(), 4u);
    EXPECT_EQ(tp_tokens, single_tokens);
    EXPECT_EQ(tp.stats().prefix_hit_tokens, single.stats().prefix_hit_tokens);
  }
  // Each of the last three requests takes the prefix's 3 pages from the cache.
  EXPECT_EQ(mine.queries, 4);
  EXPECT_EQ(mine.hit_tokens, 3 * 48);
  const PrefixCacheStats leader_stats = rank0_stats(world, mine);
  EXPECT_EQ(mine.hit_tokens, leader_stats.hit_tokens);
  EXPECT_EQ(mine.queries, leader_stats.queries);
}

// Six requests of 60 tokens (4 pages each) on 10 pages: decodes run out of
// pages and the newest requests are preempted, by swap (the host tier has
// room, and a copy of a few pages costs less than recomputing their tokens).
Tokens run_swapping_requests(Engine& engine) {
  std::vector<std::vector<std::int32_t>> prompts;
  for (std::int32_t i = 0; i < 6; ++i) prompts.push_back(tokens_of(20, 40 + i));
  Tokens out;
  run_prompts(engine, prompts, 40, out);
  return out;
}

TEST(TensorParallelCache, SwapsToTheHostTierGiveTheSingleProcessTokensOnEveryRank) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded_tiny(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  PrefixCacheStats mine;
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_TRUE(report.cache_empty);
    EXPECT_TRUE(report.checked_at_shutdown);
    EXPECT_EQ(report.num_pages, 10);
    EXPECT_EQ(report.num_host_pages, 32);
    mine = report.prefix_cache;
  } else {
    // Single-process pages: 4 layers x K and V x 2 KV heads x 64 x f16 x 16 tokens.
    const std::int64_t page_bytes = 4 * 2 * 2 * 64 * 2 * 16;
    auto leader = std::make_shared<TensorParallelLeader>(world, std::move(shard));
    Engine tp(engine_config(leader, rank_bytes(10 * page_bytes, *leader, config),
                            rank_bytes(32 * page_bytes, *leader, config), false));
    Engine single(engine_config(make_llama_model(single_process(config)), 10 * page_bytes,
                                32 * page_bytes, false));
    EXPECT_EQ(tp.cache().num_pages(), 10);
    EXPECT_EQ(single.cache().num_pages(), 10);
    const Tokens tp_tokens = run_swapping_requests(tp);
    const Tokens single_tokens = run_swapping_requests(single);
    mine = tp.cache().prefix_cache_stats();
    EXPECT_GT(tp.stats().num_swap_outs, 0);
    EXPECT_EQ(tp.stats().num_swap_ins, tp.stats().num_swap_outs);
    leader->shutdown();
    EXPECT_EQ(tp_tokens.size(), 6u);
    EXPECT_EQ(tp_tokens, single_tokens);
  }
  // Every rank's cache moved the same pages to the host tier and back.
  EXPECT_GT(mine.swapped_out_pages, 0);
  EXPECT_EQ(mine.swapped_in_pages, mine.swapped_out_pages);
  const PrefixCacheStats leader_stats = rank0_stats(world, mine);
  EXPECT_EQ(mine.swapped_out_pages, leader_stats.swapped_out_pages);
  EXPECT_EQ(mine.swapped_in_pages, leader_stats.swapped_in_pages);
}

TEST(TensorParallelCache, TokenTreesGiveTheSingleProcessLogits) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded_tiny(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_EQ(report.steps, 7);
    EXPECT_TRUE(report.cache_empty);
    EXPECT_TRUE(report.checked_at_shutdown);
    return;
  }
  TensorParallelLeader leader(world, std::move(shard));
  const std::unique_ptr<Model> single = make_llama_model(single_process(config));
  Mirror m(leader, *single, false);
  m.both([](PagedKVCache& c) {
    c.add_sequence(0);
    c.add_sequence(1);
  });
  std::vector<std::int32_t> prefill = tokens_of(12, 0);
  const std::vector<std::int32_t> other = tokens_of(17, 1);
  prefill.insert(prefill.end(), other.begin(), other.end());
  m.step({0, 1}, {12, 17}, prefill, {11, 28});
  // Sequence 0: a branching tree (nodes 1 and 2 under 0, 3 under 1, 4
  // under 2); sequence 1: a chain of 3. Every node's logits.
  m.step({0, 1}, {5, 3}, {21, 22, 23, 24, 25, 31, 32, 33}, {0, 1, 2, 3, 4, 5, 6, 7},
         {-1, 0, 0, 1, 2, -1, 0, 1});
  // Accept 0 -> 1 -> 3 of the tree and the chain's first two nodes.
  m.both([](PagedKVCache& c) {
    c.commit_accepted_token_tree_nodes(std::vector<SeqId>{0, 1}, std::vector<std::int64_t>{3, 1});
  });
  m.step({0, 1}, {1, 1}, {41, 42}, {0, 1});
  // A tree grown over two forwards on sequence 1 (the second forward's
  // nodes hang under the first's), then every node rejected.
  m.step({1}, {2}, {51, 52}, {0, 1}, {-1, -1});
  m.step({1}, {2}, {53, 54}, {0, 1}, {0, 1});
  m.both([](PagedKVCache& c) {
    c.commit_accepted_token_tree_nodes(std::vector<SeqId>{1}, std::vector<std::int64_t>{-1});
  });
  m.step({0, 1}, {1, 1}, {61, 62}, {0, 1});
  // Speculative rollback without a tree: pop_n, then decode again.
  m.both([](PagedKVCache& c) { c.pop_n(0, 2); });
  m.step({0}, {1}, {71}, {0});
  m.both([](PagedKVCache& c) {
    c.remove_sequence(0);
    c.remove_sequence(1);
  });
  leader.shutdown();
}

}  // namespace
}  // namespace pagedattn::dist
