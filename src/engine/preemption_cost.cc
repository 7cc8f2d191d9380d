#include "preemption_cost.h"

#include "core/seconds_since.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

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

double measure_host_copy_seconds_per_byte(std::int64_t bytes) {
  const std::size_t n = static_cast<std::size_t>(std::max<std::int64_t>(bytes, 1));
  std::vector<unsigned char> src(n, 1), dst(n, 0);  // touched: no page faults in the timing
  double best = 0.0;
  for (int run = 0; run < 3; ++run) {
    const auto start = std::chrono::steady_clock::now();
    std::memcpy(dst.data(), src.data(), n);
    const double s = seconds_since(start);
    best = run == 0 ? s : std::min(best, s);
    src[run] = dst[n - 1 - std::size_t(run)];  // the copies are used: none is optimised away
  }
  return std::max(best, 1e-12) / double(n);
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
  if (bytes < kMinMeasuredCopyBytes || !(seconds > 0.0)) return;
  update(copy_, copy_measured_, seconds / double(bytes), kWeight);
}

void PreemptionCostModel::set_copy_seconds_per_byte(double seconds_per_byte) {
  if (!(seconds_per_byte > 0.0)) return;
  copy_ = seconds_per_byte;
  copy_measured_ = true;
}

}  // namespace pagedattn::engine
