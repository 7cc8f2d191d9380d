// Sampling: greedy ties, top-k / top-p supports, and the empirical
// distribution of temperature sampling against the softmax.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <cmath>

namespace pagedattn::engine {
namespace {

TEST(Sampler, GreedyTakesTheLowestIdAmongTies) {
  Sampler s;
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f};
  EXPECT_EQ(s.sample(logits, {}, 1, 0, 0), 1);
}

TEST(Sampler, TopKAndTopPRestrictTheSupport) {
  Sampler s;
  const std::vector<float> logits = {3.0f, 2.9f, 0.0f, -1.0f, 2.8f};
  SamplingParams k{.temperature = 1.0f, .top_k = 2};
  SamplingParams p{.temperature = 1.0f, .top_p = 0.5f};
  for (std::int64_t pos = 0; pos < 500; ++pos) {
    const std::int32_t a = s.sample(logits, k, 9, 0, pos);
    EXPECT_TRUE(a == 0 || a == 1) << a;
    const std::int32_t b = s.sample(logits, p, 9, 0, pos);
    EXPECT_TRUE(b == 0 || b == 1) << b;  // p(0) = 0.36 < 0.5, p(0) + p(1) >= 0.5
  }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  Sampler s;
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f};
  const float temperature = 0.7f;
  std::vector<double> expected(logits.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i) sum += expected[i] = std::exp(logits[i] / temperature);
  std::vector<int> counts(logits.size());
  const int draws = 20000;
  for (int i = 0; i < draws; ++i) ++counts[s.sample(logits, {.temperature = temperature}, 3, 1, i)];
  for (std::size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(counts[i] / double(draws), expected[i] / sum, 0.015) << "token " << i;
}

TEST(Sampler, DrawsDependOnlyOnSeedSampleAndPosition) {
  Sampler a, b;
  const std::vector<float> logits(50, 0.0f);
  const SamplingParams p{.temperature = 1.0f};
  for (std::int64_t pos = 0; pos < 20; ++pos) EXPECT_EQ(a.sample(logits, p, 5, 2, pos), b.sample(logits, p, 5, 2, pos));
}

}  // namespace
}  // namespace pagedattn::engine
