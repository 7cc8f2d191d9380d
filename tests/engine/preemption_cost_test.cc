// The swap-or-recompute estimate as a pure function, and its online rates.
#include "engine/preemption_cost.h"

#include <gtest/gtest.h>

namespace pagedattn::engine {
namespace {

TEST(PreemptionCost, CostsScaleWithBytesAndTokens) {
  const PreemptionCosts c = preemption_costs(10, 1000, 160, 1e-9, 1e-4);
  EXPECT_DOUBLE_EQ(c.swap_seconds, 2 * 10 * 1000 * 1e-9);  // out and back in
  EXPECT_DOUBLE_EQ(c.recompute_seconds, 160 * 1e-4);
}

TEST(PreemptionCost, SwapsOnlyWhenCheaperAndTheHostHasRoom) {
  // Copying 64 KiB pages at 1 GB/s vs recomputing 16 tokens a page at 1 ms.
  const PreemptionCosts cheap_swap = preemption_costs(4, 64 << 10, 64, 1e-9, 1e-3);
  EXPECT_EQ(choose_preemption(cheap_swap, true), PreemptionMode::kSwap);
  EXPECT_EQ(choose_preemption(cheap_swap, false), PreemptionMode::kRecompute);
  // A fast model and slow copies: recomputing wins.
  const PreemptionCosts cheap_recompute = preemption_costs(4, 64 << 10, 64, 1e-6, 1e-6);
  EXPECT_EQ(choose_preemption(cheap_recompute, true), PreemptionMode::kRecompute);
  // A tie recomputes (no host memory spent for nothing).
  EXPECT_EQ(choose_preemption({1.0, 1.0}, true), PreemptionMode::kRecompute);
}

TEST(PreemptionCost, RatesStartAtThePriorsAndFollowMeasurements) {
  PreemptionCostModel m;
  EXPECT_EQ(m.copy_seconds_per_byte(), PreemptionCostModel::kPriorCopySecondsPerByte);
  EXPECT_EQ(m.forward_seconds_per_token(), PreemptionCostModel::kPriorForwardSecondsPerToken);
  m.observe_forward(PreemptionCostModel::kMinMeasuredStepTokens - 1, 1.0);  // decode-sized: ignored
  EXPECT_EQ(m.forward_seconds_per_token(), PreemptionCostModel::kPriorForwardSecondsPerToken);
  m.observe_forward(100, 0.01);  // the first measurement replaces the prior
  EXPECT_DOUBLE_EQ(m.forward_seconds_per_token(), 1e-4);
  m.observe_forward(100, 0.03);  // later ones are averaged in
  EXPECT_GT(m.forward_seconds_per_token(), 1e-4);
  EXPECT_LT(m.forward_seconds_per_token(), 3e-4);
  constexpr std::int64_t kBig = PreemptionCostModel::kMinMeasuredCopyBytes;
  m.observe_copy(kBig, 0.0);      // an unmeasurably fast copy says nothing
  m.observe_copy(kBig - 1, 1.0);  // a small one is mostly noise: ignored
  EXPECT_EQ(m.copy_seconds_per_byte(), PreemptionCostModel::kPriorCopySecondsPerByte);
  m.observe_copy(kBig, double(kBig) * 1e-9);
  EXPECT_DOUBLE_EQ(m.copy_seconds_per_byte(), 1e-9);
  m.set_copy_seconds_per_byte(2e-10);
  EXPECT_DOUBLE_EQ(m.copy_seconds_per_byte(), 2e-10);
  m.observe_copy(kBig, double(kBig) * 1e-9);  // averaged in after a calibration
  EXPECT_GT(m.copy_seconds_per_byte(), 2e-10);
  EXPECT_LT(m.copy_seconds_per_byte(), 1e-9);
}

TEST(PreemptionCost, HostCopyRateIsMeasured) {
  const double rate = measure_host_copy_seconds_per_byte(1 << 20);
  EXPECT_GT(rate, 0.0);
  EXPECT_LT(rate, 1e-6);  // faster than 1 MB/s on any machine this runs on
}

}  // namespace
}  // namespace pagedattn::engine
