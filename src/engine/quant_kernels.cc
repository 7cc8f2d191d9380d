// Quantised-weight products (see quant_kernels.h). Each block is decoded once
// into f32 vectors (w = d * q + m, one multiply-add) and multiplied into up
// to kRowTile activation rows, so a batch of a few rows reads the weights
// once.
#include "engine/quant_kernels.h"

#include <cstring>

#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/quant_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes: a block's 16 nibble bytes then fill one vector or more.
using DF = hn::CappedTag<float, 16>;
constexpr std::int32_t kRowTile = 4;

HWY_INLINE float HalfAt(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return f16_bits_to_float(bits);
}

// Lanes [c * N, c * N + N) of a block, as f32 weights.
template <WeightFormat F>
HWY_INLINE hn::Vec<DF> DecodeChunk(const std::uint8_t* block, std::size_t c) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const std::size_t n = hn::Lanes(df), first = c * n;
  const std::uint8_t* q = block + BlockTraits<F>::kQuants;
  const auto d = hn::Set(df, HalfAt(block));
  if constexpr (F == WeightFormat::kQ8_0) {
    const hn::Rebind<std::int8_t, DF> d8;
    const auto v =
        hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(q) + first));
    return hn::Mul(hn::ConvertTo(df, v), d);
  } else {
    const hn::Rebind<std::uint8_t, DF> d8;
    const bool high = first >= 16;
    auto v = hn::PromoteTo(di, hn::LoadU(d8, q + (high ? first - 16 : first)));
    v = high ? hn::ShiftRight<4>(v) : hn::And(v, hn::Set(di, 0x0f));
    if constexpr (F == WeightFormat::kQ4_0) {
      return hn::Mul(hn::ConvertTo(df, hn::Sub(v, hn::Set(di, 8))), d);
    } else {
      return hn::MulAdd(hn::ConvertTo(df, v), d, hn::Set(df, HalfAt(block + 2)));
    }
  }
}

// y[r][o] for rows [row, row + R) and one weight row o.
template <WeightFormat F, std::int32_t R>
HWY_INLINE void DotRows(const QuantProductArgs& a, std::int32_t row, std::int32_t o) {
  const DF df;
  const std::size_t n = hn::Lanes(df), chunks = kQuantBlock / n;
  const std::int64_t blocks = a.in / kQuantBlock;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * BlockTraits<F>::kBytes;
  hn::Vec<DF> acc[R];
  for (std::int32_t r = 0; r < R; ++r) acc[r] = hn::Zero(df);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * BlockTraits<F>::kBytes;
    for (std::size_t c = 0; c < chunks; ++c) {
      const auto weights = DecodeChunk<F>(block, c);
      const std::size_t at = std::size_t(b) * kQuantBlock + c * n;
      for (std::int32_t r = 0; r < R; ++r)
        acc[r] = hn::MulAdd(weights, hn::LoadU(df, a.x + std::size_t(row + r) * a.in + at), acc[r]);
    }
  }
  for (std::int32_t r = 0; r < R; ++r) {
    float* y = a.y + std::size_t(row + r) * a.ldy + o;
    const float sum = hn::GetLane(hn::SumOfLanes(df, acc[r]));
    *y = a.accumulate ? *y + sum : sum;
  }
}

template <WeightFormat F>
void ProductRange(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  for (std::int32_t o = out_begin; o < out_end; ++o) {
    std::int32_t row = 0;
    for (; row + kRowTile <= a.rows; row += kRowTile) DotRows<F, kRowTile>(a, row, o);
    for (; row < a.rows; ++row) DotRows<F, 1>(a, row, o);
  }
}

void QuantProduct(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  switch (a.format) {
    case WeightFormat::kQ8_0:
      return ProductRange<WeightFormat::kQ8_0>(a, out_begin, out_end);
    case WeightFormat::kQ4_0:
      return ProductRange<WeightFormat::kQ4_0>(a, out_begin, out_end);
    case WeightFormat::kQ4_1:
      return ProductRange<WeightFormat::kQ4_1>(a, out_begin, out_end);
    case WeightFormat::kF32:
      break;
  }
}

template <WeightFormat F>
void DequantizeRange(const void* w, std::int32_t in, std::int32_t first_row, std::int32_t count,
                     float* dst) {
  const DF df;
  const std::size_t n = hn::Lanes(df), chunks = kQuantBlock / n;
  const std::int64_t blocks = in / kQuantBlock;
  const auto* base =
      static_cast<const std::uint8_t*>(w) + first_row * blocks * BlockTraits<F>::kBytes;
  for (std::int64_t b = 0; b < std::int64_t{count} * blocks; ++b)
    for (std::size_t c = 0; c < chunks; ++c)
      hn::StoreU(DecodeChunk<F>(base + b * BlockTraits<F>::kBytes, c), df,
                 dst + std::size_t(b) * kQuantBlock + c * n);
}

void DequantizeRows(const void* w, WeightFormat format, std::int32_t in, std::int32_t first_row,
                    std::int32_t count, float* dst) {
  switch (format) {
    case WeightFormat::kQ8_0:
      return DequantizeRange<WeightFormat::kQ8_0>(w, in, first_row, count, dst);
    case WeightFormat::kQ4_0:
      return DequantizeRange<WeightFormat::kQ4_0>(w, in, first_row, count, dst);
    case WeightFormat::kQ4_1:
      return DequantizeRange<WeightFormat::kQ4_1>(w, in, first_row, count, dst);
    case WeightFormat::kF32:
      break;
  }
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {
HWY_EXPORT(QuantProduct);
HWY_EXPORT(DequantizeRows);

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kQ8_0:
      return "q8_0";
    case WeightFormat::kQ4_0:
      return "q4_0";
    case WeightFormat::kQ4_1:
      return "q4_1";
  }
  return "?";
}

std::int64_t weight_block_bytes(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return 4;
    case WeightFormat::kQ8_0:
      return BlockTraits<WeightFormat::kQ8_0>::kBytes;
    case WeightFormat::kQ4_0:
      return BlockTraits<WeightFormat::kQ4_0>::kBytes;
    case WeightFormat::kQ4_1:
      return BlockTraits<WeightFormat::kQ4_1>::kBytes;
  }
  return 0;
}

std::int64_t weight_row_bytes(WeightFormat format, std::int64_t in) {
  if (format == WeightFormat::kF32) return in * 4;
  require(in % kQuantBlock == 0, "weight_row_bytes: a ", weight_format_name(format), " row of ", in,
          " weights is not a whole number of ", kQuantBlock, "-weight blocks");
  return in / kQuantBlock * weight_block_bytes(format);
}

void quant_product(const QuantProductArgs& args, std::int32_t out_begin, std::int32_t out_end) {
  HWY_DYNAMIC_DISPATCH(QuantProduct)(args, out_begin, out_end);
}

void dequantize_weight_rows(const void* w, WeightFormat format, std::int32_t in,
                            std::int32_t first_row, std::int32_t count, float* dst) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(w, format, in, first_row, count, dst);
}

}  // namespace pagedattn::engine
#endif
