// Quantised-weight kernels against a scalar decoding of the GGUF block
// layouts (written here from the format's definition) and a double-precision
// product; rows are independent of their batch mates bit for bit.
#include "engine/quant_kernels.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "engine/gemm.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

constexpr WeightFormat kFormats[] = {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1};

// Random blocks whose f16 scales are finite and moderate.
std::vector<std::uint8_t> random_weights(WeightFormat f, std::int32_t out, std::int32_t in,
                                         std::mt19937& rng) {
  std::vector<std::uint8_t> bytes(std::size_t(out * weight_row_bytes(f, in)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(byte(rng));
  std::uniform_real_distribution<float> scale(-0.05f, 0.05f);
  const std::int64_t block = weight_block_bytes(f);
  for (std::size_t at = 0; at < bytes.size(); at += std::size_t(block)) {
    const std::uint16_t d = float_to_f16_bits(scale(rng)), m = float_to_f16_bits(scale(rng));
    std::memcpy(&bytes[at], &d, 2);
    if (f == WeightFormat::kQ4_1) std::memcpy(&bytes[at + 2], &m, 2);
  }
  return bytes;
}

float half_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, 2);
  return f16_bits_to_float(bits);
}

// Weight i of a row, decoded in double from the block definitions.
double scalar_weight(WeightFormat f, const std::uint8_t* row, std::int32_t i) {
  const std::uint8_t* block = row + i / kQuantBlock * weight_block_bytes(f);
  const std::int32_t j = i % kQuantBlock;
  const double d = half_at(block);
  switch (f) {
    case WeightFormat::kQ8_0:
      return d * static_cast<std::int8_t>(block[2 + j]);
    case WeightFormat::kQ4_0: {
      const int q = j < 16 ? block[2 + j] & 15 : block[2 + j - 16] >> 4;
      return d * (q - 8);
    }
    case WeightFormat::kQ4_1: {
      const int q = j < 16 ? block[4 + j] & 15 : block[4 + j - 16] >> 4;
      return d * q + half_at(block + 2);
    }
    case WeightFormat::kF32:
      break;
  }
  return 0.0;
}

// Restores Highway's normal target choice when a test leaves early.
struct TargetReset {
  ~TargetReset() { hwy::SetSupportedTargetsForTest(0); }
};

TEST(QuantKernels, DequantizedRowsEqualTheBlockDefinitionOnEveryTarget) {
  std::mt19937 rng(11);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kFormats) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(hwy::TargetName(target));
      constexpr std::int32_t kOut = 5, kIn = 96;
      const auto w = random_weights(f, kOut, kIn, rng);
      std::vector<float> got(std::size_t(3) * kIn);
      dequantize_weight_rows(w.data(), f, kIn, 2, 3, got.data());
      for (std::int32_t r = 0; r < 3; ++r)
        for (std::int32_t i = 0; i < kIn; ++i) {
          const double want = scalar_weight(f, w.data() + (2 + r) * weight_row_bytes(f, kIn), i);
          // One rounding of d * q (+ m): within half an ulp of the exact value, plus the add's.
          ASSERT_NEAR(got[std::size_t(r) * kIn + i], want, std::abs(want) * 1.2e-7 + 1e-12)
              << weight_format_name(f) << " row " << r << " weight " << i;
        }
    }
}

TEST(QuantKernels, LinearMatchesADoubleReferenceDirectAndBlockedOnEveryTarget) {
  std::mt19937 rng(12);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kFormats)
      for (const std::int32_t rows : {1, 3, 9, 37}) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t in = 32 * 7, out = 301;
        const auto w = random_weights(f, out, in, rng);
        std::vector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out);
        for (auto& v : x) v = value(rng);
        for (auto& v : y) v = value(rng);
        const std::vector<float> y0 = y;
        for (const bool accumulate : {false, true}) {
          y = y0;
          LinearScratch scratch;
          linear({x.data(), rows, in, w.data(), out, y.data(), accumulate, false, f}, scratch);
          for (std::int32_t r = 0; r < rows; ++r)
            for (std::int32_t o = 0; o < out; ++o) {
              double want = accumulate ? y0[std::size_t(r) * out + o] : 0.0;
              const std::uint8_t* row = w.data() + o * weight_row_bytes(f, in);
              for (std::int32_t i = 0; i < in; ++i)
                want += scalar_weight(f, row, i) * x[std::size_t(r) * in + i];
              ASSERT_NEAR(y[std::size_t(r) * out + o], want, 2e-4)
                  << weight_format_name(f) << " rows " << rows << " r " << r << " o " << o;
            }
        }
      }
}

TEST(QuantKernels, DeterministicRowsDoNotDependOnTheirBatch) {
  std::mt19937 rng(13);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (const WeightFormat f : kFormats) {
    const std::int32_t in = 32 * 5, out = 257, rows = 11;
    const auto w = random_weights(f, out, in, rng);
    std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out);
    for (auto& v : x) v = value(rng);
    LinearScratch scratch;
    linear({x.data(), rows, in, w.data(), out, all.data(), false, true, f}, scratch);
    for (std::int32_t r = 0; r < rows; ++r) {
      std::vector<float> alone(static_cast<std::size_t>(out));
      linear({x.data() + std::size_t(r) * in, 1, in, w.data(), out, alone.data(), false, true, f},
             scratch);
      ASSERT_EQ(0,
                std::memcmp(alone.data(), all.data() + std::size_t(r) * out, out * sizeof(float)))
          << weight_format_name(f) << " row " << r;
    }
  }
}

TEST(QuantKernels, RowBytesRefuseAPartialBlock) {
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ4_1, 64), 40);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kF32, 7), 28);
  EXPECT_THROW(weight_row_bytes(WeightFormat::kQ8_0, 40), InvalidArgument);
}

}  // namespace
}  // namespace pagedattn::engine
