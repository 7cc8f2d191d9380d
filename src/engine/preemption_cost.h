// Swap or recompute? When a running request must give up its pages, the
// scheduler either copies them to the host tier and back later (swap) or
// drops them and runs the tokens through the model again (recompute). The
// choice compares the two times, from measured rates: host copy seconds per
// byte (a bulk copy timed when the engine starts, then large swaps) and
// forward seconds per token of prefill-sized steps, each an exponential
// average.
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

// Seconds per byte of a memcpy of `bytes` between two host buffers: the
// fastest of a few runs (a run the OS interrupts says nothing about memory).
double measure_host_copy_seconds_per_byte(std::int64_t bytes);
class PreemptionCostModel {
 public:
  // Priors: 2 GB/s host copies (a cold memcpy with page-table faults) and
  // 1 ms per token, until the first measurements arrive.
  static constexpr double kPriorCopySecondsPerByte = 0.5e-9;
  static constexpr double kPriorForwardSecondsPerToken = 1e-3;
  // Steps with fewer tokens are decode-dominated (weights, not tokens, set
  // their time) and say little about the cost of recomputing a prefix.
  static constexpr std::int32_t kMinMeasuredStepTokens = 64;
  // Smaller swaps last microseconds: one interruption by the OS would
  // count for a hundred times the copy.
  static constexpr std::int64_t kMinMeasuredCopyBytes = 4 << 20;

  void observe_forward(std::int32_t tokens, double seconds);
  void observe_copy(std::int64_t bytes, double seconds);
  // A copy rate measured apart from swaps (measure_host_copy_seconds_per_byte).
  void set_copy_seconds_per_byte(double seconds_per_byte);
  double copy_seconds_per_byte() const { return copy_; }
  double forward_seconds_per_token() const { return forward_; }

 private:
  static constexpr double kWeight = 0.25;  // of each new measurement
  double copy_ = kPriorCopySecondsPerByte;
  double forward_ = kPriorForwardSecondsPerToken;
  bool copy_measured_ = false, forward_measured_ = false;
};

}  // namespace pagedattn::engine
