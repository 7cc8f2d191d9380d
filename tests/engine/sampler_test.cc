// Sampling: greedy ties, top-k / top-p supports, and the empirical
// distribution of temperature sampling against the softmax.
#include "engine/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <tuple>

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
    const std::int32_t a = s.sample(logits, k, 9, 0, pos).value();
    EXPECT_TRUE(a == 0 || a == 1) << a;
    const std::int32_t b = s.sample(logits, p, 9, 0, pos).value();
    EXPECT_TRUE(b == 0 || b == 1) << b;  // p(0) = 0.36 < 0.5, p(0) + p(1) >= 0.5
  }
}

TEST(Sampler, FrequenciesFollowTheSoftmax) {
  Sampler s;
  const std::vector<float> logits = {1.0f, 0.0f, -0.5f, 2.0f};
  const float temperature = 0.7f;
  std::vector<double> expected(logits.size());
  double sum = 0.0;
  for (std::size_t i = 0; i < logits.size(); ++i)
    sum += expected[i] = std::exp(logits[i] / temperature);
  std::vector<int> counts(logits.size());
  const int draws = 20000;
  for (int i = 0; i < draws; ++i)
    ++counts[s.sample(logits, {.temperature = temperature}, 3, 1, i).value()];
  for (std::size_t i = 0; i < logits.size(); ++i)
    EXPECT_NEAR(counts[i] / double(draws), expected[i] / sum, 0.015) << "token " << i;
}

// A reference by a full sort: the probability of each token under top-k
// then top-p (the smallest most-likely-first prefix reaching top_p).
std::vector<double> reference_distribution(const std::vector<float>& logits, float temperature,
                                           std::int32_t top_k, float top_p) {
  std::vector<std::int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](auto a, auto b) { return logits[a] > logits[b]; });
  if (top_k > 0) order.resize(std::min(order.size(), std::size_t(top_k)));
  std::vector<double> w;
  double sum = 0.0;
  for (std::int32_t t : order)
    sum += w.emplace_back(std::exp((logits[t] - logits[order[0]]) / temperature));
  std::size_t prefix = 0;
  double mass = 0.0;
  while (prefix < order.size() && mass < top_p * sum) mass += w[prefix++];
  std::vector<double> p(logits.size(), 0.0);
  for (std::size_t i = 0; i < prefix; ++i) p[std::size_t(order[i])] = w[i] / mass;
  return p;
}

TEST(Sampler, WideNucleusAndTopKFollowAFullSortReference) {
  // 400 distinct logits in shuffled order; top_p 0.6 needs well over the
  // first 64 candidates, so the nucleus is sorted in several rounds.
  std::vector<float> logits(400);
  for (std::size_t i = 0; i < logits.size(); ++i) logits[(i * 151) % 400] = -0.01f * float(i);
  const int draws = 30000;
  for (const auto& [top_k, top_p] : {std::pair{0, 0.6f}, {50, 1.0f}, {120, 0.9f}}) {
    const SamplingParams params{.temperature = 0.8f, .top_k = top_k, .top_p = top_p};
    const std::vector<double> expected = reference_distribution(logits, 0.8f, top_k, top_p);
    Sampler s;
    std::vector<int> counts(logits.size());
    for (int i = 0; i < draws; ++i)
      ++counts[std::size_t(s.sample(logits, params, 11, 0, i).value())];
    std::size_t support = 0;
    for (std::size_t t = 0; t < logits.size(); ++t) {
      support += expected[t] > 0.0;
      if (expected[t] == 0.0) {
        ASSERT_EQ(counts[t], 0) << "token " << t << " is outside the support";
      }
      EXPECT_NEAR(counts[t] / double(draws), expected[t], 0.0045) << "token " << t;
    }
    EXPECT_GT(support, top_k == 50 ? 49u : 64u);
  }
}

// top_k and top_p first gather candidates by bins of their distance below
// the most likely token (8 per unit of (max - logit) / temperature, up to
// 32 units): the cut falls inside groups of tied logits (the lowest ids
// kept), beyond the binned range, and at a temperature that puts every
// logit but the first far apart. The draws follow the full-sort reference.
TEST(Sampler, CandidateBinsKeepTiesAndFarTokens) {
  std::vector<float> logits(1200, -60.0f);                       // far below: the last bin
  for (std::size_t t = 0; t < 1200; t += 37) logits[t] = 2.0f;   // 33 tokens
  for (std::size_t t = 5; t < 1200; t += 41) logits[t] = 1.99f;  // 30 just below
  const int draws = 12000;
  for (const auto& [temperature, top_k, top_p] : {std::tuple{1.0f, 40, 1.0f},  // inside 1.99
                                                  {1.0f, 0, 0.7f},             // inside 1.99
                                                  {1.0f, 100, 1.0f},           // into the far bin
                                                  {0.001f, 45, 1.0f},    // 1.99 is 10 units below
                                                  {40.0f, 0, 0.98f}}) {  // every bin counts
    const SamplingParams params{.temperature = temperature, .top_k = top_k, .top_p = top_p};
    const std::vector<double> expected = reference_distribution(logits, temperature, top_k, top_p);
    Sampler s;
    std::vector<int> counts(logits.size());
    for (int i = 0; i < draws; ++i)
      ++counts[std::size_t(s.sample(logits, params, 13, 0, i).value())];
    for (std::size_t t = 0; t < logits.size(); ++t) {
      if (expected[t] == 0.0) {
        ASSERT_EQ(counts[t], 0) << "token " << t << " is outside the support, T " << temperature
                                << " top_k " << top_k << " top_p " << top_p;
      }
      EXPECT_NEAR(counts[t] / double(draws), expected[t], 0.008)
          << "token " << t << ", T " << temperature << " top_k " << top_k << " top_p " << top_p;
    }
  }
}

TEST(Sampler, DrawsDependOnlyOnSeedSampleAndPosition) {
  Sampler a, b;
  const std::vector<float> logits(50, 0.0f);
  const SamplingParams p{.temperature = 1.0f};
  for (std::int64_t pos = 0; pos < 20; ++pos)
    EXPECT_EQ(a.sample(logits, p, 5, 2, pos), b.sample(logits, p, 5, 2, pos));
}

// A NaN or an infinity anywhere in the row gives no token in any mode
// (greedy's argmax of NaNs was token 0), and the count names both kinds.
TEST(Sampler, NonFiniteLogitsGiveNoToken) {
  Sampler s;
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  const SamplingParams modes[] = {{},
                                  {.temperature = 1.0f},
                                  {.temperature = 1.0f, .top_k = 2},
                                  {.temperature = 1.0f, .top_p = 0.5f}};
  for (const std::vector<float>& logits :
       {std::vector<float>{nan, nan, nan}, std::vector<float>{0.5f, inf, 0.1f},
        std::vector<float>{0.5f, 0.2f, -inf}}) {
    for (const SamplingParams& p : modes) EXPECT_FALSE(s.sample(logits, p, 1, 0, 0).has_value());
  }
  EXPECT_EQ(describe_non_finite(std::vector<float>{nan, inf, -inf, 1.0f}),
            "1 NaN and 2 Inf of 4 logits");
}

// Greedy takes its maximum in lane blocks: against a plain first-maximum
// scan on random rows of every length around the block (ties drawn from a
// few values, signed zeros), and with one NaN or infinity at each place,
// the tail included.
TEST(Sampler, GreedyMatchesAFirstMaximumScanOnRandomRows) {
  Sampler s;
  std::mt19937 rng(7);
  const float values[] = {-1.0f, -0.0f, 0.0f, 0.25f, 3.0f, -2.5f};
  for (std::size_t n = 1; n <= 70; ++n)
    for (int round = 0; round < 20; ++round) {
      std::vector<float> logits(n);
      for (float& v : logits) v = values[rng() % std::size(values)];
      std::int32_t expected = 0;
      for (std::size_t t = 1; t < n; ++t)
        if (logits[t] > logits[std::size_t(expected)]) expected = static_cast<std::int32_t>(t);
      ASSERT_EQ(s.sample(logits, {}, 1, 0, 0), expected) << n << " logits, round " << round;
      const std::size_t bad = rng() % n;
      logits[bad] = round % 2 ? std::numeric_limits<float>::quiet_NaN()
                              : -std::numeric_limits<float>::infinity();
      EXPECT_FALSE(s.sample(logits, {}, 1, 0, 0).has_value()) << n << " logits, bad at " << bad;
    }
}

}  // namespace
}  // namespace pagedattn::engine
