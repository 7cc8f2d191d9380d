#include "preemption_cost.h"

namespace pagedattn::engine {

PreemptionCosts preemption_costs(std::int64_t pages, std::int64_t bytes_per_page,
                                 std::int64_t tokens, double copy_seconds_per_byte,
                                 double forward_seconds_per_token) {
  const double bytes = double(pages) * double(bytes_per_page);
  return {2.0 * bytes * copy_seconds_per_byte, double(tokens) * forward_seconds_per_token};
}

PreemptionMode choose_preemption(const PreemptionCosts& costs, bool host_has_room) {
  return host_has_room && costs.swap_seconds < costs.recompute_seconds ? PreemptionMode::kSwap
                                                                      : PreemptionMode::kRecompute;
}

namespace {

// The first measurement replaces the prior; later ones are averaged in.
void update(double& average, bool& measured, double sample, double weight) {
  average = measured ? (1.0 - weight) * average + weight * sample : sample;
  measured = true;
}

}  // namespace

void PreemptionCostModel::observe_forward(std::int32_t tokens, double seconds) {
  if (tokens < kMinMeasuredStepTokens || !(seconds > 0.0)) return;
  update(forward_, forward_measured_, seconds / tokens, kWeight);
}

void PreemptionCostModel::observe_copy(std::int64_t bytes, double seconds) {
  if (bytes <= 0 || !(seconds > 0.0)) return;
  update(copy_, copy_measured_, seconds / double(bytes), kWeight);
}

}  // namespace pagedattn::engine
