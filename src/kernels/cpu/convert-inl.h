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

// Targets whose f16 conversions are the hardware's (F16C): exact, inf/NaN
// included. Highway 1.0.3 emulates the others and turns f16 inf into 65536.
constexpr bool kNativeF16 = HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2;

// f16 bits (as u16 lanes) to f32 lanes of D, exactly, inf and NaN included.
template <class D, class V16>
HWY_INLINE hn::Vec<D> PromoteF16Bits(D df, V16 bits) {
  if constexpr (kNativeF16) {
    const hn::Rebind<hwy::float16_t, D> dh;
    return hn::PromoteTo(df, hn::BitCast(dh, bits));
  } else {
    // Exponent and mantissa shifted into f32's fields and rescaled by 2^112
    // (subnormals come out right); all-ones exponents are inf / NaN.
    const hn::Rebind<std::uint32_t, D> du;
    const auto h = hn::PromoteTo(du, bits);
    const auto sign = hn::ShiftLeft<16>(hn::And(h, hn::Set(du, 0x8000u)));
    const auto body = hn::ShiftLeft<13>(hn::And(h, hn::Set(du, 0x7fffu)));
    const auto finite = hn::BitCast(du, hn::Mul(hn::BitCast(df, body), hn::Set(df, 0x1p112f)));
    const auto special = hn::Or(body, hn::Set(du, 0x7f800000u));
    const hn::Rebind<std::int32_t, D> di;  // body < 2^28: signed compare (SSE4 has no unsigned)
    const auto is_special =
        hn::RebindMask(du, hn::Gt(hn::BitCast(di, body), hn::Set(di, (0x7c00 << 13) - 1)));
    return hn::BitCast(df, hn::Or(sign, hn::IfThenElse(is_special, special, finite)));
  }
}

// Lanes(d) elements of a `kT` row starting at `i`, as f32 without any scale
// (fp8 e4m3 comes out as value x 2^-8: kFormatScale undoes it per key).
// kNanFree: the caller knows the row holds no e4m3 NaN code (HasE4M3Nan), so
// e4m3 skips the select that maps one: 4 instructions a vector, not 7.
template <DType kT, bool kNanFree = false, class D>
HWY_INLINE hn::Vec<D> LoadConvert(D df, const void* row, std::size_t i) {
  if constexpr (kT == DType::kF32) {
    return hn::LoadU(df, static_cast<const float*>(row) + i);
  } else if constexpr (kT == DType::kF16) {
    const hn::Rebind<std::uint16_t, D> d16;
    return PromoteF16Bits(df, hn::LoadU(d16, static_cast<const std::uint16_t*>(row) + i));
  } else if constexpr (kT == DType::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, D> db;
    return hn::PromoteTo(df, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(row) + i));
  } else if constexpr (kT == DType::kINT8) {
    const hn::Rebind<std::int8_t, D> d8;
    const hn::Rebind<std::int32_t, D> d32;
    return hn::ConvertTo(
        df, hn::PromoteTo(d32, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + i)));
  } else {
    // fp8 -> f16 bits: e5m2 is the top byte of an f16. e4m3 S.EEEE.MMM moved
    // into f16's fields is its value x 2^-8 (subnormals included): sign-extend
    // to 16 bits, shift left 7 (S lands on bits 15 and 14, EEEE.MMM on 13..7),
    // clear bit 14. e4m3 S.1111.111 is NaN; it lands on +-1.875, which no
    // other byte does.
    const hn::Rebind<std::uint16_t, D> du16;
    if constexpr (kT == DType::kFP8E5M2) {
      const hn::Rebind<std::uint8_t, D> d8;
      const auto b = hn::PromoteTo(du16, hn::LoadU(d8, static_cast<const std::uint8_t*>(row) + i));
      return PromoteF16Bits(df, hn::ShiftLeft<8>(b));
    } else {
      const hn::Rebind<std::int8_t, D> d8;
      const hn::Rebind<std::int16_t, D> d16;
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + i));
      const auto h = hn::And(hn::ShiftLeft<7>(b), hn::Set(d16, static_cast<std::int16_t>(0xBF80)));
      const auto f = PromoteF16Bits(df, hn::BitCast(du16, h));
      if constexpr (kNanFree) return f;
      return hn::IfThenElse(hn::Eq(hn::Abs(f), hn::Set(df, 1.875f)),
                            hn::Set(df, std::numeric_limits<float>::quiet_NaN()), f);
    }
  }
}

// The same on at most 8 lanes (DF8).
template <DType kT>
HWY_INLINE hn::Vec<DF8> LoadConvert(const void* row, std::size_t i) {
  return LoadConvert<kT>(DF8(), row, i);
}

// Whether any of `count` e4m3 rows of n bytes (a multiple of 8) holds a NaN
// code (S.1111.111): OR-ing 0x80 into a byte makes a NaN code 0xFF and no
// other, so the bytewise maximum over the rows finds one. Two instructions
// per 64 bytes on AVX-512, where the select in LoadConvert costs three per
// 16 elements.
HWY_INLINE bool HasE4M3Nan(const void* const* rows, std::size_t count, std::size_t n) {
  const hn::ScalableTag<std::uint8_t> d;
  const hn::CappedTag<std::uint8_t, 8> d8;  // the rest of a row, 8 bytes at a time
  auto vmax = hn::Zero(d);
  auto vmax8 = hn::Zero(d8);
  for (std::size_t r = 0; r < count; ++r) {
    const auto* row = static_cast<const std::uint8_t*>(rows[r]);
    std::size_t i = 0;
    for (; i + hn::Lanes(d) <= n; i += hn::Lanes(d))
      vmax = hn::Max(vmax, hn::Or(hn::LoadU(d, row + i), hn::Set(d, 0x80)));
    for (; i < n; i += hn::Lanes(d8))
      vmax8 = hn::Max(vmax8, hn::Or(hn::LoadU(d8, row + i), hn::Set(d8, 0x80)));
  }
  return !hn::AllFalse(d, hn::Eq(vmax, hn::Set(d, 0xFF))) ||
         !hn::AllFalse(d8, hn::Eq(vmax8, hn::Set(d8, 0xFF)));
}

template <DType kT>
constexpr float kFormatScale = kT == DType::kFP8E4M3 ? 256.0f : 1.0f;

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_CONVERT_INL_H_
