// The built-in model through the cache: in deterministic mode a token's
// logits are bitwise the same whatever else is in the batch, however its
// prompt was chunked, with any number of OpenMP threads and whatever
// OpenBLAS's own thread count was set to.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>

#include "engine/gemm.h"
#include "pagedattn/llama.h"

namespace pagedattn {
namespace {

struct Runner {
  std::shared_ptr<Model> model;
  PagedKVCache cache;
  explicit Runner(std::shared_ptr<Model> m)
      : model(std::move(m)), cache([&] {
          const ModelSpec& s = model->spec();
          KVCacheConfig c;
          c.num_layers = s.num_layers;
          c.num_qo_heads = s.num_qo_heads;
          c.num_kv_heads = s.num_kv_heads;
          c.head_dim = s.head_dim;
          c.page_size = 16;
          c.num_pages = 256;
          c.rope_mode = s.rope_mode;
          c.rope = s.rope;
          c.attention_plan.fixed_kv_chunk = 64;
          return c;
        }()) {}

  // One step: seq ids with their new tokens; returns the logits of each
  // sequence's last new token.
  std::vector<std::vector<float>> step(const std::vector<SeqId>& ids,
                                       const std::vector<std::vector<std::int32_t>>& tokens) {
    std::vector<std::int64_t> lens;
    std::vector<std::int32_t> flat, rows;
    for (const auto& t : tokens) {
      lens.push_back(std::ssize(t));
      flat.insert(flat.end(), t.begin(), t.end());
      rows.push_back(static_cast<std::int32_t>(flat.size()) - 1);
    }
    const std::size_t vocab = std::size_t(model->spec().vocab_size);
    std::vector<float> logits(rows.size() * vocab);
    cache.begin_forward(ids, lens);
    model->forward({flat, rows, true}, cache, logits);
    cache.end_forward();
    std::vector<std::vector<float>> out;
    for (std::size_t r = 0; r < rows.size(); ++r)
      out.emplace_back(logits.begin() + r * vocab, logits.begin() + (r + 1) * vocab);
    return out;
  }
};

std::vector<std::int32_t> tokens(std::int32_t begin, std::int32_t end, std::int32_t salt) {
  std::vector<std::int32_t> t;
  for (std::int32_t i = begin; i < end; ++i) t.push_back((i * 53 + salt) % 200);
  return t;
}

constexpr std::int32_t kPrompt = 150;

std::shared_ptr<Model> test_model() {
  static std::shared_ptr<Model> model = [] {
    LlamaConfig c = llama_preset("tiny");
    c.num_layers = 2;
    c.vocab_size = 200;
    return std::shared_ptr<Model>(make_llama_model(c));
  }();
  return model;
}

// Alone: the prompt in one chunk, then one decode; the decode's logits.
std::vector<float> solo_logits() {
  Runner solo(test_model());
  solo.cache.add_sequence(0);
  solo.step({0}, {tokens(0, kPrompt, 1)});
  return solo.step({0}, {tokens(kPrompt, kPrompt + 1, 1)})[0];
}

// Batched: the same prompt in chunks of 37 beside another sequence's
// 90-token prefill and then its decodes (so the tokens sit at other places
// in the row blocks), then the decode beside more.
std::vector<float> batched_logits() {
  Runner mixed(test_model());
  mixed.cache.add_sequence(0);
  mixed.cache.add_sequence(1);
  std::int32_t done = 0, other = 0;
  while (done < kPrompt) {
    const std::int32_t n = std::min(37, kPrompt - done);
    const std::int32_t m = other == 0 ? 90 : 1;
    mixed.step({1, 0}, {tokens(other, other + m, 2), tokens(done, done + n, 1)});
    done += n;
    other += m;
  }
  return mixed.step({1, 0}, {tokens(other, other + 1, 2), tokens(kPrompt, kPrompt + 1, 1)})[1];
}

void expect_bitwise_equal(const std::vector<float>& got, const std::vector<float>& expected) {
  ASSERT_EQ(got.size(), expected.size());
  EXPECT_EQ(std::memcmp(got.data(), expected.data(), got.size() * sizeof(float)), 0);
  bool finite = true;
  for (float v : got) finite &= std::isfinite(v);
  EXPECT_TRUE(finite);
}

// Restores OpenMP's thread count at the end of a test.
struct OmpThreads {
  int saved = omp_get_max_threads();
  explicit OmpThreads(int threads) { omp_set_num_threads(threads); }
  ~OmpThreads() { omp_set_num_threads(saved); }
};

TEST(LlamaModel, LogitsAreBitwiseIndependentOfBatchAndChunking) {
  expect_bitwise_equal(batched_logits(), solo_logits());
}

TEST(LlamaModel, LogitsAreBitwiseIndependentOfTheOpenMPThreadCount) {
  std::vector<float> one_thread;
  {
    OmpThreads threads(1);
    one_thread = solo_logits();
  }
  OmpThreads threads(2);  // more threads than the machine may have is fine
  expect_bitwise_equal(solo_logits(), one_thread);
  expect_bitwise_equal(batched_logits(), one_thread);
}

TEST(LlamaModel, OpenBLASThreadsChangedByTheUserAreResetAndDoNotMatter) {
  const std::vector<float> expected = solo_logits();
  if (engine::blas_threads() == 0) GTEST_SKIP() << "not OpenBLAS";
  EXPECT_EQ(engine::blas_threads(), 1);  // set by the model
  engine::set_blas_threads(2);           // as OPENBLAS_NUM_THREADS=2 would
  expect_bitwise_equal(batched_logits(), expected);
  EXPECT_EQ(engine::blas_threads(), 1);  // reset by forward
}

}  // namespace
}  // namespace pagedattn
