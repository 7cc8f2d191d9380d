#include "sampler.h"

#include <algorithm>
#include <cmath>

#include "counter_random.h"

namespace pagedattn::engine {
namespace {

// Larger logit first; the lower token id wins ties.
bool before(const std::pair<float, std::int32_t>& a, const std::pair<float, std::int32_t>& b) {
  return a.first != b.first ? a.first > b.first : a.second < b.second;
}

std::int32_t argmax(std::span<const float> logits) {
  std::int32_t best = 0;
  for (std::int32_t t = 1; t < std::ssize(logits); ++t)
    if (logits[t] > logits[best]) best = t;
  return best;
}

}  // namespace

std::int32_t Sampler::sample(std::span<const float> logits, const SamplingParams& params,
                             std::uint64_t seed, std::int32_t sample_index, std::int64_t position) {
  if (params.temperature == 0.0f) return argmax(logits);
  candidates_.resize(logits.size());
  for (std::int32_t t = 0; t < std::ssize(logits); ++t) candidates_[t] = {logits[t], t};
  std::size_t keep = candidates_.size();
  if (params.top_k > 0 && static_cast<std::size_t>(params.top_k) < keep) {
    keep = static_cast<std::size_t>(params.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + keep, candidates_.end(), before);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), before);
  }
  // Softmax of logit / temperature over the kept tokens, in double.
  probs_.resize(keep);
  const double max = candidates_[0].first;
  double sum = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    probs_[i] = std::exp((candidates_[i].first - max) / params.temperature);
    sum += probs_[i];
  }
  // Top-p: the smallest prefix (most likely first) whose mass reaches top_p.
  if (params.top_p < 1.0f) {
    double mass = 0.0;
    std::size_t prefix = 0;
    while (prefix < keep && mass < params.top_p * sum) mass += probs_[prefix++];
    keep = std::max<std::size_t>(prefix, 1);
    sum = mass > 0.0 ? mass : probs_[0];
  }
  const double target = counter_uniform(seed, static_cast<std::uint64_t>(sample_index),
                                        static_cast<std::uint64_t>(position)) * sum;
  double acc = 0.0;
  for (std::size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (target < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace pagedattn::engine
