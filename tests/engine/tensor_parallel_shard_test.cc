// The Llama model's tensor-parallel shards without MPI: two shards on two
// threads whose all_reduce_sum meets in memory give the single model's
// logits (within float rounding: the partial sums are added in another
// order), each reporting half of the heads; shard validation and the
// block alignment of quantised weight slices.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <thread>

#include "engine/weight_matrix.h"
#include "pagedattn/errors.h"
#include "pagedattn/llama.h"
#include "support/in_memory_all_reduce.h"

namespace pagedattn {
namespace {

using test::InMemoryAllReduce;

// Prefill 9 tokens of sequence 0, then one decode; the last step's logits.
std::vector<float> two_steps(Model& model) {
  KVCacheConfig k = kv_cache_config(model.spec());
  k.num_pages = 8;
  PagedKVCache cache(k);
  cache.add_sequence(0);
  std::vector<float> logits(std::size_t(model.spec().vocab_size));
  const std::vector<std::int32_t> prompt = {3, 14, 15, 92, 65, 35, 89, 79, 32};
  for (const auto& [tokens, length] : {std::pair{prompt, std::int64_t{9}}, {{38}, 1}}) {
    cache.begin_forward(std::vector<SeqId>{0}, std::vector<std::int64_t>{length});
    const std::vector<std::int32_t> row = {static_cast<std::int32_t>(length) - 1};
    model.forward({tokens, row, false}, cache, logits);
    cache.end_forward();
  }
  return logits;
}

TEST(TensorParallelShard, TwoShardsGiveTheWholeModelsLogits) {
  const std::unique_ptr<Model> whole = make_llama_model(llama_preset("tiny"));
  const std::vector<float> expected = two_steps(*whole);
  InMemoryAllReduce reduce(2);
  std::vector<float> got[2];
  std::vector<std::thread> ranks;
  for (int r = 0; r < 2; ++r)
    ranks.emplace_back([&, r] {
      LlamaConfig c = llama_preset("tiny");
      c.shard = {r, 2, [&](std::span<float> v) { reduce(v); }};
      const std::unique_ptr<Model> shard = make_llama_model(c);
      EXPECT_EQ(shard->spec().num_qo_heads, 2);
      EXPECT_EQ(shard->spec().num_kv_heads, 1);
      got[r] = two_steps(*shard);
    });
  for (std::thread& t : ranks) t.join();
  EXPECT_EQ(got[0], got[1]);  // replicated LM head over the same residual stream
  double worst = 0.0, scale = 1.0;
  for (std::size_t i = 0; i < expected.size(); ++i) {
    worst = std::max(worst, std::abs(double(got[0][i]) - expected[i]));
    scale = std::max(scale, 1.0 + std::abs(double(expected[i])));
  }
  EXPECT_LE(worst, 2e-4 * scale);
}

TEST(TensorParallelShard, RefusesShardsThatCannotSplitTheModel) {
  LlamaConfig c = llama_preset("tiny");  // 4 query / 2 KV heads, intermediate 688
  c.shard = {0, 2, {}};
  EXPECT_THROW(make_llama_model(c), InvalidArgument);  // no all_reduce_sum
  c.shard = {0, 3, [](std::span<float>) {}};
  try {
    make_llama_model(c);
    FAIL() << "2 KV heads split 3 ways";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("num_kv_heads = 2"), std::string::npos) << e.what();
  }
  c.shard = {2, 2, [](std::span<float>) {}};
  EXPECT_THROW(make_llama_model(c), InvalidArgument);  // rank outside [0, size)
}

TEST(TensorParallelShard, QuantisedSlicesKeepWholeBlocks) {
  using engine::WeightFormat;
  using engine::WeightMatrix;
  const std::int32_t out = 3, in = 128;
  const std::int64_t row_bytes = engine::weight_row_bytes(WeightFormat::kQ8_0, in);
  std::vector<std::byte> bytes(std::size_t(out * row_bytes));
  for (std::size_t i = 0; i < bytes.size(); ++i)
    bytes[i] = std::byte((i * 7) % 61);  // small scales
  const WeightMatrix m = WeightMatrix::rows(WeightFormat::kQ8_0, bytes, out, in);
  const WeightMatrix s = m.slice(1, 2, 64, 64, "w");
  std::vector<float> whole(in), part(64);
  for (std::int32_t r = 0; r < 2; ++r) {
    m.row_to_f32(r + 1, whole.data());
    s.row_to_f32(r, part.data());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 64));
  }
  try {
    m.slice(0, out, 48, 64, "ffn_down");
    FAIL() << "a slice starting inside a block";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ffn_down is q8_0"), std::string::npos) << e.what();
  }
}

// F16 / BF16 slices stay 16-bit on 32-weight boundaries; off them they come
// back as f32, the same values (a shard size that leaves a partial block).
TEST(TensorParallelShard, SixteenBitSlicesOffBlocksAreWidened) {
  using engine::WeightFormat;
  using engine::WeightMatrix;
  for (const WeightFormat f : {WeightFormat::kF16, WeightFormat::kBF16}) {
    const std::int32_t out = 3, in = 96;
    std::vector<std::byte> bytes(std::size_t(out * engine::weight_row_bytes(f, in)));
    for (std::size_t i = 0; i < bytes.size(); i += 2) {  // finite values, any bits below
      bytes[i] = std::byte((i * 37) % 251);
      bytes[i + 1] = std::byte(0x3c ^ ((i / 2) % 3));
    }
    const WeightMatrix m = WeightMatrix::rows(f, bytes, out, in);
    for (const auto& [begin, cols] : {std::pair{32, 64}, {16, 48}, {0, 40}, {40, 56}}) {
      SCOPED_TRACE(std::string(engine::weight_format_name(f)) + " columns " +
                   std::to_string(begin) + " +" + std::to_string(cols));
      const WeightMatrix s = m.slice(1, 2, begin, cols, "w");
      const bool whole_blocks = begin % 32 == 0 && cols % 32 == 0;
      EXPECT_EQ(s.format(), whole_blocks ? f : WeightFormat::kF32);
      EXPECT_EQ(s.out(), 2);
      EXPECT_EQ(s.in(), cols);
      std::vector<float> whole(in), part(static_cast<std::size_t>(cols));
      for (std::int32_t r = 0; r < 2; ++r) {
        m.row_to_f32(r + 1, whole.data());
        s.row_to_f32(r, part.data());
        EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + begin));
      }
    }
  }
}

// K-quant matrices split on 256-weight super-block boundaries only.
TEST(TensorParallelShard, KQuantSlicesKeepWholeSuperBlocks) {
  using engine::WeightFormat;
  using engine::WeightMatrix;
  for (const WeightFormat f : {WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K}) {
    const std::int32_t out = 3, in = 768;
    const std::int64_t row_bytes = engine::weight_row_bytes(f, in);
    std::vector<std::byte> bytes(std::size_t(out * row_bytes));
    for (std::size_t i = 0; i < bytes.size(); ++i)
      bytes[i] = std::byte((i * 7) % 61);  // small scales
    const WeightMatrix m = WeightMatrix::rows(f, bytes, out, in);
    const WeightMatrix s = m.slice(1, 2, 256, 512, "w");
    EXPECT_EQ(s.bytes(), 2 * engine::weight_row_bytes(f, 512));
    std::vector<float> whole(in), part(512);
    for (std::int32_t r = 0; r < 2; ++r) {
      m.row_to_f32(r + 1, whole.data());
      s.row_to_f32(r, part.data());
      EXPECT_TRUE(std::equal(part.begin(), part.end(), whole.begin() + 256));
    }
    for (const auto& [begin, cols] : {std::pair{32, 256}, {256, 224}, {0, 32}}) {
      try {
        m.slice(0, out, begin, cols, "ffn_down");
        FAIL() << "columns [" << begin << ", +" << cols << ") of a K-quant matrix";
      } catch (const InvalidArgument& e) {
        const std::string what = e.what();
        EXPECT_NE(what.find(std::string("ffn_down is ") + engine::weight_format_name(f)),
                  std::string::npos)
            << what;
        EXPECT_NE(what.find("does not fall on 256-weight block boundaries"), std::string::npos)
            << what;
      }
    }
  }
}

}  // namespace
}  // namespace pagedattn
