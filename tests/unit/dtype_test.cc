// Scalar dtype conversions (round to nearest even, NaN/inf/denormals), every
// f16 and bf16 bit pattern, dtype names and sizes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>

#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

namespace pagedattn {
namespace {

float f32(std::uint32_t bits) {
  return std::bit_cast<float>(bits);
}
std::uint32_t bits_of(float f) {
  return std::bit_cast<std::uint32_t>(f);
}
bool is_f16_nan(std::uint16_t h) {
  return (h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0;
}
bool is_bf16_nan(std::uint16_t b) {
  return (b & 0x7f80u) == 0x7f80u && (b & 0x007fu) != 0;
}

// --- bf16 ---------------------------------------------------------------------------

TEST(BF16, ExactValues) {
  EXPECT_EQ(float_to_bf16_bits(1.0f), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(-2.0f), 0xc000);
  EXPECT_EQ(float_to_bf16_bits(0.0f), 0x0000);
  EXPECT_EQ(float_to_bf16_bits(-0.0f), 0x8000);
  EXPECT_EQ(bf16_bits_to_float(0x3f80), 1.0f);
  EXPECT_EQ(bf16_bits_to_float(0x4049), 3.140625f);
  EXPECT_EQ(bits_of(bf16_bits_to_float(0x8000)), 0x80000000u);
}

TEST(BF16, RoundsToNearestEven) {
  // 1 + 2^-8 is halfway between 1 (even mantissa) and 1 + 2^-7: ties to 1.
  EXPECT_EQ(float_to_bf16_bits(f32(0x3f808000)), 0x3f80);
  // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 (odd) and 1 + 2^-6 (even): up.
  EXPECT_EQ(float_to_bf16_bits(f32(0x3f818000)), 0x3f82);
  // Just above / below halfway.
  EXPECT_EQ(float_to_bf16_bits(f32(0x3f808001)), 0x3f81);
  EXPECT_EQ(float_to_bf16_bits(f32(0x3f807fff)), 0x3f80);
  EXPECT_EQ(float_to_bf16_bits(f32(0xbf818000)), 0xbf82);  // sign does not matter
  // A carry into the exponent: the largest mantissa rounds up to 2.
  EXPECT_EQ(float_to_bf16_bits(f32(0x3fffffff)), 0x4000);
  // FLT_MAX is past bf16's largest finite + half an ulp: it overflows to inf.
  EXPECT_EQ(float_to_bf16_bits(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(f32(0x7f7f7fff)), 0x7f7f);  // below the halfway point: stays finite
}

TEST(BF16, InfinitiesAndNaN) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_bf16_bits(inf), 0x7f80);
  EXPECT_EQ(float_to_bf16_bits(-inf), 0xff80);
  EXPECT_TRUE(std::isinf(bf16_bits_to_float(0x7f80)));
  EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(std::numeric_limits<float>::quiet_NaN())));
  // A NaN whose payload is only in the low 16 bits must not become inf.
  const std::uint16_t low_payload = float_to_bf16_bits(f32(0x7f800001));
  EXPECT_TRUE(is_bf16_nan(low_payload)) << std::hex << low_payload;
  EXPECT_TRUE(low_payload & 0x0040) << "quiet";
  EXPECT_TRUE(is_bf16_nan(float_to_bf16_bits(f32(0xffffffff))));
  EXPECT_EQ(float_to_bf16_bits(f32(0xffc00000)) & 0x8000, 0x8000) << "sign kept";
  EXPECT_TRUE(std::isnan(bf16_bits_to_float(0x7fc0)));
}

TEST(BF16, Denormals) {
  EXPECT_EQ(float_to_bf16_bits(f32(0x00010000)), 0x0001);  // smallest bf16 denormal
  EXPECT_EQ(bf16_bits_to_float(0x0001), std::ldexp(1.0f, -133));
  EXPECT_EQ(float_to_bf16_bits(f32(0x00008000)), 0x0000);  // tie to even (0)
  EXPECT_EQ(float_to_bf16_bits(f32(0x00018000)), 0x0002);  // tie to even (2)
  EXPECT_EQ(float_to_bf16_bits(f32(0x00008001)), 0x0001);  // above the tie
  EXPECT_EQ(float_to_bf16_bits(f32(0x807f8000)), 0x8080);  // largest denormal rounds to min normal
}

TEST(BF16, EveryBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = bf16_bits_to_float(bits);
    if (is_bf16_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << b;
      ASSERT_TRUE(is_bf16_nan(float_to_bf16_bits(f))) << b;
    } else {
      ASSERT_EQ(float_to_bf16_bits(f), bits) << b;
    }
  }
}

// --- f16 ----------------------------------------------------------------------------

TEST(F16, ExactValues) {
  EXPECT_EQ(float_to_f16_bits(1.0f), 0x3c00);
  EXPECT_EQ(float_to_f16_bits(-2.5f), 0xc100);
  EXPECT_EQ(float_to_f16_bits(65504.0f), 0x7bff);
  EXPECT_EQ(f16_bits_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(f16_bits_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(f16_bits_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(float_to_f16_bits(-0.0f), 0x8000);
}

TEST(F16, RoundsToNearestEven) {
  EXPECT_EQ(float_to_f16_bits(1.0f + std::ldexp(1.0f, -11)), 0x3c00);      // tie -> even
  EXPECT_EQ(float_to_f16_bits(1.0f + 3 * std::ldexp(1.0f, -11)), 0x3c02);  // tie -> even
  EXPECT_EQ(float_to_f16_bits(std::nextafter(1.0f + std::ldexp(1.0f, -11), 2.0f)), 0x3c01);
  EXPECT_EQ(float_to_f16_bits(65519.0f), 0x7bff);                   // below the overflow tie
  EXPECT_EQ(float_to_f16_bits(65520.0f), 0x7c00);                   // tie with "65536" -> inf
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -25)), 0x0000);      // tie -> 0
  EXPECT_EQ(float_to_f16_bits(3 * std::ldexp(1.0f, -25)), 0x0002);  // tie -> even
  EXPECT_EQ(float_to_f16_bits(std::ldexp(1.0f, -30)), 0x0000);      // underflow
}

TEST(F16, InfinitiesAndNaN) {
  constexpr float inf = std::numeric_limits<float>::infinity();
  EXPECT_EQ(float_to_f16_bits(inf), 0x7c00);
  EXPECT_EQ(float_to_f16_bits(-inf), 0xfc00);
  EXPECT_EQ(float_to_f16_bits(1e10f), 0x7c00);
  EXPECT_TRUE(std::isinf(f16_bits_to_float(0xfc00)));
  EXPECT_TRUE(is_f16_nan(float_to_f16_bits(std::numeric_limits<float>::quiet_NaN())));
  EXPECT_TRUE(is_f16_nan(float_to_f16_bits(f32(0x7f800001))));  // low payload stays NaN
}

TEST(F16, EveryBitPatternRoundTrips) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float f = f16_bits_to_float(bits);
    if (is_f16_nan(bits)) {
      ASSERT_TRUE(std::isnan(f)) << b;
      ASSERT_TRUE(is_f16_nan(float_to_f16_bits(f))) << b;
    } else {
      ASSERT_EQ(float_to_f16_bits(f), bits) << b;
      ASSERT_EQ(std::signbit(f), (bits & 0x8000) != 0) << b;
    }
  }
}

// The integer-only conversions (used where the compiler lacks _Float16, e.g.
// clang 14) give the same bits as the compiler's _Float16 casts.
TEST(F16Portable, WideningMatchesCompilerOnEveryBitPattern) {
  for (std::uint32_t b = 0; b <= 0xffff; ++b) {
    const auto bits = static_cast<std::uint16_t>(b);
    const float portable = detail::f16_bits_to_float_portable(bits);
#if PAGEDATTN_HAS_FLOAT16
    ASSERT_EQ(bits_of(portable), bits_of(static_cast<float>(std::bit_cast<_Float16>(bits)))) << b;
#endif
    if (!is_f16_nan(bits)) {
      ASSERT_EQ(detail::float_to_f16_bits_portable(portable), bits) << b;
    }
  }
}

// Every float on or beside a binary16 rounding boundary (the midpoints between
// neighbouring halves, one float ulp either side), plus a sweep of all floats.
TEST(F16Portable, NarrowingMatchesCompilerAtEveryRoundingBoundary) {
  const auto check = [](std::uint32_t float_bits) {
    const float f = f32(float_bits);
    const std::uint16_t portable = detail::float_to_f16_bits_portable(f);
#if PAGEDATTN_HAS_FLOAT16
    ASSERT_EQ(portable, std::bit_cast<std::uint16_t>(static_cast<_Float16>(f))) << float_bits;
#else
    ASSERT_EQ(portable, float_to_f16_bits(f)) << float_bits;
#endif
  };
  const auto half_value = [](std::uint32_t h) {
    return h == 0x7c00 ? 65536.0
                       : double{detail::f16_bits_to_float_portable(static_cast<std::uint16_t>(h))};
  };
  for (std::uint32_t h = 0; h < 0x7c00; ++h) {
    const std::uint32_t mid = bits_of(static_cast<float>((half_value(h) + half_value(h + 1)) / 2));
    for (std::uint32_t sign : {0u, 0x80000000u}) {
      for (std::uint32_t near = mid - 1; near <= mid + 1; ++near) check(sign | near);
    }
  }
  for (std::uint64_t b = 0; b <= 0xffffffffu; b += 65521) check(static_cast<std::uint32_t>(b));
  for (std::uint32_t special :
       {0x7f800000u, 0xff800000u, 0x7fc00000u, 0x7f800001u, 0xffbfffffu, 0x00000001u}) {
    check(special);
  }
}

// --- buffers, names, sizes ------------------------------------------------------------

TEST(DTypeBuffers, StoreThenLoadRoundsOnceAndIndexesElements) {
  std::uint16_t h[3] = {};
  store_from_float(h, DType::kF16, 1, 1.0f + std::ldexp(1.0f, -11));
  EXPECT_EQ(h[0], 0);
  EXPECT_EQ(h[1], 0x3c00);
  EXPECT_EQ(load_as_float(h, DType::kF16, 1), 1.0f);
  std::uint16_t b[2] = {};
  store_from_float(b, DType::kBF16, 1, -3.140625f);
  EXPECT_EQ(b[1], 0xc049);
  EXPECT_EQ(load_as_float(b, DType::kBF16, 1), -3.140625f);
  float f[2] = {};
  store_from_float(f, DType::kF32, 1, 0.1f);
  EXPECT_EQ(load_as_float(f, DType::kF32, 1), 0.1f);
  EXPECT_EQ(f[0], 0.0f);
}

TEST(DTypeNames, NamesAndSizes) {
  EXPECT_EQ(dtype_name(DType::kF32), "float32");
  EXPECT_EQ(dtype_name(DType::kF16), "float16");
  EXPECT_EQ(dtype_name(DType::kBF16), "bfloat16");
  EXPECT_EQ(dtype_name(static_cast<DType>(200)), "unknown");
  EXPECT_EQ(dtype_size(DType::kF32), 4u);
  EXPECT_EQ(dtype_size(DType::kF16), 2u);
  EXPECT_EQ(dtype_size(DType::kBF16), 2u);
}

TEST(DTypeNames, ParseAcceptsNamesAndShortForms) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) EXPECT_EQ(parse_dtype(dtype_name(t)), t);
  EXPECT_EQ(parse_dtype("f32"), DType::kF32);
  EXPECT_EQ(parse_dtype("f16"), DType::kF16);
  EXPECT_EQ(parse_dtype("bf16"), DType::kBF16);
}

TEST(DTypeNames, ParseRejectsUnknownNames) {
  for (const char* bad : {"", "float64", "half", "float32 ", "bf-16"}) {
    try {
      (void)parse_dtype(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr("'" + std::string(bad) + "'"));
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

}  // namespace
}  // namespace pagedattn
