// Matrix-vector kernels that read quantised weights in place, in GGUF's
// (ggml's) block layouts, so a decode step streams 4.5-8.5 bits per weight
// instead of 32. Every block holds 32 weights along the input dimension:
//   Q8_0: f16 d, int8 q[32]                 w = d * q
//   Q4_0: f16 d, u8 qs[16]                  w = d * (nibble - 8)
//   Q4_1: f16 d, f16 m, u8 qs[16]           w = d * nibble + m
// (weight j < 16 is the low nibble of qs[j], weight j >= 16 the high nibble
// of qs[j - 16]). Highway with run-time dispatch; single-threaded calls: the
// caller spreads output ranges over threads.
#pragma once

#include <cstdint>

namespace pagedattn::engine {

enum class WeightFormat : std::uint8_t { kF32 = 0, kQ8_0, kQ4_0, kQ4_1 };

inline constexpr std::int32_t kQuantBlock = 32;  // weights per block (every format but f32)

// Block sizes and where the quants start in a block.
template <WeightFormat F>
struct BlockTraits;
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

const char* weight_format_name(WeightFormat format);
// Bytes of one block (f32: of one weight).
std::int64_t weight_block_bytes(WeightFormat format);
// Bytes of one row of `in` weights. InvalidArgument when a quantised
// format's `in` is not a multiple of kQuantBlock.
std::int64_t weight_row_bytes(WeightFormat format, std::int64_t in);

struct QuantProductArgs {
  const float* x = nullptr;  // [rows][in]
  std::int32_t rows = 0;
  std::int32_t in = 0;      // multiple of kQuantBlock
  const void* w = nullptr;  // [out] rows of in / 32 blocks in `format`
  WeightFormat format = WeightFormat::kQ8_0;
  float* y = nullptr;  // [rows][ldy]
  std::int32_t ldy = 0;
  bool accumulate = false;  // y += instead of y =
};

// y[r][o] (+)= sum_i w[o][i] x[r][i] for the output columns o in
// [out_begin, out_end) and every row r. A row's result does not depend on
// the other rows, on their count or on the column range: every row runs the
// same operations in the same order.
void quant_product(const QuantProductArgs& args, std::int32_t out_begin, std::int32_t out_end);

// dst[r][i] = w[first_row + r][i] as f32 for `count` weight rows of `in`.
void dequantize_weight_rows(const void* w, WeightFormat format, std::int32_t in,
                            std::int32_t first_row, std::int32_t count, float* dst);

}  // namespace pagedattn::engine
