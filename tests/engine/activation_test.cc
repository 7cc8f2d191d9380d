// gated_activation (Highway exponential and tanh) against the formulas in
// double, on random widths (vector tails included), extreme gates and NaN.
#include "engine/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace pagedattn::engine {
namespace {

double silu(double g) {
  return g / (1.0 + std::exp(-g));
}
double gelu_tanh(double x) {
  return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)));
}

TEST(GatedActivation, MatchesTheFormulasInDoubleOnRandomWidths) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (MlpActivation activation : {MlpActivation::kSilu, MlpActivation::kGeluTanh}) {
    for (int trial = 0; trial < 40; ++trial) {
      const std::int32_t rows = 1 + trial % 4, width = 1 + (trial * 7) % 67;
      std::vector<float> gate_up(std::size_t(rows) * 2 * width), act(std::size_t(rows) * width);
      for (float& x : gate_up) x = normal(rng);
      gate_up[0] = trial % 2 ? 120.0f : -120.0f;  // beyond the exponential's range
      gated_activation(gate_up.data(), rows, width, activation, act.data());
      for (std::int32_t r = 0; r < rows; ++r)
        for (std::int32_t i = 0; i < width; ++i) {
          const double g = gate_up[std::size_t(r) * 2 * width + i];
          const double u = gate_up[std::size_t(r) * 2 * width + width + i];
          const double want = (activation == MlpActivation::kSilu ? silu(g) : gelu_tanh(g)) * u;
          EXPECT_NEAR(act[std::size_t(r) * width + i], want, 2e-6 * (1.0 + std::abs(want)))
              << "activation " << int(activation) << " width " << width << " row " << r << " index "
              << i << " gate " << g;
        }
    }
  }
}

TEST(GatedActivation, NaNStaysNaN) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (MlpActivation activation : {MlpActivation::kSilu, MlpActivation::kGeluTanh}) {
    std::vector<float> gate_up = {nan, 1.0f, 1.0f, 1.0f, 2.0f, nan}, act(3);
    gated_activation(gate_up.data(), 1, 3, activation, act.data());
    EXPECT_TRUE(std::isnan(act[0]));  // NaN gate
    EXPECT_FALSE(std::isnan(act[1]));
    EXPECT_TRUE(std::isnan(act[2]));  // NaN up
  }
}

}  // namespace
}  // namespace pagedattn::engine
