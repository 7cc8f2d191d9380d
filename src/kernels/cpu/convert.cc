// Row conversions with Highway: f32/f16/bf16 in and out and fp8/int8 in
// vectorised (RNE, matching the scalar conversions in dtype.h bit for bit),
// fp8/int8 out scalar.
#include "convert.h"

#include <cmath>
#include <cstring>

#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/convert.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

#include "kernels/cpu/bf16_decode-inl.h"
#include "kernels/cpu/convert-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = DF8;

HWY_INLINE hn::Vec<DF> LoadF32(const void* src, DType t, std::int64_t i) {
  const auto at = std::size_t(i);
  switch (t) {
    case DType::kF16:
      return LoadConvert<DType::kF16>(src, at);
    case DType::kBF16:
      return LoadConvert<DType::kBF16>(src, at);
    case DType::kINT8:
      return LoadConvert<DType::kINT8>(src, at);
    case DType::kFP8E5M2:
      return LoadConvert<DType::kFP8E5M2>(src, at);
    case DType::kFP8E4M3:  // x 2^8 is exact, NaN stays NaN
      return hn::Mul(LoadConvert<DType::kFP8E4M3>(src, at),
                     hn::Set(DF(), kFormatScale<DType::kFP8E4M3>));
    case DType::kF32:
      break;
  }
  return LoadConvert<DType::kF32>(src, at);
}

// f16 narrowing is exact only on kNativeF16 targets (Highway's emulation
// differs on signed zeros), so other targets convert to f16 in scalar code.
bool Vectorizable(DType t) {
  return t == DType::kF32 || t == DType::kBF16 || (t == DType::kF16 && kNativeF16);
}

HWY_INLINE void StoreF32(hn::Vec<DF> v, void* dst, DType t, std::int64_t i) {
  const DF df;
  if (t == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    hn::StoreU(hn::DemoteTo(dh, v), dh, static_cast<hwy::float16_t*>(dst) + i);
  } else if (t == DType::kBF16) {
    // Round to nearest even on the bits; NaN keeps a quiet NaN.
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<std::uint16_t, DF> d16;
    const auto bits = hn::BitCast(du, v);
    const auto odd = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1u));
    auto rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7fffu), odd)));
    const auto quiet = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40u));
    rounded = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(v)), quiet, rounded);
    // Values are <= 0xffff, so the signed demotion (saturating) is exact.
    const hn::RebindToSigned<DF> di;
    hn::StoreU(hn::DemoteTo(d16, hn::BitCast(di, rounded)), d16,
               static_cast<std::uint16_t*>(dst) + i);
  } else {
    hn::StoreU(v, df, static_cast<float*>(dst) + i);
  }
}

void ConvertRow(const void* src, DType sd, void* dst, DType dd, std::int64_t n, float mul) {
  std::int64_t i = 0;
  // Every source dtype widens exactly in vectors (LoadF32); only narrowing
  // to fp8 / int8 (and f16 off F16C targets) is scalar.
  if (Vectorizable(dd)) {
    const DF df;
    const auto lanes = static_cast<std::int64_t>(hn::Lanes(df));
    const auto vmul = hn::Set(df, mul);
    for (; i + lanes <= n; i += lanes) {
      auto v = LoadF32(src, sd, i);
      if (mul != 1.0f) v = hn::Mul(v, vmul);
      StoreF32(v, dst, dd, i);
    }
  }
  for (; i < n; ++i)
    store_from_float(dst, dd, std::size_t(i), load_as_float(src, sd, std::size_t(i)) * mul);
}

float AbsMaxRow(const void* src, DType t, std::int64_t n) {
  const DF df;
  const auto lanes = static_cast<std::int64_t>(hn::Lanes(df));
  auto vmax = hn::Zero(df);
  std::int64_t i = 0;
  if (Vectorizable(t))
    for (; i + lanes <= n; i += lanes) vmax = hn::Max(vmax, hn::Abs(LoadF32(src, t, i)));
  float m = hn::GetLane(hn::MaxOfLanes(df, vmax));
  for (; i < n; ++i) m = std::fmax(m, std::fabs(load_as_float(src, t, std::size_t(i))));
  return m;
}

// Multiples of 8 bytes in vectors, then the last n % 8 one at a time.
bool E4M3HasNan(const void* src, std::int64_t n) {
  const void* rows[1] = {src};
  const auto* bytes = static_cast<const std::uint8_t*>(src);
  bool nan = false;
  for (std::int64_t i = n - n % 8; i < n; ++i) nan |= (bytes[i] & 0x7f) == 0x7f;
  return nan || HasE4M3Nan(rows, 1, std::size_t(n - n % 8));
}

// Full vectors (16 lanes on AVX-512, as the decode loops for head dims that
// are multiples of 16), then 8 lanes.
void E4M3ToF32NanFree(const void* src, float* dst, std::int64_t n) {
  const hn::ScalableTag<float> df;
  const auto count = std::size_t(n);
  std::size_t i = 0;
  for (; i + hn::Lanes(df) <= count; i += hn::Lanes(df))
    hn::StoreU(LoadConvert<DType::kFP8E4M3, true>(df, src, i), df, dst + i);
  for (; i < count; i += hn::Lanes(DF8()))
    hn::StoreU(LoadConvert<DType::kFP8E4M3, true>(DF8(), src, i), DF8(), dst + i);
}

#if PAGEDATTN_BF16_DOT_TARGET
template <DType kT>
void Fp8PairsToBf16BitsAs(const std::uint8_t* a, const std::uint8_t* b, Fp8PairOrder order,
                          std::uint32_t* dst, std::size_t n) {
  if (order == Fp8PairOrder::kKeys)
    bf16dec::Fp8RowsToBf16Pairs<kT, Fp8PairOrder::kKeys>(a, b, n, dst);
  else
    bf16dec::Fp8RowsToBf16Pairs<kT, Fp8PairOrder::kValues>(a, b, n, dst);
}
#endif

bool Fp8PairsToBf16Bits(const void* a, const void* b, DType t, Fp8PairOrder order,
                        std::uint32_t* dst, std::int64_t n) {
#if PAGEDATTN_BF16_DOT_TARGET
  if (!cpu_features().avx512_vbmi) return false;
  const auto* pa = static_cast<const std::uint8_t*>(a);
  const auto* pb = static_cast<const std::uint8_t*>(b);
  if (t == DType::kFP8E4M3)
    Fp8PairsToBf16BitsAs<DType::kFP8E4M3>(pa, pb, order, dst, std::size_t(n));
  if (t == DType::kFP8E5M2)
    Fp8PairsToBf16BitsAs<DType::kFP8E5M2>(pa, pb, order, dst, std::size_t(n));
  return true;
#else
  (void)a, (void)b, (void)t, (void)order, (void)dst, (void)n;
  return false;
#endif
}

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::kernels {
HWY_EXPORT(ConvertRow);
HWY_EXPORT(AbsMaxRow);
HWY_EXPORT(E4M3HasNan);
HWY_EXPORT(E4M3ToF32NanFree);
HWY_EXPORT(Fp8PairsToBf16Bits);

bool fp8_pairs_to_bf16_bits(const void* a, const void* b, DType src_dtype, Fp8PairOrder order,
                            std::uint32_t* dst, std::int64_t n) {
  require(is_fp8(src_dtype), "fp8_pairs_to_bf16_bits: src_dtype = ", dtype_name(src_dtype),
          " is not an fp8 type");
  require(n >= 0 && n % 8 == 0, "fp8_pairs_to_bf16_bits: n = ", n,
          " must be a non-negative multiple of 8");
  return HWY_DYNAMIC_DISPATCH(Fp8PairsToBf16Bits)(a, b, src_dtype, order, dst, n);
}

bool e4m3_has_nan(const void* src, std::int64_t n) {
  require(n >= 0, "e4m3_has_nan: n = ", n, " must be >= 0");
  return HWY_DYNAMIC_DISPATCH(E4M3HasNan)(src, n);
}

void e4m3_to_f32_nan_free(const void* src, float* dst, std::int64_t n) {
  require(n >= 0 && n % 8 == 0, "e4m3_to_f32_nan_free: n = ", n,
          " must be a non-negative multiple of 8");
  HWY_DYNAMIC_DISPATCH(E4M3ToF32NanFree)(src, dst, n);
}

void convert_row(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n,
                 float multiplier) {
  if (src_dtype == dst_dtype && multiplier == 1.0f) {
    std::memcpy(dst, src, static_cast<std::size_t>(n) * dtype_size(src_dtype));
    return;
  }
  HWY_DYNAMIC_DISPATCH(ConvertRow)(src, src_dtype, dst, dst_dtype, n, multiplier);
}

float abs_max_row(const void* src, DType src_dtype, std::int64_t n) {
  return HWY_DYNAMIC_DISPATCH(AbsMaxRow)(src, src_dtype, n);
}
}  // namespace pagedattn::kernels
#endif
