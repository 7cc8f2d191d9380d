// Token sampling: greedy, temperature, top-k, top-p. Randomness is a pure
// function of (seed, sample index, position), so a request draws the same
// tokens whatever it is batched with and after a preemption.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::engine {

class Sampler {
 public:
  // logits [vocab]; `position` is the index the new token will have.
  std::int32_t sample(std::span<const float> logits, const SamplingParams& params,
                      std::uint64_t seed, std::int32_t sample_index, std::int64_t position);

 private:
  std::vector<std::pair<float, std::int32_t>> candidates_;  // (logit, token)
  std::vector<double> probs_;
};

}  // namespace pagedattn::engine
