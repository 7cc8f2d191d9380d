// Quantised-weight kernels against a scalar decoding of the GGUF block
// layouts (written here from the format's definition, and for the K-quants
// pagedattn's GGUF reader, dequantize_row) and a double-precision product;
// rows are independent of their batch mates bit for bit.
#include "engine/quant_kernels.h"

#include <gtest/gtest.h>
#include <hwy/targets.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "engine/dot_tiles.h"
#include "engine/gemm.h"
#include "engine/onednn_matmul.h"
#include "engine/weight_matrix.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf_types.h"
#include "support/random_floats.h"

namespace pagedattn::engine {
namespace {

constexpr WeightFormat kFormats[] = {WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1,
                                     WeightFormat::kQ5_0, WeightFormat::kQ5_1};

// Random blocks whose f16 scales are finite and moderate.
std::vector<std::uint8_t> random_weights(WeightFormat f, std::int32_t out, std::int32_t in,
                                         std::mt19937& rng) {
  std::vector<std::uint8_t> bytes(std::size_t(out * weight_row_bytes(f, in)));
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(byte(rng));
  pagedattn::test::UniformFloats scale(-0.05f, 0.05f);
  const std::int64_t block = weight_block_bytes(f);
  for (std::size_t at = 0; at < bytes.size(); at += std::size_t(block)) {
    const std::uint16_t d = float_to_f16_bits(scale(rng)), m = float_to_f16_bits(scale(rng));
    std::memcpy(&bytes[at], &d, 2);
    if (f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1) std::memcpy(&bytes[at + 2], &m, 2);
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
    case WeightFormat::kQ5_0:
    case WeightFormat::kQ5_1: {  // fifth bit of weight j: bit j of the u32 qh
      const bool q5_1 = f == WeightFormat::kQ5_1;
      const std::uint8_t* qs = block + (q5_1 ? 8 : 6);
      std::uint32_t qh;
      std::memcpy(&qh, block + (q5_1 ? 4 : 2), 4);
      const int q = (j < 16 ? qs[j] & 15 : qs[j - 16] >> 4) | int((qh >> j) & 1) << 4;
      return q5_1 ? d * q + half_at(block + 2) : d * (q - 16);
    }
    default:  // the K-quants: row_terms below
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
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
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
          LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), accumulate, false, f};
          args.activations = Activations::kF32;  // exact x; int8 x: Int8... tests below
          linear(args, scratch);
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
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
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

// GGUF F16 / BF16 matrices stay 16-bit when their rows are whole 32-weight
// blocks (the kernels' unit) and are widened to f32 otherwise; F32 always.
TEST(QuantKernels, SixteenBitMatricesStayInPlaceInWholeBlocks) {
  EXPECT_EQ(in_place_format(GgufType::kF16, 576), WeightFormat::kF16);
  EXPECT_EQ(in_place_format(GgufType::kBF16, 64), WeightFormat::kBF16);
  EXPECT_EQ(in_place_format(GgufType::kF16, 40), std::nullopt);
  EXPECT_EQ(in_place_format(GgufType::kBF16, 7), std::nullopt);
  EXPECT_EQ(in_place_format(GgufType::kF32, 64), std::nullopt);
  EXPECT_EQ(in_place_format(GgufType::kQ4_K, 256), WeightFormat::kQ4_K);
}

TEST(QuantKernels, RowBytesRefuseAPartialBlock) {
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ4_1, 64), 40);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kF32, 7), 28);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kF16, 576), 1152);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kBF16, 64), 128);
  EXPECT_THROW(weight_row_bytes(WeightFormat::kF16, 40), InvalidArgument);
  EXPECT_THROW(weight_row_bytes(WeightFormat::kQ8_0, 40), InvalidArgument);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ4_K, 512), 288);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ5_K, 256), 176);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ6_K, 768), 630);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ5_0, 64), 44);
  EXPECT_EQ(weight_row_bytes(WeightFormat::kQ5_1, 576), 432);
  EXPECT_EQ(weight_format_block(WeightFormat::kF32), 1);
  EXPECT_EQ(weight_format_block(WeightFormat::kQ4_0), 32);
  EXPECT_EQ(weight_format_block(WeightFormat::kQ6_K), 256);
  try {
    weight_row_bytes(WeightFormat::kQ4_K, 288);  // 9 blocks of 32, not whole super-blocks
    FAIL() << "a partial Q4_K super-block";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("q4_k row of 288 weights is not a whole number of "
                                         "256-weight blocks"),
              std::string::npos)
        << e.what();
  }
}

// ------------------------------------------------------------------ K-quants

constexpr WeightFormat kKFormats[] = {WeightFormat::kQ4_K, WeightFormat::kQ5_K,
                                      WeightFormat::kQ6_K};
// Every format the in-place kernels take: f32 rows too (linear()'s single
// rows of f32 weights) and the 16-bit floats.
constexpr WeightFormat kAllFormats[] = {
    WeightFormat::kF32,  WeightFormat::kF16,  WeightFormat::kBF16, WeightFormat::kQ8_0,
    WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ5_0, WeightFormat::kQ5_1,
    WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K};

GgufType gguf_type(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return GgufType::kQ8_0;
    case WeightFormat::kQ4_0:
      return GgufType::kQ4_0;
    case WeightFormat::kQ4_1:
      return GgufType::kQ4_1;
    case WeightFormat::kQ5_0:
      return GgufType::kQ5_0;
    case WeightFormat::kQ5_1:
      return GgufType::kQ5_1;
    case WeightFormat::kQ4_K:
      return GgufType::kQ4_K;
    case WeightFormat::kQ5_K:
      return GgufType::kQ5_K;
    case WeightFormat::kQ6_K:
      return GgufType::kQ6_K;
    case WeightFormat::kF16:
      return GgufType::kF16;
    case WeightFormat::kBF16:
      return GgufType::kBF16;
    case WeightFormat::kF32:
      break;
  }
  return GgufType::kF32;
}

// An f16 scale of one of three kinds: +-0, subnormal (exponent 0, random
// mantissa) or normal. `normal_max` bounds the normal ones; the kernels'
// tests use moderate scales, the dequantisation test any finite one.
std::uint16_t random_scale(std::mt19937& rng, float normal_max) {
  std::uniform_int_distribution<int> kind(0, 5), bits(0, 0xffff);
  const auto sign = static_cast<std::uint16_t>(bits(rng) & 0x8000);
  switch (kind(rng)) {
    case 0:
      return sign;
    case 1:
      return static_cast<std::uint16_t>(sign | (bits(rng) & 0x3ff));
    default: {
      pagedattn::test::UniformFloats magnitude(6.2e-5f, normal_max);  // f16 normals
      return static_cast<std::uint16_t>(sign | float_to_f16_bits(magnitude(rng)));
    }
  }
}

// `out` rows of random blocks: random quants, 6-bit scales / mins and int8
// scales (all bit patterns), f16 scales from random_scale.
std::vector<std::uint8_t> random_blocks(WeightFormat f, std::int32_t out, std::int32_t in,
                                        std::mt19937& rng, float normal_max) {
  std::vector<std::uint8_t> bytes(std::size_t(out * weight_row_bytes(f, in)));
  if (f == WeightFormat::kF32) {  // values in [-1, 1]
    pagedattn::test::UniformFloats value(-1.0f, 1.0f);
    for (std::size_t at = 0; at < bytes.size(); at += sizeof(float)) {
      const float v = value(rng);
      std::memcpy(&bytes[at], &v, sizeof v);
    }
    return bytes;
  }
  if (f == WeightFormat::kF16 || f == WeightFormat::kBF16) {  // values in [-1, 1], subnormals too
    pagedattn::test::UniformFloats value(-1.0f, 1.0f);
    std::uniform_int_distribution<int> tiny(0, 15);
    for (std::size_t at = 0; at < bytes.size(); at += 2) {
      const float v = tiny(rng) == 0 ? value(rng) * 1e-6f : value(rng);
      const std::uint16_t bits =
          f == WeightFormat::kF16 ? float_to_f16_bits(v) : float_to_bf16_bits(v);
      std::memcpy(&bytes[at], &bits, 2);
    }
    return bytes;
  }
  std::uniform_int_distribution<int> byte(0, 255);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(byte(rng));
  const std::int64_t block = weight_block_bytes(f);
  for (std::size_t at = 0; at < bytes.size(); at += std::size_t(block)) {
    const std::uint16_t d = random_scale(rng, normal_max), m = random_scale(rng, normal_max);
    switch (f) {
      case WeightFormat::kQ6_K:
        std::memcpy(&bytes[at + 208], &d, 2);
        break;
      case WeightFormat::kQ4_1:
      case WeightFormat::kQ5_1:
      case WeightFormat::kQ4_K:
      case WeightFormat::kQ5_K:
        std::memcpy(&bytes[at], &d, 2);
        std::memcpy(&bytes[at + 2], &m, 2);
        break;
      default:
        std::memcpy(&bytes[at], &d, 2);
    }
  }
  return bytes;
}

// The weights of a row by the GGUF reader (the definition the kernels must
// match), and per weight the magnitude of the terms the kernels add up:
// |d * sc * q| + |dmin * m| for Q4_K / Q5_K (the kernels subtract the mins
// from the scaled quants after summing), |d * q| + |m| for Q4_1, |w|
// otherwise. Decoded here in double from the layouts in quant_kernels.h;
// the signed values are checked against the reader's.
struct RowTerms {
  std::vector<float> w;           // dequantize_row
  std::vector<double> magnitude;  // of the terms behind each weight
  // The K-quants' weight as scaled - offset: d * sc * q (Q6_K: the weight)
  // and dmin * m (Q6_K: 0), exact.
  std::vector<double> scaled, offset;
};

RowTerms row_terms(WeightFormat f, const std::uint8_t* row, std::int32_t in) {
  RowTerms t{std::vector<float>(std::size_t(in)), std::vector<double>(std::size_t(in)),
             std::vector<double>(std::size_t(in)), std::vector<double>(std::size_t(in))};
  dequantize_row(gguf_type(f), row, t.w.data(), in);
  const std::int32_t block = weight_format_block(f);
  for (std::int32_t i = 0; i < in; ++i) {
    const std::uint8_t* b = row + i / block * weight_block_bytes(f);
    const std::int32_t j = i % block;
    double exact = 0.0, magnitude = 0.0;
    if (f == WeightFormat::kQ4_K || f == WeightFormat::kQ5_K) {
      const std::int32_t sub = j / 32, l = j % 32;
      const std::uint8_t* s = b + 4;
      const int sc = sub < 4 ? s[sub] & 63 : (s[sub + 4] & 15) | ((s[sub - 4] >> 6) << 4);
      const int m = sub < 4 ? s[sub + 4] & 63 : (s[sub + 4] >> 4) | ((s[sub] >> 6) << 4);
      const std::uint8_t* qs = b + (f == WeightFormat::kQ4_K ? 16 : 48);
      int q = (qs[32 * (sub / 2) + l] >> (4 * (sub % 2))) & 15;
      if (f == WeightFormat::kQ5_K) q |= ((b[16 + l] >> sub) & 1) << 4;
      const double scaled = double(half_at(b)) * sc * q, offset = double(half_at(b + 2)) * m;
      exact = scaled - offset;
      magnitude = std::abs(scaled) + std::abs(offset);
      t.scaled[std::size_t(i)] = scaled;
      t.offset[std::size_t(i)] = offset;
    } else if (f == WeightFormat::kQ6_K) {
      const std::int32_t h = j / 128, g = j % 128 / 32, l = j % 32;
      const int low = (b[64 * h + 32 * (g % 2) + l] >> (4 * (g / 2))) & 15;
      const int high = (b[128 + 32 * h + l] >> (2 * g)) & 3;
      exact = double(half_at(b + 208)) * static_cast<std::int8_t>(b[192 + j / 16]) *
              ((low | high << 4) - 32);
      magnitude = std::abs(exact);
      t.scaled[std::size_t(i)] = exact;
    } else if (f == WeightFormat::kF32) {
      exact = t.w[std::size_t(i)];
      magnitude = std::abs(exact);
    } else if (f == WeightFormat::kF16 || f == WeightFormat::kBF16) {  // widened exactly
      std::uint16_t bits;
      std::memcpy(&bits, row + 2 * std::size_t(i), 2);
      exact = f == WeightFormat::kF16 ? f16_bits_to_float(bits) : bf16_bits_to_float(bits);
      magnitude = std::abs(exact);
    } else {
      exact = scalar_weight(f, row, i);
      magnitude = f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1
                      ? std::abs(exact - half_at(b + 2)) + std::abs(double(half_at(b + 2)))
                      : std::abs(exact);
    }
    // The reader rounds each weight to f32 once (Q4_1: d * q, then + m).
    EXPECT_NEAR(t.w[std::size_t(i)], exact, 2 * 0x1p-24 * magnitude + 1e-45)
        << weight_format_name(f) << " weight " << i;
    t.magnitude[std::size_t(i)] = magnitude;
  }
  return t;
}

TEST(QuantKernels, KQuantRowsDequantiseBitEqualToTheGgufReaderOnEveryTarget) {
  std::mt19937 rng(21);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kKFormats)
      for (const std::int32_t in : {256, 768}) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        constexpr std::int32_t kOut = 7;
        // Any finite f16 scale (up to 65504): every product is exact in f32.
        const auto w = random_blocks(f, kOut, in, rng, 65504.0f);
        for (const auto& [first, count] : {std::pair{0, kOut}, {2, 3}, {6, 1}}) {
          std::vector<float> got(std::size_t(count) * in), want(static_cast<std::size_t>(in));
          dequantize_weight_rows(w.data(), f, in, first, count, got.data());
          for (std::int32_t r = 0; r < count; ++r) {
            dequantize_row(gguf_type(f), w.data() + (first + r) * weight_row_bytes(f, in),
                           want.data(), in);
            ASSERT_EQ(0, std::memcmp(got.data() + std::size_t(r) * in, want.data(),
                                     std::size_t(in) * sizeof(float)))
                << weight_format_name(f) << " in " << in << " row " << first + r;
          }
        }
      }
}

// quant_product of random shapes against a double product of the reader's
// weights. Bound: every kernel adds its terms (the quants times x, scaled
// per (sub-)block, and the mins times the sums of x) in f32 along paths of
// at most k operations that round, where k = in / 32 + 48 for the K-quants
// (a partial sum over at most 32 lanes-chunks, one scale multiply, one add
// per 32 weights into the accumulator, a lane reduction of at most 16
// lanes, the final subtraction and accumulation) and k = in + 8 for the
// 32-weight formats (one chain per row over the whole input on a one-lane
// target). So |y - exact| <= k u (sum of |terms| + |y0|) with u = 2^-24
// (to first order), and the reference's weights are off the exact ones by
// at most 2u of their terms; the test allows (k + 4) u (A + |y0|) where A is
// the sum over i of magnitude_i |x_i|.
// A product of `shape` as `run(args, begin, end)` computes it (random x, y
// starting at random values, a random column range, both with and without
// accumulate) against a double product of the reader's weights: outputs
// outside the range untouched, the others within k u (A + |y0|) where A is
// the sum over i of magnitude_i |x_i| (row_terms).
struct ProductShape {
  WeightFormat format;
  std::int32_t in, out, rows, ldy;
};

template <typename Run>
void expect_random_product(std::mt19937& rng, const ProductShape& shape, double k, Run run) {
  const auto [f, in, out, rows, ldy] = shape;
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  const auto w = random_blocks(f, out, in, rng, 0.05f);
  std::vector<RowTerms> terms;
  for (std::int32_t o = 0; o < out; ++o)
    terms.push_back(row_terms(f, w.data() + o * weight_row_bytes(f, in), in));
  std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
  for (auto& v : x) v = value(rng);
  for (auto& v : y0) v = value(rng);
  std::uniform_int_distribution<int> column(0, out);
  std::int32_t begin = column(rng), end = column(rng);
  if (begin > end) std::swap(begin, end);
  for (const bool accumulate : {false, true}) {
    std::vector<float> y = y0;
    run(QuantProductArgs{x.data(), rows, in, w.data(), f, y.data(), ldy, accumulate}, begin, end);
    for (std::int32_t r = 0; r < rows; ++r)
      for (std::int32_t o = 0; o < ldy; ++o) {
        const std::size_t at = std::size_t(r) * ldy + o;
        if (o < begin || o >= end) {  // untouched
          ASSERT_EQ(std::memcmp(&y[at], &y0[at], sizeof(float)), 0) << r << ", " << o;
          continue;
        }
        double want = accumulate ? y0[at] : 0.0, a = accumulate ? std::abs(y0[at]) : 0.0;
        for (std::int32_t i = 0; i < in; ++i) {
          const double xi = x[std::size_t(r) * in + i];
          want += double(terms[std::size_t(o)].w[std::size_t(i)]) * xi;
          a += terms[std::size_t(o)].magnitude[std::size_t(i)] * std::abs(xi);
        }
        ASSERT_LE(std::abs(y[at] - want), k * 0x1p-24 * a + 1e-30)
            << weight_format_name(f) << " in " << in << " out " << out << " rows " << rows
            << " columns [" << begin << ", " << end << ") accumulate " << accumulate << " r " << r
            << " o " << o << " got " << y[at] << " want " << want;
      }
  }
}

// A row length of `super_blocks` x 256 weights; for the 32-weight formats,
// trials 2 and 3 add a pair of blocks after the 16-lane kernels' whole
// quads of 128 weights.
std::int32_t random_in(WeightFormat f, int trial, std::int32_t super_blocks) {
  const bool k_quant = weight_format_block(f) == kQuantKBlock;
  const std::int32_t tail = k_quant ? 0 : trial == 2 ? 64 : trial == 3 ? 192 : 0;
  return 256 * super_blocks + tail;
}

TEST(QuantKernels, ProductsOfRandomShapesMatchADoubleReferenceOnEveryTarget) {
  std::mt19937 rng(22);
  std::uniform_int_distribution<int> super_blocks(1, 16), outs(1, 70), rows_of(1, 9);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kAllFormats)
      for (int trial = 0; trial < 4; ++trial) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t in = random_in(f, trial, super_blocks(rng)), out = outs(rng),
                           rows = rows_of(rng);
        const double k = (weight_format_block(f) == kQuantKBlock ? in / 32.0 + 48 : in + 8) + 4;
        expect_random_product(rng, {f, in, out, rows, out + (trial % 2 == 0 ? 0 : 5)}, k,
                              [](const QuantProductArgs& args, std::int32_t begin,
                                 std::int32_t end) { quant_product(args, begin, end); });
        if (HasFatalFailure()) return;
      }
}

// A row's result is the same bits whatever rows are around it, how many,
// and which column range the call covers. The 32-weight formats also run
// on an odd number of blocks (288 weights), which the paired 8-lane kernels
// leave to the one-block ones, and on 576 (SmolLM2's rows: whole quads of
// 4 blocks, then a pair).
TEST(QuantKernels, RowsDoNotDependOnTheirBatchOrColumnRangeOnEveryTarget) {
  std::mt19937 rng(23);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kAllFormats)
      for (const std::int32_t in : {512, 288, 576}) {
        if (in % weight_format_block(f) != 0) continue;
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        SCOPED_TRACE(in);
        const std::int32_t out = 37, rows = 11;
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out);
        for (auto& v : x) v = value(rng);
        quant_product({x.data(), rows, in, w.data(), f, all.data(), out, false}, 0, out);
        for (std::int32_t r = 0; r < rows; ++r)
          for (const auto& [begin, end] : {std::pair{0, out}, {5, 6}, {3, 30}, {36, 37}}) {
            std::vector<float> alone(std::size_t(out), -7.0f);
            quant_product(
                {x.data() + std::size_t(r) * in, 1, in, w.data(), f, alone.data(), out, false},
                begin, end);
            ASSERT_EQ(0,
                      std::memcmp(alone.data() + begin, all.data() + std::size_t(r) * out + begin,
                                  std::size_t(end - begin) * sizeof(float)))
                << weight_format_name(f) << " row " << r << " columns [" << begin << ", " << end
                << ")";
          }
        // Rows 3..9 as a batch of 7 (one tile of 4, three single rows).
        std::vector<float> part(std::size_t(7) * out);
        quant_product({x.data() + std::size_t(3) * in, 7, in, w.data(), f, part.data(), out, false},
                      0, out);
        ASSERT_EQ(0, std::memcmp(part.data(), all.data() + std::size_t(3) * out,
                                 part.size() * sizeof(float)))
            << weight_format_name(f);
      }
}

// linear() with K-quant weights: the in-place kernels (few rows, and every
// batch in deterministic mode) and the blocked path (dequantised column
// blocks through BLAS), into a column range of a wider output (ldy).
TEST(QuantKernels, LinearWithKQuantsMatchesADoubleReferenceAndHonoursLdy) {
  std::mt19937 rng(24);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  for (const WeightFormat f : kKFormats)
    for (const std::int32_t rows : {1, 5, 9, 37})
      for (const bool deterministic : {false, true}) {
        const std::int32_t in = 768, out = 261, ldy = out + 11;
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
        for (auto& v : x) v = value(rng);
        for (auto& v : y0) v = value(rng);
        for (const bool accumulate : {false, true}) {
          std::vector<float> y = y0;
          LinearScratch scratch;
          LinearArgs args{x.data(),   rows,          in, w.data(), out, y.data(),
                          accumulate, deterministic, f};
          args.ldy = ldy;
          args.activations = Activations::kF32;
          linear(args, scratch);
          for (std::int32_t o = 0; o < out; ++o) {
            const RowTerms t = row_terms(f, w.data() + o * weight_row_bytes(f, in), in);
            for (std::int32_t r = 0; r < rows; ++r) {
              const std::size_t at = std::size_t(r) * ldy + o;
              double want = accumulate ? y0[at] : 0.0, a = accumulate ? std::abs(y0[at]) : 0.0;
              for (std::int32_t i = 0; i < in; ++i) {
                const double xi = x[std::size_t(r) * in + i];
                want += double(t.w[std::size_t(i)]) * xi;
                a += t.magnitude[std::size_t(i)] * std::abs(xi);
              }
              // As above; BLAS (rows > 8, not deterministic) sums the
              // reader's f32 weights in an order of its own: allow in u.
              ASSERT_LE(std::abs(y[at] - want), (in + 8) * 0x1p-24 * a)
                  << weight_format_name(f) << " rows " << rows << " r " << r << " o " << o;
            }
          }
          for (std::int32_t r = 0; r < rows; ++r)
            for (std::int32_t o = out; o < ldy; ++o)
              ASSERT_EQ(y[std::size_t(r) * ldy + o], y0[std::size_t(r) * ldy + o]);
        }
      }
}

// dot_tiles (linear()'s batches of 9-64 rows) against a double product of
// the reader's weights (its dequantisation is bit-equal to the reader's,
// checked above). Bound: each output is one f32 chain per lane over at most
// `in` multiply-adds, a lane tree of at most 4 levels and the accumulation,
// so |y - exact| <= (in + 6) u (sum |w x| + |y0|) to first order; the test
// allows (in + 8) u over the row terms' magnitudes (>= |w|). Row counts cover every tile height and
// its leftovers and two passes, column ranges start and end inside the 4- and 8-column tiles and
// 8-column groups, and the K-quants' rows of more than 768 inputs go in spans.
TEST(DotTiles, RandomShapesMatchADoubleReferenceOnEveryTarget) {
  std::mt19937 rng(31);
  std::uniform_int_distribution<int> super_blocks(1, 6), outs(1, 45), rows_of(1, 13);
  TargetReset reset;
  core::CacheLineVector<float> scratch;
  const auto run = [&](const QuantProductArgs& a, std::int32_t begin, std::int32_t end) {
    dot_tiles({a.x, a.rows, a.in, a.w, a.format, a.y, a.ldy, a.accumulate}, begin, end, scratch);
  };
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kAllFormats)
      for (int trial = 0; trial < 4; ++trial) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t in = weight_format_block(f) == kQuantKBlock
                                    ? 256 * super_blocks(rng)
                                    : 32 * (2 * super_blocks(rng) + trial % 2);
        // Trial 3: more rows than one pass over the weights (kDotTileRows).
        const std::int32_t out = outs(rng), rows = trial == 3 ? kDotTileRows + 6 : rows_of(rng);
        expect_random_product(rng, {f, in, out, rows, out + (trial % 2 == 0 ? 0 : 3)}, in + 8.0,
                              run);
        if (HasFatalFailure()) return;
      }
}

// A row's result is the same bits whatever rows are around it, how many,
// and where the column range starts (a column's place in its tile and
// group moves with the range's start). 1,280 inputs: the AVX-512 tiles of 8
// columns take them in two spans (768 + 512), 512 in one. Batches of at
// most kRegisterRows rows decode the weights in registers, larger ones in
// groups through L1: every format's decoder gives the group's bits.
TEST(DotTiles, RowsDoNotDependOnTheirBatchOrColumnRangeOnEveryTarget) {
  std::mt19937 rng(32);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  TargetReset reset;
  core::CacheLineVector<float> scratch;
  static_assert(kRegisterRows >= 2 && kRegisterRows < 7);
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kAllFormats)
      for (const std::int32_t in : {512, 1280}) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t out = 37, rows = 23;
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out);
        for (auto& v : x) v = value(rng);
        dot_tiles({x.data(), rows, in, w.data(), f, all.data(), out, false}, 0, out, scratch);
        for (const auto& [first, count] :
             {std::pair{0, 1}, {5, 1}, {2, 2}, {4, kRegisterRows}, {3, 7}, {1, 22}})
          for (const auto& [begin, end] : {std::pair{0, out}, {5, 6}, {3, 30}, {36, 37}}) {
            std::vector<float> part(std::size_t(count) * out, -7.0f);
            dot_tiles({x.data() + std::size_t(first) * in, count, in, w.data(), f, part.data(), out,
                       false},
                      begin, end, scratch);
            for (std::int32_t r = 0; r < count; ++r)
              ASSERT_EQ(0, std::memcmp(part.data() + std::size_t(r) * out + begin,
                                       all.data() + std::size_t(first + r) * out + begin,
                                       std::size_t(end - begin) * sizeof(float)))
                  << weight_format_name(f) << " in " << in << " row " << first + r
                  << " of a batch of " << count << " columns [" << begin << ", " << end << ")";
          }
      }
}

// The weights of random_blocks as f32 values, [out][in].
std::vector<float> weight_values(const std::vector<std::uint8_t>& w, WeightFormat f,
                                 std::int32_t out, std::int32_t in) {
  std::vector<float> values(std::size_t(out) * in);
  if (f == WeightFormat::kF32)
    std::memcpy(values.data(), w.data(), w.size());
  else
    dequantize_weight_rows(w.data(), f, in, 0, out, values.data());
  return values;
}

// Row r of x against weight row o, both rounded to bf16 (nearest even), in
// double; *magnitude = the sum of the terms' |values|.
double bf16_product(const std::vector<float>& x, const std::vector<float>& w, std::int32_t in,
                    std::int32_t r, std::int32_t o, double* magnitude) {
  const auto bf16 = [](float v) { return double(bf16_bits_to_float(float_to_bf16_bits(v))); };
  double sum = 0.0;
  *magnitude = 0.0;
  for (std::int32_t i = 0; i < in; ++i) {
    const double term = bf16(w[std::size_t(o) * in + i]) * bf16(x[std::size_t(r) * in + i]);
    sum += term;
    *magnitude += std::abs(term);
  }
  return sum;
}

// y [rows][out] against the double product of x and wf rounded to bf16,
// within (in + 8) u sum |w x| (the first element past it fails, named by
// `what`); whether y differs anywhere from `other`.
bool within_bf16_bound(const std::vector<float>& x, const std::vector<float>& wf, std::int32_t in,
                       std::int32_t rows, std::int32_t out, const std::vector<float>& y,
                       const std::vector<float>& other, const std::string& what) {
  bool differs = false;
  for (std::int32_t r = 0; r < rows; ++r)
    for (std::int32_t o = 0; o < out; ++o) {
      double a = 0.0;
      const double want = bf16_product(x, wf, in, r, o, &a);
      const std::size_t at = std::size_t(r) * out + o;
      if (!(std::abs(y[at] - want) <= (in + 8) * 0x1p-24 * a + 1e-30)) {
        ADD_FAILURE() << what << " r " << r << " o " << o << " got " << y[at] << " want " << want;
        return differs;
      }
      differs = differs || y[at] != other[at];
    }
  return differs;
}

// The bf16 path (where this CPU has AVX512-BF16) against a double product
// of x and the dequantised weights rounded to bf16 the same way (nearest
// even): bf16 products are exact in f32, so only the f32 sums round, as on
// the f32 path (same bound). Batches of more than kDotTileRows rows go in
// passes; a row's bits do not depend on its batch or pass. The f32 path
// gives other results on the same inputs (the rounding happened).
TEST(DotTiles, Bf16MatchesADoubleReferenceOfTheRoundedInputs) {
  if (!dot_tiles_bf16_available()) GTEST_SKIP() << "no AVX512-BF16 on this CPU or target";
  std::mt19937 rng(33);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  for (const WeightFormat f : kAllFormats)
    for (const auto& [in, out, rows] :
         {std::tuple{256, 13, 1}, {512, 37, 9}, {768, 21, 70}, {256, 8, 131}}) {
      const auto w = random_blocks(f, out, in, rng, 0.05f);
      const std::vector<float> wf = weight_values(w, f, out, in);
      std::vector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out),
          f32(std::size_t(rows) * out);
      for (auto& v : x) v = value(rng);
      DotTilesArgs args{x.data(), rows, in, w.data(), f, y.data(), out, false, true};
      dot_tiles(args, 0, out, scratch);
      args.y = f32.data();
      args.bf16 = false;
      dot_tiles(args, 0, out, scratch);
      const std::string what = std::string(weight_format_name(f)) + " in " + std::to_string(in) +
                               " rows " + std::to_string(rows);
      EXPECT_TRUE(within_bf16_bound(x, wf, in, rows, out, y, f32, what))
          << what << ": bf16 gave the f32 path's bits";
      const std::int32_t last = rows - 1;  // alone, in a batch of one
      std::vector<float> alone(static_cast<std::size_t>(out));
      dot_tiles(
          {x.data() + std::size_t(last) * in, 1, in, w.data(), f, alone.data(), out, false, true},
          3, out, scratch);
      ASSERT_EQ(0, std::memcmp(alone.data() + 3, y.data() + std::size_t(last) * out + 3,
                               std::size_t(out - 3) * sizeof(float)))
          << weight_format_name(f) << " rows " << rows;
    }
}

// linear() sends the batches the in-place kernels do not take (quantised:
// not quant_batch_in_place: more than 1 row (F16 / BF16: more than 2); f32: more than
// kF32DirectRows) to dot_tiles: quantised weights on f32 up to kDotTileRows
// rows, f32 weights up to kF32TileRows, and any weights on bf16 from
// kBf16MinRows rows when asked
// (bf16_batches or the scope); deterministic mode never takes bf16. The
// in-place batches give quant_product's bits, bf16 asked or not.
TEST(DotTiles, LinearRoutesBatchesToTheTiles) {
  set_onednn_products(false);  // bf16 batches on oneDNN: the next test
  set_bf16_routes(fixed_bf16_routes());
  std::mt19937 rng(34);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  const std::int32_t in = 512, out = 40;
  core::CacheLineVector<float> scratch;
  LinearScratch ls;
  for (const WeightFormat f : {WeightFormat::kQ4_K, WeightFormat::kF16, WeightFormat::kF32})
    for (const std::int32_t rows : {1, 2, 3, 4, 5, 8, 9, 32, 33, 64, 100})
      for (const bool bf16 : {false, true}) {
        SCOPED_TRACE(std::string(weight_format_name(f)) + ", " + std::to_string(rows) + " rows");
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<float> x(std::size_t(rows) * in), tiles(std::size_t(rows) * out),
            y(std::size_t(rows) * out), scoped(std::size_t(rows) * out);
        for (auto& v : x) v = value(rng);
        const bool quantised = f != WeightFormat::kF32;
        const bool in_place = quantised ? quant_batch_in_place(rows, f) : rows <= kF32DirectRows;
        if (in_place && quantised) {  // bf16 or not: the in-place kernels' bits
          LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), false, false, f};
          args.bf16_batches = bf16;
          linear(args, ls);
          quant_product({x.data(), rows, in, w.data(), f, tiles.data(), out, false}, 0, out);
          EXPECT_EQ(0, std::memcmp(y.data(), tiles.data(), y.size() * sizeof(float)));
        }
        const bool on_bf16 = bf16 && rows >= kBf16MinRows && dot_tiles_bf16_available();
        const bool tiled =
            !in_place && (on_bf16 || rows <= (quantised ? kDotTileRows : kF32TileRows));
        if (!tiled) continue;
        dot_tiles({x.data(), rows, in, w.data(), f, tiles.data(), out, false, on_bf16}, 0, out,
                  scratch);
        LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), false, false, f};
        args.bf16_batches = bf16;
        linear(args, ls);
        EXPECT_EQ(0, std::memcmp(y.data(), tiles.data(), y.size() * sizeof(float)))
            << rows << " rows, bf16 " << bf16;
        {
          const ScopedActivations scope(Activations::kDefault, bf16);
          args.bf16_batches = false;
          args.y = scoped.data();
          linear(args, ls);
        }
        EXPECT_EQ(0, std::memcmp(scoped.data(), tiles.data(), y.size() * sizeof(float)))
            << rows << " rows, bf16 " << bf16 << " from the scope";
        if (!has_int8_products(f) && !bf16) {  // int8 activations leave float weights alone
          const ScopedActivations scope(Activations::kInt8, false);
          linear(args, ls);
          EXPECT_EQ(0, std::memcmp(scoped.data(), tiles.data(), y.size() * sizeof(float)))
              << rows << " rows with int8 activations";
        }
        if (on_bf16) {  // deterministic mode keeps f32 (its own blocks)
          args.deterministic = true;
          linear(args, ls);
          EXPECT_NE(0, std::memcmp(scoped.data(), tiles.data(), y.size() * sizeof(float)));
        }
      }
  set_onednn_products(true);
}

// Where oneDNN has bf16 kernels, linear()'s bf16 batches of at least
// kOneDnnBf16MinRows rows run its matmul (BF16 weights in place, others
// dequantised and rounded per block) on 1-3 threads: against a double
// product of the same bf16 roundings, the bound of the tiles above (only the
// f32 sums round, in another order), columns past out untouched, and not
// the tiles' bits (the route is taken); one row fewer gives the tiles' bits.
TEST(DotTiles, Bf16BatchesOnOneDnnMatchADoubleReferenceOfTheRoundedInputs) {
  if (!dot_tiles_bf16_available() || !onednn_bf16_products())
    GTEST_SKIP() << "no AVX512-BF16 here, or no oneDNN in this build";
  set_bf16_routes(fixed_bf16_routes());
  std::mt19937 rng(35);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  LinearScratch ls;
  const int saved = omp_get_max_threads();
  std::int32_t trial = 0;
  for (const WeightFormat f : kAllFormats)
    for (const auto& [in, out, rows] : {std::tuple{512, 37, kOneDnnBf16MinRows},
                                        {768, 21, kOneDnnBf16MinRows + 70},
                                        {256, 100, kOneDnnBf16MinRows + 1},
                                        {1024, 40, kOneDnnBf16MinRows + 9}}) {
      const int threads = 1 + trial % 3;
      const bool accumulate = trial % 2 == 1;
      const std::int32_t ldy = out + 5 * (trial % 2);
      ++trial;
      const auto w = random_blocks(f, out, in, rng, 0.05f);
      const std::vector<float> wf = weight_values(w, f, out, in);
      std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
      for (auto& v : x) v = value(rng);
      for (auto& v : y0) v = value(rng);
      std::vector<float> y = y0, tiles = y0;
      LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), accumulate, false, f};
      args.ldy = ldy;
      args.bf16_batches = true;
      omp_set_num_threads(threads);
      linear(args, ls);
      dot_tiles({x.data(), rows, in, w.data(), f, tiles.data(), ldy, accumulate, true}, 0, out,
                scratch);
      bool differs = false;
      for (std::int32_t r = 0; r < rows; ++r)
        for (std::int32_t o = 0; o < ldy; ++o) {
          const std::size_t at = std::size_t(r) * ldy + o;
          if (o >= out) {
            ASSERT_EQ(y[at], y0[at]) << "column " << o << " is past out";
            continue;
          }
          double a = 0.0;
          const double start = accumulate ? y0[at] : 0.0;
          const double want = start + bf16_product(x, wf, in, r, o, &a);
          a += std::abs(start);
          ASSERT_LE(std::abs(y[at] - want), (in + 8) * 0x1p-24 * a + 1e-30)
              << weight_format_name(f) << " in " << in << " rows " << rows << " threads " << threads
              << " r " << r << " o " << o;
          differs = differs || y[at] != tiles[at];
        }
      // On AMX both run tdpbf16ps over the inputs in order: the same bits may come.
      EXPECT_TRUE(differs || dot_tiles_amx_bf16())
          << weight_format_name(f) << ": the tiles' bits, not oneDNN's";
      args.rows = kOneDnnBf16MinRows - 1;
      args.y = y.data();
      y = y0;
      tiles = y0;
      linear(args, ls);
      dot_tiles({x.data(), args.rows, in, w.data(), f, tiles.data(), ldy, accumulate, true}, 0, out,
                scratch);
      EXPECT_EQ(0, std::memcmp(y.data(), tiles.data(), y.size() * sizeof(float)))
          << weight_format_name(f) << ": " << args.rows << " rows left the tiles";
    }
  omp_set_num_threads(saved);
}

// Where a timing sends small batches to oneDNN's bf16 matmul (AMX CPUs),
// 9-64 rows there stay within the tiles' bound of a double product of the
// same roundings, with bits of their own (except on AMX, where the tiles
// sum the same tdpbf16ps products in the same order).
TEST(DotTiles, SmallBf16BatchesOnOneDnnMatchADoubleReferenceOfTheRoundedInputs) {
  if (!dot_tiles_bf16_available() || !onednn_bf16_products())
    GTEST_SKIP() << "no AVX512-BF16 here, or no oneDNN in this build";
  const Bf16Routes saved = bf16_routes();
  set_bf16_routes(
      {{Bf16Route::kOneDnn, Bf16Route::kOneDnn, Bf16Route::kOneDnn, Bf16Route::kOneDnn}});
  std::mt19937 rng(37);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  LinearScratch ls;
  for (const WeightFormat f : {WeightFormat::kQ4_K, WeightFormat::kQ8_0, WeightFormat::kF32})
    for (const std::int32_t rows : {9, 16, 40, 64}) {
      const std::int32_t in = 512, out = 29;
      const auto w = random_blocks(f, out, in, rng, 0.05f);
      const std::vector<float> wf = weight_values(w, f, out, in);
      std::vector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out), tiles(y.size());
      for (auto& v : x) v = value(rng);
      LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), false, false, f};
      args.activations = Activations::kF32;
      args.bf16_batches = true;
      linear(args, ls);
      dot_tiles({x.data(), rows, in, w.data(), f, tiles.data(), out, false, true}, 0, out, scratch);
      const std::string what = std::string(weight_format_name(f)) + " rows " + std::to_string(rows);
      EXPECT_TRUE(within_bf16_bound(x, wf, in, rows, out, y, tiles, what) ||
                  dot_tiles_amx_bf16())  // both on tdpbf16ps in input order there
          << what << ": the tiles' bits";
    }
  set_bf16_routes(saved);
}

// A batch that may take bf16 products goes down the route bf16_routes()
// names for its rows (route[i] from kBf16RouteRows[i] rows on, route[0]
// below): bitwise what linear_on_bf16_route gives on that route, f32's bits
// (bf16 not asked) where the route is f32; deterministic mode, bf16 not
// asked and batches under kBf16MinRows stay f32 whatever the routes.
TEST(DotTiles, LinearTakesTheBf16RouteSetForTheRows) {
  if (!dot_tiles_bf16_available()) GTEST_SKIP() << "no AVX512-BF16 here";
  std::mt19937 rng(36);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  LinearScratch ls;
  const Bf16Routes saved = bf16_routes();
  using R = Bf16Route;
  const Bf16Routes routes{{R::kOneDnn, R::kF32, R::kTiles, R::kOneDnn}};
  set_bf16_routes(routes);
  EXPECT_EQ(bf16_route(9), R::kOneDnn);
  EXPECT_EQ(bf16_route(63), R::kOneDnn);
  EXPECT_EQ(bf16_route(64), R::kF32);
  EXPECT_EQ(bf16_route(300), R::kTiles);
  EXPECT_EQ(bf16_route(4096), R::kOneDnn);
  const std::int32_t in = 256, out = 24;
  for (const WeightFormat f : {WeightFormat::kQ8_0, WeightFormat::kF32})
    for (const std::int32_t rows : {8, 9, 40, 64, 100, 256, 520}) {
      SCOPED_TRACE(std::string(weight_format_name(f)) + ", " + std::to_string(rows) + " rows");
      const auto w = random_blocks(f, out, in, rng, 0.05f);
      std::vector<float> x(std::size_t(rows) * in);
      for (auto& v : x) v = value(rng);
      std::vector<float> y(std::size_t(rows) * out), want(y.size());
      LinearArgs a{x.data(), rows, in, w.data(), out, y.data(), false, false, f};
      a.activations = Activations::kF32;
      a.bf16_batches = true;
      linear(a, ls);
      const R route = rows >= kBf16MinRows ? bf16_route(rows) : R::kF32;
      LinearArgs ref = a;
      ref.y = want.data();
      ref.bf16_batches = route != R::kF32;
      linear_on_bf16_route(ref, ls, route);
      EXPECT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)))
          << bf16_route_name(route);
      if (route == R::kTiles) {  // the tiles' own bits, not f32's
        a.bf16_batches = false;
        linear(a, ls);
        EXPECT_NE(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
      }
    }
  set_bf16_routes(saved);
}

TEST(DotTiles, RefusesAnInputThatIsNotWholeBlocks) {
  std::vector<float> x(40), w(40), y(1);
  core::CacheLineVector<float> scratch;
  for (const std::int32_t in : {0, 40, -32})
    EXPECT_THROW(dot_tiles({x.data(), 1, in, w.data(), WeightFormat::kF32, y.data(), 1, false}, 0,
                           1, scratch),
                 InvalidArgument)
        << in;
}

// Targets on which the opt-in int8-activation kernels run (x86 AVX2 and up);
// elsewhere int8_x runs the f32 kernels.
bool int8_kernels(std::int64_t target) {
  return HWY_ARCH_X86 && target <= HWY_AVX2;
}

TEST(QuantKernels, Int8ActivationsRoundPer32ValuesLikeLlamaCpp) {
  std::vector<float> x(64, 0.0f);
  for (int i = 0; i < 32; ++i) x[std::size_t(i)] = (i - 16) * 0.25f;  // max |x| = 4
  std::vector<std::int8_t> q(64);
  float scales[2];
  quantize_activations_q8(x.data(), 64, q.data(), scales);
  EXPECT_EQ(scales[0], 4.0f / 127.0f);
  EXPECT_EQ(scales[1], 0.0f);  // all zero: scale 0, quants 0
  EXPECT_EQ(q[0], -127);
  EXPECT_EQ(q[16], 0);
  EXPECT_EQ(q[17], static_cast<std::int8_t>(std::nearbyint(0.25f / (4.0f / 127.0f))));
  EXPECT_EQ(q[40], 0);
  // Random rows, every target: the bytes and scales of the definition.
  std::mt19937 rng(28);
  pagedattn::test::UniformFloats value(-3.0f, 3.0f);
  std::vector<float> row(512);
  for (auto& v : row) v = value(rng);
  row[37] = 0.0f;
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(hwy::TargetName(target));
    std::vector<std::int8_t> got(row.size());
    std::vector<float> got_scales(row.size() / 32);
    quantize_activations_q8(row.data(), 512, got.data(), got_scales.data());
    for (std::size_t k = 0; k < row.size() / 32; ++k) {
      float amax = 0.0f;
      for (std::size_t i = 32 * k; i < 32 * k + 32; ++i) amax = std::max(amax, std::abs(row[i]));
      const float scale = amax / 127.0f, inverse = 1.0f / scale;
      ASSERT_EQ(got_scales[k], scale);
      for (std::size_t i = 32 * k; i < 32 * k + 32; ++i)
        ASSERT_EQ(got[i], static_cast<std::int8_t>(std::nearbyint(row[i] * inverse))) << i;
    }
  }
}

// The int8 path against a double product of the reader's weights and x
// rounded as quantize_activations_q8 rounds it (the Q4_K / Q5_K mins times
// exact x). Its integer sums are exact and convert exactly (|sum| < 2^24);
// each sub-block's sum is scaled once (d * sc * dx: one rounding) and added
// to one of two accumulators per row (in / 64 adds each), then 8 lanes are
// summed: k = in / 64 + 16 covers every path, and the mins as in the f32
// test. Bound: k u (sum |d sc q x8 dx| + sum |dmin m x| + |y0|).
TEST(QuantKernels, Int8ActivationProductsMatchADoubleReferenceOnEveryTarget) {
  std::mt19937 rng(26);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  std::uniform_int_distribution<int> super_blocks(1, 8), outs(1, 40), rows_of(1, 9);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kKFormats)
      for (int trial = 0; trial < 4; ++trial) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t in = random_in(f, trial, super_blocks(rng)), out = outs(rng),
                           rows = rows_of(rng);
        const std::int32_t ldy = out + trial;
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<RowTerms> terms;
        for (std::int32_t o = 0; o < out; ++o)
          terms.push_back(row_terms(f, w.data() + o * weight_row_bytes(f, in), in));
        std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
        for (auto& v : x) v = value(rng) * (trial == 3 ? 1e-3f : 1.0f);
        for (auto& v : y0) v = value(rng);
        std::vector<double> rounded(x.size());  // x8 * dx
        for (std::int32_t r = 0; r < rows; ++r) {
          std::vector<std::int8_t> q(static_cast<std::size_t>(in));
          std::vector<float> dx(std::size_t(in / 32));
          quantize_activations_q8(x.data() + std::size_t(r) * in, in, q.data(), dx.data());
          for (std::int32_t i = 0; i < in; ++i)
            rounded[std::size_t(r) * in + i] = double(q[std::size_t(i)]) * dx[std::size_t(i / 32)];
        }
        const bool accumulate = trial % 2 == 1;
        std::vector<float> y = y0;
        QuantProductArgs args{x.data(), rows, in, w.data(), f, y.data(), ldy, accumulate};
        args.int8_x = true;
        quant_product(args, 0, out);
        const bool int8 = int8_kernels(target);
        for (std::int32_t r = 0; r < rows; ++r)
          for (std::int32_t o = 0; o < ldy; ++o) {
            const std::size_t at = std::size_t(r) * ldy + o;
            if (o >= out) {
              ASSERT_EQ(y[at], y0[at]);
              continue;
            }
            double want = accumulate ? y0[at] : 0.0, a = accumulate ? std::abs(y0[at]) : 0.0;
            const RowTerms& t = terms[std::size_t(o)];
            for (std::int32_t i = 0; i < in; ++i) {
              const double xi = x[std::size_t(r) * in + i];
              const double xq = int8 ? rounded[std::size_t(r) * in + i] : xi;
              want += t.scaled[std::size_t(i)] * xq - t.offset[std::size_t(i)] * xi;
              a +=
                  std::abs(t.scaled[std::size_t(i)] * xq) + std::abs(t.offset[std::size_t(i)] * xi);
            }
            const double k = int8 ? in / 64.0 + 16 : in / 32.0 + 52;
            ASSERT_LE(std::abs(y[at] - want), k * 0x1p-24 * a + 1e-30)
                << weight_format_name(f) << " in " << in << " rows " << rows << " r " << r << " o "
                << o << " got " << y[at] << " want " << want;
          }
      }
}

// The int8 path keeps the determinism contract, and its result is close to
// the f32 path's: within the rounding of x to int8 (half a step per value).
TEST(QuantKernels, Int8ActivationRowsDoNotDependOnTheirBatchAndStayNearF32) {
  std::mt19937 rng(27);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  for (const WeightFormat f : kKFormats) {
    const std::int32_t in = 1024, out = 29, rows = 11;
    const auto w = random_blocks(f, out, in, rng, 0.05f);
    std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out),
        exact(std::size_t(rows) * out);
    for (auto& v : x) v = value(rng);
    QuantProductArgs args{x.data(), rows, in, w.data(), f, all.data(), out, false};
    args.int8_x = true;
    quant_product(args, 0, out);
    quant_product({x.data(), rows, in, w.data(), f, exact.data(), out, false}, 0, out);
    for (std::int32_t r = 0; r < rows; ++r) {
      for (const auto& [begin, end] : {std::pair{0, out}, {7, 8}, {2, 20}}) {
        std::vector<float> alone(static_cast<std::size_t>(out));
        QuantProductArgs one{
            x.data() + std::size_t(r) * in, 1, in, w.data(), f, alone.data(), out, false};
        one.int8_x = true;
        quant_product(one, begin, end);
        ASSERT_EQ(0, std::memcmp(alone.data() + begin, all.data() + std::size_t(r) * out + begin,
                                 std::size_t(end - begin) * sizeof(float)))
            << weight_format_name(f) << " row " << r;
      }
      for (std::int32_t o = 0; o < out; ++o) {
        const RowTerms t = row_terms(f, w.data() + o * weight_row_bytes(f, in), in);
        double bound = 0.0;  // sum |d sc q| * (half a step of x) + f32 rounding
        for (std::int32_t i = 0; i < in; ++i) {
          float amax = 0.0f;
          for (std::int32_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
            amax = std::max(amax, std::abs(x[std::size_t(r) * in + j]));
          bound += std::abs(t.scaled[std::size_t(i)]) * (amax / 127.0 * 0.5 + 1e-6) +
                   1e-5 * t.magnitude[std::size_t(i)];
        }
        EXPECT_LE(std::abs(all[std::size_t(r) * out + o] - exact[std::size_t(r) * out + o]), bound)
            << weight_format_name(f) << " r " << r << " o " << o;
      }
    }
  }
}

TEST(QuantKernels, KQuantDeterministicRowsDoNotDependOnTheirBatch) {
  std::mt19937 rng(25);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  for (const WeightFormat f : kKFormats) {
    const std::int32_t in = 512, out = 300, rows = 19;
    const auto w = random_blocks(f, out, in, rng, 0.05f);
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

// x rounded as quantize_activations_q8 rounds it: xq[r][i] = x8 * dx.
std::vector<double> int8_rounded(const std::vector<float>& x, std::int32_t rows, std::int32_t in) {
  std::vector<double> rounded(x.size());
  std::vector<std::int8_t> q(static_cast<std::size_t>(in));
  std::vector<float> dx(std::size_t(in / 32));
  for (std::int32_t r = 0; r < rows; ++r) {
    quantize_activations_q8(x.data() + std::size_t(r) * in, in, q.data(), dx.data());
    for (std::int32_t i = 0; i < in; ++i)
      rounded[std::size_t(r) * in + i] = double(q[std::size_t(i)]) * dx[std::size_t(i / 32)];
  }
  return rounded;
}

// The 32-weight formats on int8 x against a double product of the
// block definition's weights and x rounded as quantize_activations_q8 rounds
// it (Q4_1 / Q5_1: d q times rounded x, m times exact x). Each block's
// integer sum is exact (|sum| <= 32 * 128 * 127 < 2^24, so it converts
// exactly); d * dx rounds once, the multiply-add into one of two
// accumulators per row once per block (in / 64 adds each), then the two
// accumulators and 8 lanes are summed (4 adds); the mins' m * (sum of 32 x,
// 7 adds) go to a scalar sum (in / 32 adds); y0 is added last. So
// k = in / 32 + 16 covers every path: |y - want| <= k u (sum |d q xq| +
// sum |m x| + |y0|). Other targets run the f32 kernels: the same check
// against exact x with the f32 test's k. Shapes: odd block counts (the last
// block without its pair), rows 1..64 (tiles of 4 and a tail), ldy > out,
// accumulate and column ranges.
TEST(QuantKernels, Int8ProductsOf32WeightFormatsMatchADoubleReferenceOnEveryTarget) {
  std::mt19937 rng(30);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  std::uniform_int_distribution<int> blocks_of(1, 23), outs(1, 40), rows_of(1, 64);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kFormats)
      for (int trial = 0; trial < 4; ++trial) {
        hwy::SetSupportedTargetsForTest(target);
        SCOPED_TRACE(hwy::TargetName(target));
        const std::int32_t in = 32 * blocks_of(rng), out = outs(rng), rows = rows_of(rng);
        const std::int32_t ldy = out + trial, begin = trial == 2 ? out / 3 : 0;
        const auto w = random_weights(f, out, in, rng);
        std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
        for (auto& v : x) v = value(rng) * (trial == 3 ? 1e-3f : 1.0f);
        for (auto& v : y0) v = value(rng);
        const std::vector<double> rounded = int8_rounded(x, rows, in);
        const bool accumulate = trial % 2 == 1;
        std::vector<float> y = y0;
        QuantProductArgs args{x.data(), rows, in, w.data(), f, y.data(), ldy, accumulate};
        args.int8_x = true;
        quant_product(args, begin, out);
        const bool int8 = int8_kernels(target);
        const bool with_min = f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1;
        for (std::int32_t r = 0; r < rows; ++r)
          for (std::int32_t o = 0; o < ldy; ++o) {
            const std::size_t at = std::size_t(r) * ldy + o;
            if (o < begin || o >= out) {
              ASSERT_EQ(y[at], y0[at]);
              continue;
            }
            double want = accumulate ? y0[at] : 0.0, a = accumulate ? std::abs(y0[at]) : 0.0;
            const std::uint8_t* row = w.data() + o * weight_row_bytes(f, in);
            for (std::int32_t i = 0; i < in; ++i) {
              const double xi = x[std::size_t(r) * in + i];
              const double xq = int8 ? rounded[std::size_t(r) * in + i] : xi;
              const double m = with_min ? half_at(row + i / 32 * weight_block_bytes(f) + 2) : 0.0;
              const double dq = scalar_weight(f, row, i) - m;  // d q (Q4_0 / Q5_0: d (q - o))
              want += dq * xq + m * xi;
              a += std::abs(dq * xq) + std::abs(m * xi);
            }
            const double k = in / 32.0 + 16;
            ASSERT_LE(std::abs(y[at] - want), k * 0x1p-24 * a + 1e-30)
                << weight_format_name(f) << " in " << in << " rows " << rows << " r " << r << " o "
                << o << " got " << y[at] << " want " << want;
          }
      }
}

// The 32-weight int8 kernels keep the determinism contract (a row alone, in
// a batch of up to 64, or over any column range: the same bits), and stay
// within the rounding of x to int8 of the f32 kernels: half a step dx / 2
// per value times |w|, plus f32 rounding.
TEST(QuantKernels, Int8RowsOf32WeightFormatsDoNotDependOnTheirBatchOrColumnRange) {
  std::mt19937 rng(31);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  TargetReset reset;
  for (std::int64_t target : hwy::SupportedAndGeneratedTargets())
    for (const WeightFormat f : kFormats) {
      hwy::SetSupportedTargetsForTest(target);
      SCOPED_TRACE(hwy::TargetName(target));
      const std::int32_t in = 32 * 9, out = 29, rows = 64;
      const auto w = random_weights(f, out, in, rng);
      std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out),
          exact(std::size_t(rows) * out);
      for (auto& v : x) v = value(rng);
      QuantProductArgs args{x.data(), rows, in, w.data(), f, all.data(), out, false};
      args.int8_x = true;
      quant_product(args, 0, out);
      quant_product({x.data(), rows, in, w.data(), f, exact.data(), out, false}, 0, out);
      for (std::int32_t r = 0; r < rows; ++r) {
        for (const auto& [begin, end] : {std::pair{0, out}, {7, 8}, {2, 20}})
          for (const std::int32_t batch : {1, 3}) {
            if (r + batch > rows) continue;
            std::vector<float> part(std::size_t(batch) * out);
            QuantProductArgs some{
                x.data() + std::size_t(r) * in, batch, in, w.data(), f, part.data(), out, false};
            some.int8_x = true;
            quant_product(some, begin, end);
            ASSERT_EQ(0, std::memcmp(part.data() + begin, all.data() + std::size_t(r) * out + begin,
                                     std::size_t(end - begin) * sizeof(float)))
                << weight_format_name(f) << " row " << r << " batch " << batch;
          }
        for (std::int32_t o = 0; o < out; ++o) {
          const std::uint8_t* row = w.data() + o * weight_row_bytes(f, in);
          double bound = 0.0;
          for (std::int32_t i = 0; i < in; ++i) {
            float amax = 0.0f;
            for (std::int32_t j = i / 32 * 32; j < i / 32 * 32 + 32; ++j)
              amax = std::max(amax, std::abs(x[std::size_t(r) * in + j]));
            bound += std::abs(scalar_weight(f, row, i)) * (amax / 127.0 * 0.5 * 1.0001 + 1e-5);
          }
          EXPECT_LE(std::abs(all[std::size_t(r) * out + o] - exact[std::size_t(r) * out + o]),
                    bound)
              << weight_format_name(f) << " r " << r << " o " << o;
        }
      }
    }
}

// Every format with int8 products (has_int8_products).
constexpr WeightFormat kInt8Formats[] = {
    WeightFormat::kQ8_0, WeightFormat::kQ4_0, WeightFormat::kQ4_1, WeightFormat::kQ5_0,
    WeightFormat::kQ5_1, WeightFormat::kQ4_K, WeightFormat::kQ5_K, WeightFormat::kQ6_K};

// A weight as the int8 paths split it: `quant` multiplies x rounded to
// int8, `min` the exact x (Q4_1 / Q5_1: m; Q4_K / Q5_K: -dmin m; else 0).
struct Int8Terms {
  std::vector<double> quant, min;
};

Int8Terms int8_terms(WeightFormat f, const std::uint8_t* row, std::int32_t in) {
  Int8Terms t{std::vector<double>(std::size_t(in)), std::vector<double>(std::size_t(in))};
  if (weight_format_block(f) == kQuantKBlock) {
    const RowTerms k = row_terms(f, row, in);
    t.quant = k.scaled;
    for (std::int32_t i = 0; i < in; ++i) t.min[std::size_t(i)] = -k.offset[std::size_t(i)];
    return t;
  }
  const bool with_min = f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1;
  for (std::int32_t i = 0; i < in; ++i) {
    const double m = with_min ? half_at(row + i / 32 * weight_block_bytes(f) + 2) : 0.0;
    t.quant[std::size_t(i)] = scalar_weight(f, row, i) - m;
    t.min[std::size_t(i)] = m;
  }
  return t;
}

// Row r of x times a weight row in double: the quant terms times x as
// rounded to int8, the mins times x itself; and the sum of their
// magnitudes, which the tiles' f32 rounding scales with.
struct Int8Want {
  double sum = 0.0, magnitude = 0.0;
};
Int8Want int8_want(const Int8Terms& terms, const std::vector<double>& rounded,
                   const std::vector<float>& x, std::int32_t r, std::int32_t in) {
  Int8Want want;
  for (std::int32_t i = 0; i < in; ++i) {
    const std::size_t xi = std::size_t(r) * in + i;
    const double q = terms.quant[std::size_t(i)] * rounded[xi];
    const double m = terms.min[std::size_t(i)] * x[xi];
    want.sum += q + m;
    want.magnitude += std::abs(q) + std::abs(m);
  }
  return want;
}

// The int8 tiles of every kind this CPU runs (AMX-INT8, AVX512-VNNI,
// AVX-VNNI, AVX2).
std::vector<Int8Tiles> runnable_int8_tiles() {
  std::vector<Int8Tiles> kinds;
  for (const Int8Tiles kind :
       {Int8Tiles::kAmxInt8, Int8Tiles::kAvx512Vnni, Int8Tiles::kAvxVnni, Int8Tiles::kAvx2})
    if (int8_tiles_runnable(kind)) kinds.push_back(kind);
  return kinds;
}

// The int8 tiles of each kind against a double product of the block
// definition's weights and x rounded as quantize_activations_q8 rounds it
// (the mins times exact x). Per weight row and S inputs (32; Q6_K 16) the
// integer sum is exact and converts exactly (< 2^24); times dx rounds once,
// the scale d * sc once, the multiply-add into the row's total once per S
// inputs (in / S adds in all), the mins' multiply-add once per 32 after a
// sum of 32 x (5 adds), y0 last: k = in / 16 + 16 covers it. Shapes: 2 to
// 131 rows (past a pass of 128), rows of whole 64-input vectors and of 32
// over, ldy > out, column ranges that start inside a group of 16, accumulate.
TEST(DotTiles, Int8MatchesADoubleReferenceOfTheRoundedActivations) {
  if (runnable_int8_tiles().empty()) GTEST_SKIP() << "no int8 tiles on this CPU";
  std::mt19937 rng(35);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  for (const Int8Tiles kind : runnable_int8_tiles())
    for (const WeightFormat f : kInt8Formats)
      for (const auto& [in32, out, rows, begin] : {std::tuple{96, 13, 9, 0},
                                                   {288, 37, 23, 5},
                                                   {512, 45, 70, 17},
                                                   {256, 16, 131, 3},
                                                   {160, 29, 2, 1},
                                                   {64, 40, 5, 0}}) {
        const std::int32_t in =
            weight_format_block(f) == kQuantKBlock ? 256 * (in32 / 96 + 1) : in32;
        const std::int32_t ldy = out + 3;
        const auto w = random_blocks(f, out, in, rng, 0.05f);
        std::vector<Int8Terms> terms;
        for (std::int32_t o = 0; o < out; ++o)
          terms.push_back(int8_terms(f, w.data() + o * weight_row_bytes(f, in), in));
        std::vector<float> x(std::size_t(rows) * in), y0(std::size_t(rows) * ldy);
        for (auto& v : x) v = value(rng) * (rows == 23 ? 1e-3f : 1.0f);
        for (auto& v : y0) v = value(rng);
        const std::vector<double> rounded = int8_rounded(x, rows, in);
        for (const bool accumulate : {false, true}) {
          std::vector<float> y = y0;
          DotTilesArgs args{x.data(), rows, in, w.data(), f, y.data(), ldy, accumulate};
          args.int8 = true;
          dot_tiles_int8(args, begin, out, scratch, kind);
          for (std::int32_t r = 0; r < rows; ++r)
            for (std::int32_t o = 0; o < ldy; ++o) {
              const std::size_t at = std::size_t(r) * ldy + o;
              if (o < begin || o >= out) {
                ASSERT_EQ(std::memcmp(&y[at], &y0[at], sizeof(float)), 0) << r << ", " << o;
                continue;
              }
              const Int8Want ref = int8_want(terms[std::size_t(o)], rounded, x, r, in);
              const double want = ref.sum + (accumulate ? y0[at] : 0.0);
              const double a = ref.magnitude + (accumulate ? std::abs(y0[at]) : 0.0);
              ASSERT_LE(std::abs(y[at] - want), (in / 16.0 + 16) * 0x1p-24 * a + 1e-30)
                  << int8_tiles_name(kind) << " " << weight_format_name(f) << " in " << in
                  << " rows " << rows << " r " << r << " o " << o << " accumulate " << accumulate
                  << " got " << y[at] << " want " << want;
            }
        }
      }
}

// A row's int8 tile result is the same bits alone, in any batch (across the
// passes of 128 rows too), over any column range (a column's lane in its
// group of 16 or 8 moves with the range's start) and on every kind of tile
// (AMX's, AVX512-VNNI's, AVX-VNNI's and AVX2's run the same f32 operations
// on the same exact integer sums; AMX's tiles of 16 rows end with one that
// overlaps the one before where the rows are not a multiple of 16); float
// weights ignore int8.
TEST(DotTiles, Int8RowsDoNotDependOnTheirBatchColumnRangeOrTileKind) {
  const std::vector<Int8Tiles> kinds = runnable_int8_tiles();
  if (kinds.empty()) GTEST_SKIP() << "no int8 tiles on this CPU";
  std::mt19937 rng(36);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  for (const WeightFormat f : {WeightFormat::kQ8_0, WeightFormat::kQ5_0, WeightFormat::kQ4_K,
                               WeightFormat::kQ4_1, WeightFormat::kQ6_K, WeightFormat::kF16}) {
    const std::int32_t in = 512, out = 37, rows = 140;
    const auto w = random_blocks(f, out, in, rng, 0.05f);
    std::vector<float> x(std::size_t(rows) * in), all(std::size_t(rows) * out);
    for (auto& v : x) v = value(rng);
    DotTilesArgs args{x.data(), rows, in, w.data(), f, all.data(), out, false};
    args.int8 = true;
    if (!has_int8_products(f)) {
      dot_tiles(args, 0, out, scratch);
      std::vector<float> f32(all.size());
      dot_tiles({x.data(), rows, in, w.data(), f, f32.data(), out, false}, 0, out, scratch);
      EXPECT_EQ(all, f32) << weight_format_name(f);
      continue;
    }
    dot_tiles_int8(args, 0, out, scratch, kinds.front());
    for (const Int8Tiles kind : kinds)
      for (const auto& [first, count] :
           {std::pair{0, 1}, {130, 1}, {3, 9}, {120, 20}, {97, 33}, {4, 16}})
        for (const auto& [begin, end] : {std::pair{0, out}, {5, 6}, {3, 30}, {36, 37}}) {
          std::vector<float> part(std::size_t(count) * out, -7.0f);
          DotTilesArgs some{
              x.data() + std::size_t(first) * in, count, in, w.data(), f, part.data(), out, false};
          some.int8 = true;
          dot_tiles_int8(some, begin, end, scratch, kind);
          for (std::int32_t r = 0; r < count; ++r)
            ASSERT_EQ(0, std::memcmp(part.data() + std::size_t(r) * out + begin,
                                     all.data() + std::size_t(first + r) * out + begin,
                                     std::size_t(end - begin) * sizeof(float)))
                << int8_tiles_name(kind) << " against " << int8_tiles_name(kinds.front()) << " "
                << weight_format_name(f) << " row " << first + r << " of a batch of " << count
                << " columns [" << begin << ", " << end << ")";
        }
  }
}

// Rows rounded once (quantize_int8_rows, here in two ranges as two threads
// of a team would round them) and handed to the tiles (DotTilesArgs::x_rows,
// x itself not passed) give the bits of the tiles rounding x themselves, on
// every kind, and a range of them from its first row on (x_rows_first)
// those rows' bits; linear() takes them through LinearArgs::x_int8 on the int8
// tiles, ignores them elsewhere, and refuses rows that do not cover x.
// Asking for the weight rows of the caller's next chunk
// (DotTilesArgs::next_first / next_count) only prefetches: the same bits on
// the int8 tiles of every kind and on f32 x, at a few rows and over a pass.
TEST(DotTiles, AskingForTheNextChunkLeavesTheBits) {
  std::mt19937 rng(41);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  const std::int32_t in = 512, out = 45;
  for (const WeightFormat f : kInt8Formats) {
    const auto w = random_blocks(f, out, in, rng, 0.05f);
    for (const std::int32_t rows : {3, 12, 133}) {
      std::vector<float> x(std::size_t(rows) * in);
      for (auto& v : x) v = value(rng);
      std::vector<float> plain(std::size_t(rows) * out), asked(plain.size());
      for (const bool int8 : {false, true}) {
        if (int8 && !dot_tiles_int8_available()) continue;
        DotTilesArgs args{x.data(), rows, in, w.data(), f, plain.data(), out, false};
        args.int8 = int8;
        dot_tiles(args, 5, 37, scratch);
        for (const auto& [first, count] : {std::pair{37, 8}, std::pair{0, 45}, std::pair{40, 5}}) {
          args.y = asked.data();
          args.next_first = first;
          args.next_count = count;
          dot_tiles(args, 5, 37, scratch);
          ASSERT_EQ(plain, asked) << weight_format_name(f) << " rows " << rows << " int8 " << int8
                                  << " next " << first << " + " << count;
        }
      }
    }
  }
}

TEST(DotTiles, Int8RowsRoundedOnceGiveTheSameBits) {
  const std::vector<Int8Tiles> kinds = runnable_int8_tiles();
  if (kinds.empty()) GTEST_SKIP() << "no int8 tiles on this CPU";
  std::mt19937 rng(38);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  core::CacheLineVector<float> scratch;
  for (const WeightFormat f : kInt8Formats) {
    const std::int32_t in = 512, out = 29, rows = 133;
    const auto w = random_blocks(f, out, in, rng, 0.05f);
    std::vector<float> x(std::size_t(rows) * in);
    for (auto& v : x) v = value(rng);
    Int8Rows rounded;
    rounded.resize(rows + 3, in);  // room for more rows than the product's
    quantize_int8_rows(x.data(), 0, 70, rounded);
    quantize_int8_rows(x.data(), 70, rows, rounded);
    for (const Int8Tiles kind : kinds) {
      std::vector<float> self(std::size_t(rows) * out), once(self.size());
      DotTilesArgs args{x.data(), rows, in, w.data(), f, self.data(), out, false};
      args.int8 = true;
      dot_tiles_int8(args, 3, out, scratch, kind);
      args.x = nullptr;
      args.x_rows = &rounded;
      args.y = once.data();
      dot_tiles_int8(args, 3, out, scratch, kind);
      ASSERT_EQ(self, once) << int8_tiles_name(kind) << " " << weight_format_name(f);
      // Rows [40, 90) alone, read from row 40 of the rounded rows on.
      std::vector<float> range(std::size_t(50) * out);
      args.rows = 50;
      args.x_rows_first = 40;
      args.y = range.data();
      dot_tiles_int8(args, 3, out, scratch, kind);
      for (std::int32_t r = 0; r < 50; ++r)
        for (std::int32_t c = 3; c < out; ++c)
          ASSERT_EQ(range[std::size_t(r) * out + c], self[std::size_t(40 + r) * out + c])
              << int8_tiles_name(kind) << " " << weight_format_name(f) << " row " << 40 + r;
    }
    std::vector<float> plain(std::size_t(rows) * out), handed(plain.size());
    LinearScratch linear_scratch;
    LinearArgs args{x.data(), rows, in, w.data(), out, plain.data(), false, false, f};
    for (const Activations activations : {Activations::kInt8, Activations::kF32}) {
      args.activations = activations;
      args.x_int8 = nullptr;
      args.y = plain.data();
      linear(args, linear_scratch);
      args.x_int8 = &rounded;
      args.y = handed.data();
      linear(args, linear_scratch);
      EXPECT_EQ(plain, handed) << weight_format_name(f);
    }
    EXPECT_EQ(takes_int8_tiles(rows, f, false, Activations::kInt8),
              int8_tiles_take(rows, int8_tiles()));
    EXPECT_FALSE(takes_int8_tiles(rows, f, true, Activations::kInt8));  // deterministic
    EXPECT_FALSE(takes_int8_tiles(rows, f, false, Activations::kF32));
    EXPECT_FALSE(takes_int8_tiles(1, f, false, Activations::kInt8));  // in place
    EXPECT_EQ(takes_int8_tiles(2, f, false, Activations::kInt8), f != WeightFormat::kQ8_0);
  }
  EXPECT_FALSE(takes_int8_tiles(64, WeightFormat::kF16, false, Activations::kInt8));
  // Rows that do not cover x's: refused, naming them.
  std::vector<float> x(std::size_t(8) * 64, 0.5f), y(8 * 4);
  const auto w = random_blocks(WeightFormat::kQ8_0, 4, 64, rng, 0.05f);
  LinearScratch linear_scratch;
  Int8Rows few;
  few.resize(4, 64);
  Int8Rows other;
  other.resize(8, 32);
  for (const Int8Rows* bad : {&few, &other}) {
    LinearArgs args{x.data(), 8, 64, w.data(), 4, y.data(), false, false, WeightFormat::kQ8_0};
    args.x_int8 = bad;
    try {
      linear(args, linear_scratch);
      ADD_FAILURE() << "linear took " << bad->rows << " rows of " << bad->in;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find("x_int8 holds " + std::to_string(bad->rows)),
                std::string::npos)
          << e.what();
    }
  }
}

// The largest integer products each format can form: AVX2's vpmaddubsw adds
// two u8 x s8 products into a saturating 16-bit sum, which Q8_0's quants xor
// 0x80 (up to 255) times x's 127 would pass. Weights whose quants all sit at
// their format's ends, times rows of x at +-127 with the weights' signs (so
// that each pair's products add up), must still match the double reference
// exactly up to the f32 roundings, on every kind.
TEST(DotTiles, Int8TilesKeepTheLargestProductsExact) {
  const std::vector<Int8Tiles> kinds = runnable_int8_tiles();
  if (kinds.empty()) GTEST_SKIP() << "no int8 tiles on this CPU";
  std::mt19937 rng(37);
  core::CacheLineVector<float> scratch;
  for (const WeightFormat f : kInt8Formats) {
    const std::int32_t in = weight_format_block(f) == kQuantKBlock ? 512 : 128, out = 11, rows = 6;
    auto w = random_blocks(f, out, in, rng, 0.05f);
    // Each block's quants all at one end of their range.
    std::bernoulli_distribution coin(0.5);
    const std::int64_t block = weight_block_bytes(f);
    for (std::size_t at = 0; at < w.size(); at += std::size_t(block)) {
      std::uint8_t* b = w.data() + at;
      const bool high = coin(rng);
      switch (f) {
        case WeightFormat::kQ8_0:  // int8 quants -128 or 127, runs of one sign
          for (std::int32_t i = 0; i < 32; ++i) b[2 + i] = high ? 0x7f : 0x80;
          break;
        case WeightFormat::kQ6_K:  // ql and qh: every 6-bit quant 0 or 63
          std::memset(b, high ? 0xff : 0x00, 192);
          break;
        case WeightFormat::kQ4_K:
          std::memset(b + 16, high ? 0xff : 0x00, 128);
          break;
        case WeightFormat::kQ5_K:
          std::memset(b + 16, high ? 0xff : 0x00, 160);
          break;
        default:  // the 32-weight formats: nibbles (and fifth bits) after d (and m)
          std::memset(b + 2, high ? 0xff : 0x00, std::size_t(block - 2));
          if (f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1) {
            const std::uint16_t m = float_to_f16_bits(0.01f);
            std::memcpy(b + 2, &m, 2);
          }
      }
    }
    std::vector<Int8Terms> terms;
    for (std::int32_t o = 0; o < out; ++o)
      terms.push_back(int8_terms(f, w.data() + o * weight_row_bytes(f, in), in));
    // x = +-1 with the sign of weight row r % out's quant term: every
    // product of a pair adds, and x8 = +-127.
    std::vector<float> x(std::size_t(rows) * in);
    for (std::int32_t r = 0; r < rows; ++r)
      for (std::int32_t i = 0; i < in; ++i)
        x[std::size_t(r) * in + i] =
            terms[std::size_t(r % out)].quant[std::size_t(i)] < 0 ? -1.0f : 1.0f;
    const std::vector<double> rounded = int8_rounded(x, rows, in);
    for (const Int8Tiles kind : kinds) {
      std::vector<float> y(std::size_t(rows) * out);
      DotTilesArgs args{x.data(), rows, in, w.data(), f, y.data(), out, false};
      args.int8 = true;
      dot_tiles_int8(args, 0, out, scratch, kind);
      for (std::int32_t r = 0; r < rows; ++r)
        for (std::int32_t o = 0; o < out; ++o) {
          const Int8Want want = int8_want(terms[std::size_t(o)], rounded, x, r, in);
          const float got = y[std::size_t(r) * out + o];
          ASSERT_LE(std::abs(got - want.sum), (in / 16.0 + 16) * 0x1p-24 * want.magnitude + 1e-30)
              << int8_tiles_name(kind) << " " << weight_format_name(f) << " r " << r << " o " << o
              << " got " << got << " want " << want.sum;
        }
    }
  }
}

// The dispatched kind is one this CPU runs; a kind it does not run, or
// none, is refused naming it. linear() sends the VNNI tiles every batch,
// AVX2's up to kInt8Avx2TileRows rows.
TEST(DotTiles, Int8TilesRunOnlyWhereTheCpuHasThem) {
  for (const std::int32_t rows : {3, 64, 65, 2048}) {
    EXPECT_TRUE(int8_tiles_take(rows, Int8Tiles::kAmxInt8));
    EXPECT_TRUE(int8_tiles_take(rows, Int8Tiles::kAvx512Vnni));
    EXPECT_TRUE(int8_tiles_take(rows, Int8Tiles::kAvxVnni));
    EXPECT_EQ(int8_tiles_take(rows, Int8Tiles::kAvx2), rows <= kInt8Avx2TileRows);
    EXPECT_FALSE(int8_tiles_take(rows, Int8Tiles::kNone));
  }
  EXPECT_TRUE(int8_tiles_runnable(int8_tiles())) << int8_tiles_name(int8_tiles());
  EXPECT_EQ(dot_tiles_int8_available(), int8_tiles() != Int8Tiles::kNone);
  EXPECT_TRUE(int8_tiles() != Int8Tiles::kAvx512Vnni || dispatched_features().avx512_vnni);
  EXPECT_TRUE(int8_tiles() != Int8Tiles::kAmxInt8 || dispatched_features().amx_int8);
  EXPECT_EQ(int8_tiles() == Int8Tiles::kAmxInt8,
            dispatched_features().amx_int8 && dispatched_features().avx512_vnni);
  std::vector<float> x(32, 1.0f), y(1);
  const std::vector<std::uint8_t> w(std::size_t(weight_row_bytes(WeightFormat::kQ8_0, 32)));
  DotTilesArgs args{x.data(), 1, 32, w.data(), WeightFormat::kQ8_0, y.data(), 1, false};
  args.int8 = true;
  core::CacheLineVector<float> scratch;
  for (const Int8Tiles kind : {Int8Tiles::kNone, Int8Tiles::kAvx2, Int8Tiles::kAvxVnni,
                               Int8Tiles::kAvx512Vnni, Int8Tiles::kAmxInt8}) {
    if (kind != Int8Tiles::kNone && int8_tiles_runnable(kind)) continue;
    try {
      dot_tiles_int8(args, 0, 1, scratch, kind);
      ADD_FAILURE() << "dot_tiles_int8 ran on " << int8_tiles_name(kind);
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(int8_tiles_name(kind)), std::string::npos) << e.what();
    }
  }
}

// linear() on quantised weights: with the int8 default on (or kInt8), not
// deterministic, the batches int8_in_place picks run the int8 kernels, bit
// for bit what quant_product with int8_x gives; Activations::kF32 and the
// default off give the f32 kernels' bits, deterministic mode dot_tiles' f32
// bits; the
// others run the int8 tiles where the CPU has them (from
// int8_tile_min_rows() rows: 2 but for Q8_0), bit for bit
// what dot_tiles with int8 gives, and are unchanged by the choice
// elsewhere.
TEST(QuantKernels, LinearTakesInt8ActivationsByDefaultExceptWhenExactOrDeterministic) {
  std::mt19937 rng(32);
  pagedattn::test::UniformFloats value(-1.0f, 1.0f);
  const bool was = int8_activations_default();
  set_int8_activations_default(true);
  for (const WeightFormat f :
       {WeightFormat::kQ8_0, WeightFormat::kQ5_0, WeightFormat::kQ4_K, WeightFormat::kQ6_K})
    for (const std::int32_t rows : {1, 2, 3, 4, 5, 9, 32, 33, 96}) {
      const std::int32_t in = 512, out = 300;
      const bool in_place = int8_in_place(rows, f, int8_tiles());
      const bool tiles = dot_tiles_int8_available() && int8_tiles_take(rows, int8_tiles());
      const auto w = f == WeightFormat::kQ4_K || f == WeightFormat::kQ6_K
                         ? random_blocks(f, out, in, rng, 0.05f)
                         : random_weights(f, out, in, rng);
      std::vector<float> x(std::size_t(rows) * in);
      for (auto& v : x) v = value(rng);
      const auto product = [&](bool int8) {
        std::vector<float> y(std::size_t(rows) * out);
        QuantProductArgs q{x.data(), rows, in, w.data(), f, y.data(), out, false};
        q.int8_x = int8;
        quant_product(q, 0, out);
        return y;
      };
      const auto run = [&](Activations activations, bool deterministic) {
        std::vector<float> y(std::size_t(rows) * out);
        LinearScratch scratch;
        LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), false, deterministic, f};
        args.activations = activations;
        linear(args, scratch);
        return y;
      };
      const auto int8 = product(true), exact = product(false);
      // Deterministic mode: dot_tiles on f32 x at every batch size.
      std::vector<float> deterministic(std::size_t(rows) * out);
      core::CacheLineVector<float> tile_scratch;
      dot_tiles({x.data(), rows, in, w.data(), f, deterministic.data(), out, false}, 0, out,
                tile_scratch);
      SCOPED_TRACE(std::string(weight_format_name(f)) + " rows " + std::to_string(rows));
      if (in_place) {
        EXPECT_EQ(run(Activations::kDefault, false), int8);
        EXPECT_EQ(run(Activations::kInt8, false), int8);
      } else if (tiles) {  // the int8 tiles
        std::vector<float> tiles(std::size_t(rows) * out);
        core::CacheLineVector<float> scratch;
        DotTilesArgs d{x.data(), rows, in, w.data(), f, tiles.data(), out, false};
        d.int8 = true;
        dot_tiles(d, 0, out, scratch);
        EXPECT_EQ(run(Activations::kDefault, false), tiles);
        EXPECT_EQ(run(Activations::kInt8, false), tiles);
        EXPECT_NE(run(Activations::kF32, false), tiles);
      } else {
        EXPECT_EQ(run(Activations::kDefault, false), run(Activations::kF32, false));
      }
      if (quant_batch_in_place(rows, f)) {
        EXPECT_EQ(run(Activations::kF32, false), exact);
      }
      EXPECT_EQ(run(Activations::kDefault, true), deterministic);
      EXPECT_EQ(run(Activations::kInt8, true), deterministic);
      set_int8_activations_default(false);
      if (quant_batch_in_place(rows, f)) {
        EXPECT_EQ(run(Activations::kDefault, false), exact);
      }
      // A scope (a forward pass's ForwardBatch::int8_activations) overrides
      // the process default for kDefault on its thread, nests, and ends.
      {
        const ScopedActivations scope(Activations::kInt8);
        EXPECT_EQ(default_activations(), Activations::kInt8);
        if (in_place) {
          EXPECT_EQ(run(Activations::kDefault, false), int8);
        }
        if (quant_batch_in_place(rows, f)) {  // an explicit choice wins
          EXPECT_EQ(run(Activations::kF32, false), exact);
        }
        EXPECT_EQ(run(Activations::kDefault, true), deterministic);
        {
          const ScopedActivations inner(Activations::kF32);
          EXPECT_EQ(default_activations(), Activations::kF32);
          if (quant_batch_in_place(rows, f)) {
            EXPECT_EQ(run(Activations::kDefault, false), exact);
          }
        }
        EXPECT_EQ(default_activations(), Activations::kInt8);
        {
          const ScopedActivations unset(Activations::kDefault);  // the process default: f32
          EXPECT_EQ(default_activations(), Activations::kF32);
        }
      }
      EXPECT_EQ(default_activations(), Activations::kF32);
      set_int8_activations_default(true);
      EXPECT_EQ(default_activations(), Activations::kInt8);
    }
  set_int8_activations_default(was);
}

}  // namespace
}  // namespace pagedattn::engine
