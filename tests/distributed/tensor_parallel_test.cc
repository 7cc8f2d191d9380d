// Tensor parallelism on 2 ranks against the single-process model: logits
// within tolerance, greedy tokens equal through the Engine (a batch with
// n > 1 and chunked prefill), no page leaked after aborts on any rank, and
// clear errors on every rank for configurations that cannot run.
//
// Tolerance: each rank sums its half of the attention-output and down
// projections' inputs and the all-reduce adds the halves, so the residual
// stream sees x + (a + b) where the single process computes x + sum over
// all inputs in one BLAS accumulation: a different float summation order,
// not a different computation. The differences are float rounding carried
// through the layers, grown where a K/V value lands on the other side of an
// f16 rounding step in the cache; the bound below is
// |tp - single| <= 2e-4 x (1 + max |single|) per logit (measured on tiny:
// up to 1.3e-4 with logits of magnitude ~4, i.e. ~3e-5 relative).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <vector>

#include "pagedattn/distributed/tensor_parallel.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_support.h"

namespace pagedattn::dist {
namespace {

constexpr double kRelativeTolerance = 2e-4;

LlamaConfig sharded(const std::string& preset, const MpiComm& world) {
  LlamaConfig c = llama_preset(preset);
  c.shard = mpi_shard(world);
  return c;
}

TEST(TensorParallel, LogitsMatchTheSingleProcessModel) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded("tiny", world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_EQ(report.steps, 3);
    EXPECT_TRUE(report.cache_empty);
    return;
  }
  TensorParallelLeader leader(world, std::move(shard));
  const std::unique_ptr<Model> single = make_llama_model(llama_preset("tiny"));
  EXPECT_EQ(leader.spec().num_qo_heads * world.size(), single->spec().num_qo_heads);
  EXPECT_EQ(leader.spec().num_kv_heads * world.size(), single->spec().num_kv_heads);
  auto cache_for = [](const ModelSpec& spec) {
    KVCacheConfig k = kv_cache_config(spec);
    k.page_size = 16;
    k.num_pages = 64;
    return k;
  };
  PagedKVCache tp_cache(cache_for(leader.spec())), single_cache(cache_for(single->spec()));
  leader.attach_cache(tp_cache);
  // The same operations and steps on both caches; every step's logits compared.
  auto both = [&](auto&& op) {
    op(tp_cache);
    op(single_cache);
  };
  auto compare = [&](const std::vector<SeqId>& seqs, const std::vector<std::int64_t>& lengths,
                     const std::vector<std::int32_t>& tokens,
                     const std::vector<std::int32_t>& rows) {
    const std::vector<float> tp = run_step(leader, tp_cache, seqs, lengths, tokens, rows);
    const std::vector<float> ref = run_step(*single, single_cache, seqs, lengths, tokens, rows);
    ASSERT_EQ(tp.size(), ref.size());
    const double bound = kRelativeTolerance * (1.0 + max_abs(ref));
    const double worst = max_abs_difference(tp, ref);
    EXPECT_LE(worst, bound) << "logits differ by up to " << worst;
  };
  both([](PagedKVCache& c) {
    c.add_sequence(0);
    c.add_sequence(1);
  });
  std::vector<std::int32_t> prefill = tokens_of(7, 0), second = tokens_of(13, 1);
  prefill.insert(prefill.end(), second.begin(), second.end());
  compare({0, 1}, {7, 13}, prefill, {6, 19});
  both([](PagedKVCache& c) {
    c.fork_sequence(1, 2, 10);
    c.remove_sequence(0);
    c.add_sequence(3);
  });
  std::vector<std::int32_t> mixed = {5, 9};
  const std::vector<std::int32_t> third = tokens_of(21, 2);
  mixed.insert(mixed.end(), third.begin(), third.end());
  compare({1, 2, 3}, {1, 1, 21}, mixed, {0, 1, 10, 22});
  compare({1, 2, 3}, {1, 1, 1}, {11, 12, 13}, {0, 1, 2});
  both([](PagedKVCache& c) {
    for (SeqId id : c.sequence_ids()) c.remove_sequence(id);
  });
  leader.shutdown();
  tp_cache.check_invariants();
  EXPECT_TRUE(tp_cache.empty());
}

// Chunked prefill (32-token budget, prompts up to 70) and a request with n = 3.
const std::vector<Request> kRequests = {{5, 30, 1}, {40, 24, 1}, {70, 20, 3}, {12, 32, 1}};

EngineConfig engine_config(std::shared_ptr<Model> model, std::int64_t kv_bytes) {
  return {.model = std::move(model),
          .kv_memory_bytes = kv_bytes,
          .page_size = 16,
          .max_num_seqs = 8,
          .max_num_batched_tokens = 32};
}

TEST(TensorParallel, GreedyTokensEqualTheSingleProcessEngine) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded("tiny", world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    EXPECT_TRUE(run_tensor_parallel_follower(world, *shard).cache_empty);
    return;
  }
  const std::int64_t kv_bytes = 2 << 20;
  auto leader = std::make_shared<TensorParallelLeader>(world, std::move(shard));
  // Each rank holds 1/N of the KV heads: the same pages take 1/N of the bytes.
  Engine tp(engine_config(leader, kv_bytes / world.size()));
  Engine single(engine_config(make_llama_model(llama_preset("tiny")), kv_bytes));
  EXPECT_EQ(tp.cache().num_pages(), single.cache().num_pages());
  const auto tp_tokens = run_engine(tp, kRequests);
  EXPECT_TRUE(tp.cache().empty());
  leader->shutdown();
  const auto single_tokens = run_engine(single, kRequests);
  EXPECT_EQ(tp_tokens.size(), 6u);
  EXPECT_EQ(tp_tokens, single_tokens);
}

TEST(TensorParallel, AbortsLeaveNoPageOnAnyRank) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded("tiny", world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_TRUE(report.cache_empty);
    EXPECT_GT(report.steps, 0);
    return;
  }
  auto leader = std::make_shared<TensorParallelLeader>(world, std::move(shard));
  Engine engine(engine_config(leader, 1 << 20));
  std::vector<RequestId> ids;
  for (std::size_t i = 0; i < kRequests.size(); ++i)
    ids.push_back(engine.add_request(tokens_of(kRequests[i].prompt_len, std::int32_t(i)),
                                     {.max_tokens = kRequests[i].max_tokens, .n = kRequests[i].n}));
  for (int s = 0; s < 3; ++s) engine.step();
  engine.abort(ids[2]);  // n = 3, still in its chunked prefill
  engine.step();
  engine.abort(ids[0]);  // decoding
  engine.abort(ids[3]);
  while (engine.has_unfinished()) engine.step();
  engine.cache().check_invariants();
  EXPECT_TRUE(engine.cache().empty());
  leader->shutdown();
}

TEST(TensorParallel, RanksWithDifferentModelsFailOnEveryRank) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded(world.rank() == 1 ? "small" : "tiny", world);
  try {
    require_same_model(world, model_fingerprint(config));
    FAIL() << "no error for different models";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("rank(s) 1 differ from rank 0"), std::string::npos)
        << e.what();
  }
}

TEST(TensorParallel, HeadsNotDivisibleByTheRankCountFailOnEveryRank) {
  const auto world = MpiComm::world();
  LlamaConfig config = sharded("tiny", world);
  config.num_qo_heads = 3;
  config.num_kv_heads = 3;
  require_same_model(world, model_fingerprint(config));
  try {
    make_llama_model(config);
    FAIL() << "no error for 3 KV heads on " << world.size() << " ranks";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_heads = 3"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("not divisible by the tensor-parallel size"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace pagedattn::dist
