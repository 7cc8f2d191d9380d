#include "sampler.h"

#include <algorithm>
#include <cmath>

#include "counter_random.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

// Larger logit first; the lower token id wins ties.
bool before(const std::pair<float, std::int32_t>& a, const std::pair<float, std::int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

// The largest logit (the lowest token id on ties) and whether every logit
// is finite, in one pass: the check costs no extra read of the row.
struct RowMax {
  std::int32_t token = 0;
  bool finite = true;
};

RowMax row_max(std::span<const float> logits) {
  RowMax m;
  float best = logits[0];
  bool finite = std::isfinite(best);
  for (std::int32_t t = 1; t < std::ssize(logits); ++t) {
    const float v = logits[t];
    finite &= std::isfinite(v);
    if (v > best) {
      best = v;
      m.token = t;
    }
  }
  m.finite = finite;
  return m;
}

// Nucleus candidates are sorted this many at first, then twice as many each
// time the mass so far falls short.
constexpr std::size_t kFirstNucleusChunk = 64;

}  // namespace

NonFiniteCount count_non_finite(std::span<const float> logits) {
  NonFiniteCount c;
  for (const float v : logits) {
    c.nan += std::isnan(v) ? 1 : 0;
    c.inf += std::isinf(v) ? 1 : 0;
  }
  return c;
}

std::string describe_non_finite(std::span<const float> logits) {
  const NonFiniteCount c = count_non_finite(logits);
  return detail::concat(c.nan, " NaN and ", c.inf, " Inf of ", logits.size(), " logits");
}

std::optional<std::int32_t> Sampler::sample(std::span<const float> logits,
                                            const SamplingParams& params, std::uint64_t seed,
                                            std::int32_t sample_index, std::int64_t position) {
  const RowMax row = row_max(logits);
  if (!row.finite) return std::nullopt;
  if (params.temperature == 0.0f) return row.token;
  // Softmax weights of logit / temperature, in double, relative to the largest.
  const double max = logits[std::size_t(row.token)];
  auto weight = [&](float logit) { return std::exp((logit - max) / params.temperature); };
  const double u = counter_uniform(seed, static_cast<std::uint64_t>(sample_index),
                                   static_cast<std::uint64_t>(position));
  const std::size_t vocab = logits.size();
  const bool top_k = params.top_k > 0 && static_cast<std::size_t>(params.top_k) < vocab;
  const bool top_p = params.top_p < 1.0f;

  if (!top_k && !top_p) {  // the whole vocabulary, in token order: no sorting
    probs_.resize(vocab);
    double sum = 0.0;
    for (std::size_t t = 0; t < vocab; ++t) sum += probs_[t] = weight(logits[t]);
    const double target = u * sum;
    double acc = 0.0;
    for (std::size_t t = 0; t < vocab; ++t)
      if (target < (acc += probs_[t])) return static_cast<std::int32_t>(t);
    return static_cast<std::int32_t>(vocab - 1);
  }

  candidates_.resize(vocab);
  for (std::size_t t = 0; t < vocab; ++t)
    candidates_[t] = {logits[t], static_cast<std::int32_t>(t)};
  const auto first = candidates_.begin();
  std::size_t keep = vocab;
  if (top_k) {  // the k most likely, in no particular order
    keep = static_cast<std::size_t>(params.top_k);
    std::nth_element(first, first + keep, candidates_.end(), before);
  }
  probs_.resize(keep);
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) sum += probs_[i] = weight(candidates_[i].first);
  if (top_p) {
    // The smallest most-likely-first prefix whose mass reaches top_p: sort
    // only as far as that prefix reaches.
    const double goal = params.top_p * sum;
    double mass = 0.0;
    std::size_t prefix = 0, sorted = 0, chunk = kFirstNucleusChunk;
    while (prefix < keep && mass < goal) {
      if (prefix == sorted) {
        const std::size_t end = std::min(keep, sorted + chunk);
        std::nth_element(first + sorted, first + end, first + keep, before);
        std::sort(first + sorted, first + end, before);
        sorted = end;
        chunk *= 2;
      }
      mass += probs_[prefix] = weight(candidates_[prefix].first);
      ++prefix;
    }
    keep = prefix;
    sum = mass;
  }
  const double target = u * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i)
    if (target < (acc += probs_[i])) return candidates_[i].second;
  return candidates_[keep - 1].second;
}

}  // namespace pagedattn::engine

namespace pagedattn {

std::int32_t sample_token(std::span<const float> logits, const SamplingParams& params,
                          std::uint64_t seed, std::int32_t sample_index, std::int64_t position) {
  require(!logits.empty(), "sample_token: logits is empty");
  engine::Sampler sampler;
  const std::optional<std::int32_t> token =
      sampler.sample(logits, params, seed, sample_index, position);
  require(token.has_value(), "sample_token: logits are not finite (",
          engine::describe_non_finite(logits), "; position ", position, ")");
  return *token;
}

}  // namespace pagedattn
