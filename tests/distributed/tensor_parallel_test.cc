// Tensor parallelism on 2, 4 and 8 ranks against the single-process model:
// logits within tolerance, greedy tokens equal through the Engine (a batch
// with n > 1 and chunked prefill), no page leaked after aborts on any rank,
// and clear errors on every rank for configurations that cannot run. On 2
// ranks the `tiny` preset (2 KV heads: one per rank); on 4 and 8 ranks tiny
// with 8 query heads, whose 2 KV heads are replicated (each rank holds one).
// The vocabulary-parallel LM head alone equals the single process's product
// bit for bit.
//
// Tolerance: each rank sums its part of the attention-output and down
// projections' inputs and the all-reduce adds the parts, so the residual
// stream sees x + (a + b) where the single process computes x + sum over
// all inputs in one BLAS accumulation: a different float summation order,
// not a different computation. The differences are float rounding carried
// through the layers, grown where a K/V value lands on the other side of an
// f16 rounding step in the cache; the bound below is
// |tp - single| <= 2e-4 x (1 + max |single|) per logit (measured on tiny:
// up to 2.0e-4 with logits of magnitude ~4 on 2, 4 and 8 ranks, i.e. ~5e-5
// relative).
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "engine/dot_tiles.h"
#include "engine/gemm.h"
#include "engine/llama_weights.h"
#include "pagedattn/distributed/tensor_parallel.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"
#include "tensor_parallel_support.h"

namespace pagedattn::dist {
namespace {

constexpr double kRelativeTolerance = 2e-4;

// tiny on 2 ranks; on more, tiny with 8 query heads of 32 (2 KV heads, so
// replicated), which every rank count here divides.
LlamaConfig test_model(std::int32_t ranks) {
  LlamaConfig c = llama_preset("tiny");
  if (ranks <= 2) return c;
  c.num_qo_heads = 8;
  c.head_dim = 32;
  return c;
}

LlamaConfig sharded(const MpiComm& world) {
  LlamaConfig c = test_model(world.size());
  c.shard = mpi_shard(world);
  return c;
}

LlamaConfig sharded(const std::string& preset, const MpiComm& world) {
  LlamaConfig c = llama_preset(preset);
  c.shard = mpi_shard(world);
  return c;
}

// The whole model's configuration, on one process.
LlamaConfig single_process(const LlamaConfig& c) {
  LlamaConfig whole = c;
  whole.shard = {};
  return whole;
}

TEST(TensorParallel, LogitsMatchTheSingleProcessModel) {
  const auto world = MpiComm::world();
  const LlamaConfig config = sharded(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    const FollowerReport report = run_tensor_parallel_follower(world, *shard);
    EXPECT_EQ(report.steps, 3);
    EXPECT_TRUE(report.cache_empty);
    return;
  }
  TensorParallelLeader leader(world, std::move(shard));
  const std::unique_ptr<Model> single = make_llama_model(single_process(config));
  EXPECT_EQ(leader.spec().num_qo_heads * world.size(), single->spec().num_qo_heads);
  // Split while the ranks do not outnumber the KV heads, else one (copied) each.
  EXPECT_EQ(leader.spec().num_kv_heads, std::max(1, config.num_kv_heads / world.size()));
  auto cache_for = [](const ModelSpec& spec) {
    KVCacheConfig k = kv_cache_config(spec);
    k.page_size = 16;
    k.num_pages = 64;
    // f32 attention products: the sharding's numbers, not those of a fast
    // path whose rounding depends on how each side splits its keys.
    k.attention_plan.fast_prefill_products = false;
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
  const LlamaConfig config = sharded(world);
  require_same_model(world, model_fingerprint(config));
  std::unique_ptr<Model> shard = make_llama_model(config);
  if (world.rank() != 0) {
    EXPECT_TRUE(run_tensor_parallel_follower(world, *shard).cache_empty);
    return;
  }
  const std::int64_t kv_bytes = 2 << 20;
  auto leader = std::make_shared<TensorParallelLeader>(world, std::move(shard));
  // A rank's pages hold its KV heads only: the same page count takes that
  // share of the bytes.
  Engine tp(engine_config(leader, kv_bytes * leader->spec().num_kv_heads / config.num_kv_heads));
  Engine single(engine_config(make_llama_model(single_process(config)), kv_bytes));
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
  const LlamaConfig config = sharded(world);
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

// 6 query / 3 KV heads split over 2, 4 or 8 ranks: neither divides the
// other (and 6 query heads do not split 4 or 8 ways). 1, 3 and 6 ranks work
// (6: each KV head on 2 ranks).
TEST(TensorParallel, HeadsNotDivisibleByTheRankCountFailOnEveryRank) {
  const auto world = MpiComm::world();
  LlamaConfig config = sharded("tiny", world);
  config.num_qo_heads = 6;
  config.num_kv_heads = 3;
  config.head_dim = 32;
  config.intermediate_size = 768;
  require_same_model(world, model_fingerprint(config));
  try {
    make_llama_model(config);
    FAIL() << "no error for 3 KV heads on " << world.size() << " ranks";
  } catch (const InvalidArgument& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(detail::concat("num_kv_heads = 3 and the tensor-parallel size ",
                                       world.size(), " do not divide one another")),
              std::string::npos)
        << what;
    EXPECT_NE(what.find("Tensor-parallel sizes that work for this model: 1, 3, 6"),
              std::string::npos)
        << what;
  }
}

// Every vocabulary row in exactly one rank's slice, slices in rank order,
// each starting on a block boundary.
TEST(TensorParallel, VocabSlicesCoverTheVocabularyOnce) {
  for (const std::int32_t vocab : {1, 127, 128, 300, 1000, 1024, 49152})
    for (const std::int32_t size : {1, 2, 3, 4, 8}) {
      std::int32_t next = 0;
      for (std::int32_t r = 0; r < size; ++r) {
        const engine::VocabSlice s = engine::vocab_slice(vocab, r, size);
        EXPECT_EQ(s.begin, next) << vocab << " rows, rank " << r << " of " << size;
        EXPECT_TRUE(s.count == 0 || s.begin % engine::kColumnBlock == 0);
        EXPECT_GE(s.count, 0);
        next = s.begin + s.count;
      }
      EXPECT_EQ(next, vocab) << vocab << " rows over " << size << " ranks";
    }
}

// Bytes of a block-format matrix whose f16 scales stay small and finite
// (every byte below 61), different for each salt.
std::vector<std::byte> quantised_bytes(std::int64_t count, std::uint64_t salt) {
  std::vector<std::byte> bytes(static_cast<std::size_t>(count));
  std::uint64_t h = 0x9e3779b97f4a7c15ull * (salt + 1);
  for (std::byte& b : bytes) {
    h ^= h >> 31;
    h *= 0xbf58476d1ce4e5b9ull;
    b = std::byte(h % 61);
  }
  return bytes;
}

engine::WeightMatrix test_matrix(engine::WeightFormat format, std::int32_t out, std::int32_t in,
                                 std::uint64_t salt) {
  if (format != engine::WeightFormat::kF32)
    return engine::WeightMatrix::rows(
        format, quantised_bytes(out * engine::weight_row_bytes(format, in), salt), out, in);
  std::vector<float> values(std::size_t(out) * std::size_t(in));
  for (std::size_t i = 0; i < values.size(); ++i)
    values[i] = float((i * 7919 + salt * 104729) % 2001) / 1000.0f - 1.0f;
  return engine::WeightMatrix::f32(std::move(values), out, in);
}

std::vector<std::uint32_t> bits(const std::vector<float>& v) {
  std::vector<std::uint32_t> out(v.size());
  std::transform(v.begin(), v.end(), out.begin(),
                 [](float f) { return std::bit_cast<std::uint32_t>(f); });
  return out;
}

// The LM head split by vocabulary rows and all-gathered against the whole
// head's product on one rank (what the single-process model runs): equal
// bit for bit in deterministic mode (fixed tiles), on quantised weights up
// to kDotTileRows rows (the in-place kernels and dot_tiles: a column's
// result does not depend on the range a call covers) and
// with one thread (the same 128-column BLAS calls); otherwise the threads
// split the columns at other places than the slices do, and BLAS may round
// a logit differently: equal up to f32 summation order. Formats: f32 and
// Q8_0 / Q4_K (dequantised blocks through BLAS above kDotTileRows rows); vocabularies
// that leave some ranks a short or an empty slice; tied (rows read from the
// whole embedding) and untied (the rank keeps its slice only).
TEST(TensorParallel, VocabParallelLmHeadEqualsTheSingleProcessProductBitForBit) {
  const auto world = MpiComm::world();
  using engine::WeightFormat;
  for (const WeightFormat format : {WeightFormat::kF32, WeightFormat::kQ8_0, WeightFormat::kQ4_K})
    for (const std::int32_t vocab : {1000, 300})
      for (const bool tied : {true, false}) {
        LlamaConfig c = sharded(world);
        c.vocab_size = vocab;
        c.hidden_size = 256;
        c.tie_embeddings = tied;
        engine::LlamaWeights w;
        w.embedding = test_matrix(format, vocab, c.hidden_size, 1);
        if (!tied) w.lm_head = test_matrix(format, vocab, c.hidden_size, 2);
        const engine::WeightMatrix whole = tied ? w.embedding : w.lm_head;
        engine::shard_llama_weights(c, w);
        const engine::VocabSlice mine = engine::vocab_slice(vocab, world.rank(), world.size());
        if (!tied) {
          EXPECT_EQ(w.lm_head.out(), mine.count);  // the rank keeps its rows only
        }
        for (const std::int32_t rows : {1, 5, 20})
          for (const bool deterministic : {false, true}) {
            const engine::WeightMatrix x_matrix = test_matrix(WeightFormat::kF32, rows, 256, 3);
            const auto* x = static_cast<const float*>(x_matrix.data());
            std::vector<float> expected(std::size_t(rows) * vocab), got(expected.size());
            engine::LinearScratch scratch;
            engine::linear({.x = x,
                            .rows = rows,
                            .in = whole.in(),
                            .w = whole.data(),
                            .out = whole.out(),
                            .y = expected.data(),
                            .deterministic = deterministic,
                            .w_format = whole.format()},
                           scratch);
            std::vector<float> gathered;
            engine::project_lm_head(c, w, x, rows, got, deterministic, scratch, gathered);
            const std::string what = ::testing::PrintToString(engine::weight_format_name(format)) +
                                     ", vocab " + std::to_string(vocab) +
                                     (tied ? ", tied, " : ", untied, ") + std::to_string(rows) +
                                     " rows" + (deterministic ? ", deterministic" : "");
            const bool range_free = format != WeightFormat::kF32 && rows <= engine::kDotTileRows;
            if (deterministic || range_free || omp_get_max_threads() == 1) {
              EXPECT_EQ(bits(got), bits(expected)) << what;
            } else {
              for (std::size_t i = 0; i < got.size(); ++i)
                ASSERT_NEAR(got[i], expected[i], 1e-4) << what << ", logit " << i;
            }
          }
      }
}

}  // namespace
}  // namespace pagedattn::dist
