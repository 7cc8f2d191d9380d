// dequantize_row against per-element references written from the format
// definitions (structured differently from the library: one element at a
// time, or ggml's original loop for Q6_K), compared bit for bit.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <vector>

#include "model/gguf_writer.h"
#include "pagedattn/errors.h"
#include "pagedattn/gguf_types.h"
#include "support/expect_error.h"

namespace pagedattn {
namespace {

using test::random_blocks;

std::uint16_t u16_at(const std::uint8_t* p) {
  return static_cast<std::uint16_t>(p[0] | p[1] << 8);
}

float reference_half(std::uint16_t h) {
  const float sign = (h & 0x8000) ? -1.0f : 1.0f;
  const int exponent = (h >> 10) & 0x1f;
  const int mantissa = h & 0x3ff;
  if (exponent == 0x1f) {
    const std::uint32_t bits =
        ((h & 0x8000u) << 16) | 0x7f800000u | (std::uint32_t(mantissa) << 13);
    return std::bit_cast<float>(bits);
  }
  if (exponent == 0) return sign * std::ldexp(static_cast<float>(mantissa), -24);
  return sign * std::ldexp(static_cast<float>(mantissa + 1024), exponent - 25);
}

// The 6-bit scale (which = 0) or min (which = 1) of sub-block j, as ggml's
// get_scale_min_k4 describes the packing.
int k_scale(const std::uint8_t* q, int j, int which) {
  if (j < 4) return q[j + 4 * which] & 63;
  if (which == 0) return (q[j + 4] & 0xf) | ((q[j - 4] >> 6) << 4);
  return (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
}

// Element e of one block.
float reference_element(GgufType type, const std::uint8_t* b, int e) {
  switch (type) {
    case GgufType::kQ4_0: {
      const int q = e < 16 ? (b[2 + e] & 0xf) : (b[2 + e - 16] >> 4);
      return reference_half(u16_at(b)) * static_cast<float>(q - 8);
    }
    case GgufType::kQ4_1: {
      const int q = e < 16 ? (b[4 + e] & 0xf) : (b[4 + e - 16] >> 4);
      return reference_half(u16_at(b)) * static_cast<float>(q) + reference_half(u16_at(b + 2));
    }
    case GgufType::kQ5_0:
    case GgufType::kQ5_1: {
      const int at = type == GgufType::kQ5_0 ? 2 : 4;  // qh, then the nibbles
      const std::uint32_t qh = static_cast<std::uint32_t>(b[at]) | (std::uint32_t{b[at + 1]} << 8) |
                               (std::uint32_t{b[at + 2]} << 16) | (std::uint32_t{b[at + 3]} << 24);
      const std::uint8_t* qs = b + at + 4;
      const int q = (e < 16 ? (qs[e] & 0xf) : (qs[e - 16] >> 4)) + int((qh >> e) & 1u) * 16;
      if (type == GgufType::kQ5_0) return reference_half(u16_at(b)) * static_cast<float>(q - 16);
      return reference_half(u16_at(b)) * static_cast<float>(q) + reference_half(u16_at(b + 2));
    }
    case GgufType::kQ8_0:
      return reference_half(u16_at(b)) * static_cast<float>(static_cast<std::int8_t>(b[2 + e]));
    case GgufType::kQ4_K:
    case GgufType::kQ5_K: {
      const bool five = type == GgufType::kQ5_K;
      const int sub = e / 32, l = e % 32;
      const std::uint8_t* qs = b + (five ? 48 : 16);
      int q = (sub % 2 == 0) ? (qs[32 * (sub / 2) + l] & 0xf) : (qs[32 * (sub / 2) + l] >> 4);
      if (five) q += ((b[16 + l] >> sub) & 1) * 16;
      const float scale = reference_half(u16_at(b)) * static_cast<float>(k_scale(b + 4, sub, 0));
      const float min = reference_half(u16_at(b + 2)) * static_cast<float>(k_scale(b + 4, sub, 1));
      return scale * static_cast<float>(q) - min;
    }
    default:
      ADD_FAILURE() << "no element reference";
      return 0;
  }
}

// ggml's Q6_K loop: two halves of 128, four groups of 32 interleaved.
void reference_q6_k(const std::uint8_t* b, float* y) {
  const std::uint8_t* ql = b;
  const std::uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const std::int8_t*>(b + 192);
  const float d = reference_half(u16_at(b + 208));
  for (int n = 0; n < 256; n += 128) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
      const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
      const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
      const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
      y[l] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
    y += 128;
    ql += 64;
    qh += 32;
    sc += 8;
  }
}

std::vector<float> reference_row(GgufType type, const std::vector<std::byte>& bytes,
                                 std::int64_t n) {
  const auto* src = reinterpret_cast<const std::uint8_t*>(bytes.data());
  const GgufTypeInfo& info = gguf_type_info(type);
  std::vector<float> out(static_cast<std::size_t>(n));
  if (type == GgufType::kF32) {
    std::memcpy(out.data(), src, out.size() * 4);
  } else if (type == GgufType::kF16) {
    for (std::int64_t i = 0; i < n; ++i) out[i] = reference_half(u16_at(src + 2 * i));
  } else if (type == GgufType::kBF16) {
    for (std::int64_t i = 0; i < n; ++i)
      out[i] = std::bit_cast<float>(std::uint32_t{u16_at(src + 2 * i)} << 16);
  } else {
    for (std::int64_t blk = 0; blk < n / info.block_size; ++blk) {
      const std::uint8_t* b = src + blk * info.block_bytes;
      float* y = out.data() + blk * info.block_size;
      if (type == GgufType::kQ6_K) {
        reference_q6_k(b, y);
        continue;
      }
      for (int e = 0; e < info.block_size; ++e) y[e] = reference_element(type, b, e);
    }
  }
  return out;
}

const GgufType kSupported[] = {GgufType::kF32,  GgufType::kF16,  GgufType::kBF16, GgufType::kQ8_0,
                               GgufType::kQ4_0, GgufType::kQ4_1, GgufType::kQ5_0, GgufType::kQ5_1,
                               GgufType::kQ4_K, GgufType::kQ5_K, GgufType::kQ6_K};

TEST(GgufDequantize, EveryTypeMatchesTheElementReferenceBitForBit) {
  for (GgufType type : kSupported) {
    const GgufTypeInfo& info = gguf_type_info(type);
    for (std::int64_t blocks : {1, 2, 7}) {
      for (std::uint64_t seed = 1; seed <= 20; ++seed) {
        const std::int64_t n = blocks * info.block_size * (info.block_size == 1 ? 37 : 1);
        const std::vector<std::byte> bytes = random_blocks(
            type, n / info.block_size, seed * 1000 + static_cast<std::uint64_t>(blocks));
        std::vector<float> got(static_cast<std::size_t>(n), -7.0f);
        dequantize_row(type, bytes.data(), got.data(), n);
        const std::vector<float> want = reference_row(type, bytes, n);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), got.size() * sizeof(float)), 0)
            << info.name << " blocks " << blocks << " seed " << seed;
      }
    }
  }
}

TEST(GgufDequantize, KnownValuesOfSmallBlocks) {
  // Q4_0: d = 0.5 (f16 0x3800), nibbles 0..15 low, 15..0 high.
  std::vector<std::uint8_t> q4_0 = {0x00, 0x38};
  for (int j = 0; j < 16; ++j) q4_0.push_back(static_cast<std::uint8_t>(j | ((15 - j) << 4)));
  float out[32];
  dequantize_row(GgufType::kQ4_0, q4_0.data(), out, 32);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(out[j], 0.5f * static_cast<float>(j - 8));
    EXPECT_EQ(out[16 + j], 0.5f * static_cast<float>(7 - j));
  }
  // Q8_0: d = 2 (0x4000), q = -16..15.
  std::vector<std::uint8_t> q8_0 = {0x00, 0x40};
  for (int j = 0; j < 32; ++j) q8_0.push_back(static_cast<std::uint8_t>(j - 16));
  dequantize_row(GgufType::kQ8_0, q8_0.data(), out, 32);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(out[j], 2.0f * static_cast<float>(j - 16));
  // F16 specials: subnormal, -0, inf, max.
  const std::uint16_t halves[] = {0x0001, 0x8000, 0x7c00, 0x7bff};
  float f[4];
  dequantize_row(GgufType::kF16, halves, f, 4);
  EXPECT_EQ(f[0], std::ldexp(1.0f, -24));
  EXPECT_TRUE(f[1] == 0.0f && std::signbit(f[1]));
  EXPECT_TRUE(std::isinf(f[2]));
  EXPECT_EQ(f[3], 65504.0f);
}

TEST(GgufDequantize, RejectsBadArguments) {
  float out[32];
  std::uint8_t in[64] = {};
  test::expect_throws<Unsupported>([&] { dequantize_row(GgufType::kIQ4_NL, in, out, 32); },
                                   {"IQ4_NL", "no dequantisation"});
  test::expect_throws<InvalidArgument>([&] { dequantize_row(GgufType::kQ4_0, in, out, 31); },
                                       {"n = 31", "block size 32"});
  test::expect_throws<InvalidArgument>([&] { dequantize_row(GgufType::kF32, in, out, -1); },
                                       {"n = -1"});
  test::expect_throws<InvalidArgument>(
      [&] { dequantize_row(static_cast<GgufType>(77), in, out, 1); }, {"77"});
  EXPECT_EQ(gguf_row_bytes(GgufType::kQ6_K, 512), 420);
  EXPECT_EQ(gguf_row_bytes(GgufType::kBF16, 3), 6);
  EXPECT_EQ(parse_gguf_type("q4_k"), GgufType::kQ4_K);
  test::expect_throws<InvalidArgument>([] { parse_gguf_type("Q9_9"); }, {"Q9_9"});
}

}  // namespace
}  // namespace pagedattn
