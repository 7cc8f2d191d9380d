// Matrix-vector kernels that read quantised weights in place, in GGUF's
// (ggml's) block layouts, so a decode step streams 4.5-8.5 bits per weight
// instead of 32. The legacy formats hold 32 weights per block along the
// input dimension:
//   Q8_0: f16 d, int8 q[32]                 w = d * q
//   Q4_0: f16 d, u8 qs[16]                  w = d * (nibble - 8)
//   Q4_1: f16 d, f16 m, u8 qs[16]           w = d * nibble + m
//   Q5_0: f16 d, u32 qh, u8 qs[16]          w = d * (q - 16)
//   Q5_1: f16 d, f16 m, u32 qh, u8 qs[16]   w = d * q + m
// (weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble
// of qs[j - 16]; Q5_x's fifth bit of weight j is bit j of qh). llama-quantize
// writes Q5_0 / Q5_1 for the rows of a K-quant file that are not a multiple
// of 256 long (SmolLM2's and Qwen2.5-0.5B's Q4_K_M files). The K-quants hold 256 weights per
// super-block (layouts in src/model/gguf_types.cc, the definition the tests check against):
//   Q4_K (144 B): f16 d, f16 dmin, 12 B of 6-bit scales sc[8] / mins m[8],
//                 u8 qs[128]; sub-block j of 32: w = d*sc[j] * q - dmin*m[j]
//   Q5_K (176 B): as Q4_K with u8 qh[32] (bit 4 of each q) before qs
//   Q6_K (210 B): u8 ql[128], u8 qh[64], int8 sc[16], f16 d;
//                 16 weights per scale: w = d*sc * (q - 32)
// Highway with run-time dispatch; single-threaded calls: the caller spreads
// output ranges over threads.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>

namespace pagedattn::engine {

enum class WeightFormat : std::uint8_t {
  kF32 = 0,
  kQ8_0,
  kQ4_0,
  kQ4_1,
  kQ4_K,
  kQ5_K,
  kQ6_K,
  kQ5_0,
  kQ5_1,
  // 16-bit floats, widened in registers (exactly): a model's F16 / BF16
  // tensors read at half the bytes of f32, in rows of whole 32-weight blocks.
  kF16,
  kBF16
};

inline constexpr std::int32_t kQuantBlock = 32;    // weights per block of Q8_0 / Q4_x / Q5_x
inline constexpr std::int32_t kQuantKBlock = 256;  // weights per K-quant super-block

// Weights per block of `format` (f32: 1). A row, a slice's columns and a
// tensor-parallel shard of the input dimension are whole blocks.
constexpr std::int32_t weight_format_block(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return 1;
    case WeightFormat::kQ8_0:
    case WeightFormat::kQ4_0:
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ5_0:
    case WeightFormat::kQ5_1:
    case WeightFormat::kF16:
    case WeightFormat::kBF16:
      return kQuantBlock;
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
    case WeightFormat::kQ6_K:
      return kQuantKBlock;
  }
  return 1;
}

// F16 / BF16: floats, widened exactly, in the quantised formats' blocks.
constexpr bool is_sixteen_bit(WeightFormat format) {
  return format == WeightFormat::kF16 || format == WeightFormat::kBF16;
}

// Whether the in-place kernels have integer dot products for `format`
// (QuantProductArgs::int8_x): the quantised formats. Float formats
// ignore int8_x and multiply f32 x.
constexpr bool has_int8_products(WeightFormat format) {
  return format != WeightFormat::kF32 && !is_sixteen_bit(format);
}

// visit(std::integral_constant<WeightFormat, F>{}) for F = format: the one
// switch behind every per-format template instantiation.
template <class Visit>
decltype(auto) visit_weight_format(WeightFormat format, Visit&& visit) {
  using enum WeightFormat;
  switch (format) {
    case kQ8_0:
      return visit(std::integral_constant<WeightFormat, kQ8_0>{});
    case kQ4_0:
      return visit(std::integral_constant<WeightFormat, kQ4_0>{});
    case kQ4_1:
      return visit(std::integral_constant<WeightFormat, kQ4_1>{});
    case kQ5_0:
      return visit(std::integral_constant<WeightFormat, kQ5_0>{});
    case kQ5_1:
      return visit(std::integral_constant<WeightFormat, kQ5_1>{});
    case kQ4_K:
      return visit(std::integral_constant<WeightFormat, kQ4_K>{});
    case kQ5_K:
      return visit(std::integral_constant<WeightFormat, kQ5_K>{});
    case kQ6_K:
      return visit(std::integral_constant<WeightFormat, kQ6_K>{});
    case kF16:
      return visit(std::integral_constant<WeightFormat, kF16>{});
    case kBF16:
      return visit(std::integral_constant<WeightFormat, kBF16>{});
    case kF32:
      break;
  }
  return visit(std::integral_constant<WeightFormat, kF32>{});
}

// Block sizes and where the quants start in a block.
template <WeightFormat F>
struct BlockTraits;
// f32 rows taken 32 weights at a time by the in-place kernels (linear()'s
// small batches of f32 weights, rows of a multiple of 32).
template <>
struct BlockTraits<WeightFormat::kF32> {
  static constexpr std::int64_t kBytes = 4 * 32;
  static constexpr std::int64_t kQuants = 0;
};
// F16 / BF16 rows, 32 weights of 2 bytes at a time.
struct SixteenBitBlockTraits {
  static constexpr std::int64_t kBytes = 2 * 32;
  static constexpr std::int64_t kQuants = 0;
};
template <>
struct BlockTraits<WeightFormat::kF16> : SixteenBitBlockTraits {};
template <>
struct BlockTraits<WeightFormat::kBF16> : SixteenBitBlockTraits {};
template <>
struct BlockTraits<WeightFormat::kQ8_0> {
  static constexpr std::int64_t kBytes = 2 + 32;
  static constexpr std::int64_t kQuants = 2;
};
template <>
struct BlockTraits<WeightFormat::kQ4_0> {
  static constexpr std::int64_t kBytes = 2 + 16;
  static constexpr std::int64_t kQuants = 2;
};
template <>
struct BlockTraits<WeightFormat::kQ4_1> {
  static constexpr std::int64_t kBytes = 2 + 2 + 16;
  static constexpr std::int64_t kQuants = 4;
};
template <>
struct BlockTraits<WeightFormat::kQ5_0> {
  static constexpr std::int64_t kBytes = 2 + 4 + 16;
  static constexpr std::int64_t kHighBits = 2;
  static constexpr std::int64_t kQuants = 6;
};
template <>
struct BlockTraits<WeightFormat::kQ5_1> {
  static constexpr std::int64_t kBytes = 2 + 2 + 4 + 16;
  static constexpr std::int64_t kHighBits = 4;
  static constexpr std::int64_t kQuants = 8;
};
template <>
struct BlockTraits<WeightFormat::kQ4_K> {
  static constexpr std::int64_t kBytes = 2 + 2 + 12 + 128;
  static constexpr std::int64_t kQuants = 16;
};
template <>
struct BlockTraits<WeightFormat::kQ5_K> {
  static constexpr std::int64_t kBytes = 2 + 2 + 12 + 32 + 128;
  static constexpr std::int64_t kHighBits = 16;
  static constexpr std::int64_t kQuants = 48;
};
template <>
struct BlockTraits<WeightFormat::kQ6_K> {
  static constexpr std::int64_t kBytes = 128 + 64 + 16 + 2;
  static constexpr std::int64_t kHighBits = 128;
  static constexpr std::int64_t kScales = 192;
  static constexpr std::int64_t kScale = 208;  // f16 d
};

// The 6-bit scales sc[8] and mins m[8] of a Q4_K / Q5_K super-block from
// its 12 packed bytes: j < 4 in the low 6 bits of bytes j (scale) and j + 4
// (min); j >= 4 in a nibble of byte j + 4 and the top 2 bits of bytes j - 4
// (scale) and j (min).
inline void unpack_k_scales(const std::uint8_t* packed, std::uint8_t* sc, std::uint8_t* m) {
  std::uint32_t u[3];
  std::memcpy(u, packed, sizeof u);
  constexpr std::uint32_t k6 = 0x3f3f3f3f, k4 = 0x0f0f0f0f, k2 = 0x03030303;
  const std::uint32_t words[4] = {u[0] & k6,                                        // sc[0..3]
                                  (u[2] & k4) | (((u[0] >> 6) & k2) << 4),          // sc[4..7]
                                  u[1] & k6,                                        // m[0..3]
                                  ((u[2] >> 4) & k4) | (((u[1] >> 6) & k2) << 4)};  // m[4..7]
  std::memcpy(sc, words, 8);
  std::memcpy(m, words + 2, 8);
}

const char* weight_format_name(WeightFormat format);
// Bytes of one block (f32: of one weight).
std::int64_t weight_block_bytes(WeightFormat format);
// Bytes of one row of `in` weights. InvalidArgument when a quantised
// format's `in` is not a multiple of weight_format_block(format).
std::int64_t weight_row_bytes(WeightFormat format, std::int64_t in);

struct QuantProductArgs {
  const float* x = nullptr;  // [rows][in]
  std::int32_t rows = 0;
  std::int32_t in = 0;      // multiple of weight_format_block(format)
  const void* w = nullptr;  // [out] rows of in / weight_format_block(format) blocks
  WeightFormat format = WeightFormat::kQ8_0;
  float* y = nullptr;  // [rows][ldy]
  std::int32_t ldy = 0;
  bool accumulate = false;  // y += instead of y =
  // Multiply the quants by x rounded to int8 per 32 values
  // (quantize_activations_q8) on integer dot products (x86 AVX2 and up;
  // elsewhere the f32 kernels run): exact integer sums per 32 weights (Q6_K:
  // 16), each scaled by its block's d (* sc) * dx. The mins of Q4_1 / Q5_1 /
  // Q4_K / Q5_K still multiply exact sums of x. Every row is quantised once
  // per call.
  bool int8_x = false;
};

// x[in] as int8 per 32 values with llama.cpp's Q8_0 scale: scale[k] =
// max |x[32k..32k+32)| / 127, q[i] = x[i] * (1 / scale) rounded to nearest
// (ties to even; llama.cpp rounds them away from 0), 0 where the scale is 0.
// in: a multiple of 32. Highway; the same bytes on every target.
void quantize_activations_q8(const float* x, std::int32_t in, std::int8_t* q, float* scales);

// y[r][o] (+)= sum_i w[o][i] x[r][i] for the output columns o in
// [out_begin, out_end) and every row r. A row's result does not depend on
// the other rows, on their count or on the column range: every row runs the
// same operations in the same order. The K-quant kernels multiply the
// integer quants into x and apply each (sub-)block's scale to the partial
// sum, and the Q4_K / Q5_K mins to a sum of x per 32 weights computed once
// per call, so their results differ from the product of the dequantised
// weights by f32 rounding only.
void quant_product(const QuantProductArgs& args, std::int32_t out_begin, std::int32_t out_end);

// dst[r][i] = w[first_row + r][i] as f32 for `count` weight rows of `in`.
void dequantize_weight_rows(const void* w, WeightFormat format, std::int32_t in,
                            std::int32_t first_row, std::int32_t count, float* dst);

}  // namespace pagedattn::engine
