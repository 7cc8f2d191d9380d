// Per-target conversion of stored K/V elements to f32 vectors, shared by the
// attention kernel and the row converters (Highway -inl.h pattern: included
// once per target from each kernel source).
#if defined(PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_
#undef PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstdint>
#include <limits>

#include "pagedattn/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 f32 lanes: head dims are multiples of 8, so rows never have tails.
using DF8 = hn::CappedTag<float, 8>;

// Lanes(DF) elements of a `kT` row starting at `i`, as f32 without any scale
// (fp8 e4m3 comes out as value x 2^-8: kFormatScale undoes it per key).
template <DType kT>
HWY_INLINE hn::Vec<DF8> LoadConvert(const void* row, std::size_t i) {
  const DF8 df;
  if constexpr (kT == DType::kF32) {
    return hn::LoadU(df, static_cast<const float*>(row) + i);
  } else if constexpr (kT == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF8> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(row) + i));
  } else if constexpr (kT == DType::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, DF8> db;
    return hn::PromoteTo(df, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(row) + i));
  } else if constexpr (kT == DType::kINT8) {
    const hn::Rebind<std::int8_t, DF8> d8;
    const hn::Rebind<std::int32_t, DF8> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + i)));
  } else {
    // fp8 -> f16 bits: e5m2 is the top byte of an f16. e4m3 S.EEEE.MMM moved
    // into f16's fields is its value x 2^-8 (subnormals included): sign-extend
    // to 16 bits, shift left 7 (S lands on bits 15 and 14, EEEE.MMM on 13..7),
    // clear bit 14. e4m3 S.1111.111 is NaN; it lands on +-1.875, which no
    // other byte does.
    const hn::Rebind<hwy::float16_t, DF8> dh;
    if constexpr (kT == DType::kFP8E5M2) {
      const hn::Rebind<std::uint8_t, DF8> d8;
      const hn::Rebind<std::uint16_t, DF8> d16;
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const std::uint8_t*>(row) + i));
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(b)));
    } else {
      const hn::Rebind<std::int8_t, DF8> d8;
      const hn::Rebind<std::int16_t, DF8> d16;
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + i));
      const auto h = hn::And(hn::ShiftLeft<7>(b), hn::Set(d16, static_cast<std::int16_t>(0xBF80)));
      const auto f = hn::PromoteTo(df, hn::BitCast(dh, h));
      return hn::IfThenElse(hn::Eq(hn::Abs(f), hn::Set(df, 1.875f)),
                            hn::Set(df, std::numeric_limits<float>::quiet_NaN()), f);
    }
  }
}

template <DType kT>
constexpr float kFormatScale = kT == DType::kFP8E4M3 ? 256.0f : 1.0f;

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_
