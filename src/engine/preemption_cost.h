// Swap or recompute? When a running request must give up its pages, the
// scheduler either copies them to the host tier and back later (swap) or
// drops them and runs the tokens through the model again (recompute). The
// choice compares the two times, from rates measured online: host copy
// seconds per byte and forward seconds per token of prefill-sized steps,
// each an exponential average seeded with a conservative prior.
#pragma once

#include <cstdint>

namespace pagedattn::engine {

enum class PreemptionMode : std::uint8_t { kRecompute, kSwap };

struct PreemptionCosts {
  double swap_seconds = 0.0;       // out and back in
  double recompute_seconds = 0.0;  // the tokens through the model again
};

// The two costs of preempting a group holding `pages` pages (`bytes_per_page`
// each) and `tokens` computed tokens.
PreemptionCosts preemption_costs(std::int64_t pages, std::int64_t bytes_per_page,
                                 std::int64_t tokens, double copy_seconds_per_byte,
                                 double forward_seconds_per_token);
// Swap when the host tier has room for the pages and swapping is cheaper.
PreemptionMode choose_preemption(const PreemptionCosts& costs, bool host_has_room);

class PreemptionCostModel {
 public:
  // Priors: 2 GB/s host copies (a cold memcpy with page-table faults) and
  // 1 ms per token, until the first measurements arrive.
  static constexpr double kPriorCopySecondsPerByte = 0.5e-9;
  static constexpr double kPriorForwardSecondsPerToken = 1e-3;
  // Steps with fewer tokens are decode-dominated (weights, not tokens, set
  // their time) and say little about the cost of recomputing a prefix.
  static constexpr std::int32_t kMinMeasuredStepTokens = 64;

  void observe_forward(std::int32_t tokens, double seconds);
  void observe_copy(std::int64_t bytes, double seconds);
  double copy_seconds_per_byte() const { return copy_; }
  double forward_seconds_per_token() const { return forward_; }

 private:
  static constexpr double kWeight = 0.25;  // of each new measurement
  double copy_ = kPriorCopySecondsPerByte;
  double forward_ = kPriorForwardSecondsPerToken;
  bool copy_measured_ = false, forward_measured_ = false;
};

}  // namespace pagedattn::engine
