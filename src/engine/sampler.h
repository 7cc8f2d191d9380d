// Token sampling: greedy, temperature, top-k, top-p. Randomness is a pure
// function of (seed, sample index, position), so a request draws the same
// tokens whatever it is batched with and after a preemption.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::engine {

// How many logits of a row are NaN and how many infinite.
struct NonFiniteCount {
  std::int64_t nan = 0, inf = 0;
};
NonFiniteCount count_non_finite(std::span<const float> logits);
// "3 NaN and 0 Inf of 1024 logits", for error messages.
std::string describe_non_finite(std::span<const float> logits);

class Sampler {
 public:
  // logits [vocab]; `position` is the index the new token will have.
  // nullopt when a logit is NaN or infinite: no token is meaningful then
  // (found on the pass that takes the row's maximum, which every mode makes).
  std::optional<std::int32_t> sample(std::span<const float> logits, const SamplingParams& params,
                                     std::uint64_t seed, std::int32_t sample_index,
                                     std::int64_t position);

 private:
  std::vector<std::pair<float, std::int32_t>> candidates_;  // (logit, token)
  std::vector<double> probs_;
};

}  // namespace pagedattn::engine
