// rms_norm_rows (Highway lanes) against the formula in double, on random
// widths (vector tails included), in place, and row by row against batches
// large enough to spread over the threads.
#include "engine/rms_norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "core/row_parallel.h"

namespace pagedattn::engine {
namespace {

std::vector<double> reference(const float* row, std::int32_t width, const float* weight,
                              float eps) {
  double sum = 0.0;
  for (std::int32_t i = 0; i < width; ++i) sum += double(row[i]) * row[i];
  const double inv = 1.0 / std::sqrt(sum / width + eps);
  std::vector<double> out(static_cast<std::size_t>(width));
  for (std::int32_t i = 0; i < width; ++i) out[std::size_t(i)] = row[i] * inv * weight[i];
  return out;
}

TEST(RmsNorm, MatchesTheFormulaInDoubleOnRandomWidths) {
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (int trial = 0; trial < 60; ++trial) {
    const std::int32_t rows = 1 + trial % 5, width = 1 + (trial * 37) % 613;
    const float eps = trial % 2 ? 1e-6f : 1e-5f;
    std::vector<float> x(std::size_t(rows) * width), weight(static_cast<std::size_t>(width));
    for (float& v : x) v = normal(rng);
    for (float& v : weight) v = 1.0f + 0.1f * normal(rng);
    if (trial % 7 == 0) std::fill(x.begin(), x.begin() + width, 0.0f);  // eps alone
    std::vector<float> out(x.size()), in_place = x;
    rms_norm_rows(x.data(), rows, width, weight.data(), eps, out.data());
    rms_norm_rows(in_place.data(), rows, width, weight.data(), eps, in_place.data());
    for (std::int32_t r = 0; r < rows; ++r) {
      const std::size_t at = std::size_t(r) * width;
      const std::vector<double> want = reference(x.data() + at, width, weight.data(), eps);
      for (std::int32_t i = 0; i < width; ++i) {
        EXPECT_NEAR(out[at + i], want[std::size_t(i)], 2e-6 * (1.0 + std::abs(want[i])))
            << "width " << width << " row " << r << " index " << i;
        EXPECT_EQ(in_place[at + i], out[at + i]) << "width " << width << " in place";
      }
    }
  }
}

TEST(RmsNorm, ARowsResultDoesNotDependOnItsBatch) {
  const std::int32_t width = 576;
  const std::int32_t rows = std::int32_t(2 * core::kRowParallelElements / width) + 3;
  std::mt19937 rng(6);
  std::normal_distribution<float> normal(0.0f, 2.0f);
  std::vector<float> x(std::size_t(rows) * width), weight(static_cast<std::size_t>(width));
  for (float& v : x) v = normal(rng);
  for (float& v : weight) v = normal(rng);
  std::vector<float> batch(x.size()), one(static_cast<std::size_t>(width));
  rms_norm_rows(x.data(), rows, width, weight.data(), 1e-5f, batch.data());
  for (std::int32_t r = 0; r < rows; ++r) {
    rms_norm_rows(x.data() + std::size_t(r) * width, 1, width, weight.data(), 1e-5f, one.data());
    EXPECT_EQ(0, std::memcmp(one.data(), batch.data() + std::size_t(r) * width, width * 4))
        << "row " << r;
  }
}

}  // namespace
}  // namespace pagedattn::engine
