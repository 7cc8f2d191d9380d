// Element types for K/V storage, queries and outputs, with exact scalar
// conversions (round to nearest even) used by references and debug access.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string_view>

namespace pagedattn {

enum class DType : std::uint8_t {
  kF32 = 0,
  kF16 = 1,
  kBF16 = 2,
  kFP8E4M3 = 3,  // float8_e4m3fn: no infinities, max 448, NaN = 0x7f / 0xff
  kFP8E5M2 = 4,  // float8_e5m2: IEEE-like, max 57344
  kINT8 = 5,     // symmetric int8 with a scale kept beside the data
};

// Bytes per element.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
    case DType::kFP8E4M3:
    case DType::kFP8E5M2:
    case DType::kINT8:
      return 1;
  }
  return 0;
}

// Types queries, outputs and new K/V arrive in (f32, f16, bf16).
constexpr bool is_activation_dtype(DType t) noexcept {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16;
}

constexpr bool is_fp8(DType t) noexcept {
  return t == DType::kFP8E4M3 || t == DType::kFP8E5M2;
}

// Storage types that need a dequantisation scale (fp8: per tensor or head;
// int8: per token and head).
constexpr bool is_quantized(DType t) noexcept {
  return is_fp8(t) || t == DType::kINT8;
}

// "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int8".
std::string_view dtype_name(DType t) noexcept;

// Parses the names above (and "f32", "f16", "bf16", "fp8_e4m3", "fp8_e5m2");
// throws InvalidArgument.
DType parse_dtype(std::string_view name);

// --- scalar conversions -----------------------------------------------------

inline float bf16_bits_to_float(std::uint16_t bits) noexcept {
  return std::bit_cast<float>(static_cast<std::uint32_t>(bits) << 16);
}

// Round to nearest even; NaN stays NaN (quiet), infinities stay infinite.
inline std::uint16_t float_to_bf16_bits(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  if ((bits & 0x7fffffffu) > 0x7f800000u) return static_cast<std::uint16_t>((bits >> 16) | 0x40u);
  const std::uint32_t rounding = 0x7fffu + ((bits >> 16) & 1u);
  return static_cast<std::uint16_t>((bits + rounding) >> 16);
}

namespace detail {

// Integer-only IEEE binary16 conversions for compilers without _Float16 (clang
// before 15 on x86). Bit-identical to the _Float16 casts, NaN payloads included
// (quiet bit set); tests/unit/dtype_test.cc compares the two exhaustively.
inline float f16_bits_to_float_portable(std::uint16_t bits) noexcept {
  const std::uint32_t sign = static_cast<std::uint32_t>(bits & 0x8000u) << 16;
  const std::uint32_t exp = (bits >> 10) & 0x1fu;
  const std::uint32_t mant = bits & 0x3ffu;
  if (exp == 0x1f) {  // infinity, or NaN made quiet
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(sign | std::bit_cast<std::uint32_t>(magnitude));
  }
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// Round to nearest even; overflow goes to infinity, NaN stays NaN (quiet).
inline std::uint16_t float_to_f16_bits_portable(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint16_t>((bits >> 16) & 0x8000u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) {
    return static_cast<std::uint16_t>(sign | 0x7e00u | ((abs_bits >> 13) & 0x3ffu));
  }
  if (abs_bits >= 0x477ff000u) return static_cast<std::uint16_t>(sign | 0x7c00u);  // >= 65520
  if (abs_bits >= 0x38800000u) {  // normal binary16 (>= 2^-14): drop 13 mantissa bits
    const std::uint32_t rounded = (abs_bits + 0xfffu + ((abs_bits >> 13) & 1u)) >> 13;
    return static_cast<std::uint16_t>(sign | (rounded - (112u << 10)));
  }
  const std::uint32_t exp = abs_bits >> 23;
  if (exp < 102) return sign;  // below 2^-25: rounds to zero
  // Subnormal result: round (mant * 2^(exp - 150)) / 2^-24 to an integer.
  const std::uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;
  const std::uint32_t shift = 126u - exp;  // 14 .. 24
  std::uint32_t result = mant >> shift;
  const std::uint32_t rest = mant & ((1u << shift) - 1u);
  const std::uint32_t half = 1u << (shift - 1u);
  if (rest > half || (rest == half && (result & 1u) != 0)) ++result;
  return static_cast<std::uint16_t>(sign | result);
}

}  // namespace detail

// _Float16 only where the compiler has it (GCC 12, clang >= 15 define
// __FLT16_MANT_DIG__ then); the public headers must compile everywhere.
#if defined(__FLT16_MANT_DIG__)
#define PAGEDATTN_HAS_FLOAT16 1
#else
#define PAGEDATTN_HAS_FLOAT16 0
#endif

inline float f16_bits_to_float(std::uint16_t bits) noexcept {
#if PAGEDATTN_HAS_FLOAT16
  return static_cast<float>(std::bit_cast<_Float16>(bits));
#else
  return detail::f16_bits_to_float_portable(bits);
#endif
}

inline std::uint16_t float_to_f16_bits(float value) noexcept {
#if PAGEDATTN_HAS_FLOAT16
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
#else
  return detail::float_to_f16_bits_portable(value);
#endif
}

// --- fp8 (OCP formats) -------------------------------------------------------
namespace detail {

// Decodes an 8-bit float with `kMant` mantissa bits and exponent bias `kBias`.
// `kHasInf`: e5m2 (all-ones exponent is inf/NaN); else e4m3fn (only S.1111.111 is NaN).
template <int kMant, int kBias, bool kHasInf>
inline float fp8_to_float(std::uint8_t v) noexcept {
  const bool negative = (v & 0x80u) != 0;
  const int exp = (v & 0x7fu) >> kMant;
  const int mant = v & ((1 << kMant) - 1);
  constexpr int kMaxExp = (1 << (7 - kMant)) - 1;
  float magnitude;
  if (kHasInf && exp == kMaxExp) {
    magnitude = mant == 0 ? __builtin_inff() : __builtin_nanf("");
  } else if (!kHasInf && exp == kMaxExp && mant == (1 << kMant) - 1) {
    magnitude = __builtin_nanf("");
  } else if (exp == 0) {
    magnitude = __builtin_ldexpf(static_cast<float>(mant), 1 - kBias - kMant);
  } else {
    magnitude = __builtin_ldexpf(static_cast<float>(mant + (1 << kMant)), exp - kBias - kMant);
  }
  return negative ? -magnitude : magnitude;
}

// Encodes with round to nearest even, saturating to +-max finite (the
// convention of KV-cache quantisation); NaN stays NaN.
template <int kMant, int kBias, std::uint8_t kMaxCode, std::uint8_t kNanCode>
inline std::uint8_t float_to_fp8(float value) noexcept {
  const std::uint32_t bits = std::bit_cast<std::uint32_t>(value);
  const auto sign = static_cast<std::uint8_t>((bits >> 24) & 0x80u);
  const std::uint32_t abs_bits = bits & 0x7fffffffu;
  if (abs_bits > 0x7f800000u) return sign | kNanCode;
  const float a = std::bit_cast<float>(abs_bits);
  const float min_normal = __builtin_ldexpf(1.0f, 1 - kBias);
  std::uint32_t code;
  if (a < min_normal) {
    // Subnormal: multiples of 2^(1 - bias - mant); rint rounds to nearest even.
    code = static_cast<std::uint32_t>(__builtin_rintf(__builtin_ldexpf(a, kBias - 1 + kMant)));
  } else {
    constexpr int kShift = 23 - kMant;
    const std::uint32_t rounded =
        (abs_bits + (1u << (kShift - 1)) - 1u + ((abs_bits >> kShift) & 1u)) >> kShift;
    code = rounded - (static_cast<std::uint32_t>(127 - kBias) << kMant);
  }
  return sign | static_cast<std::uint8_t>(code > kMaxCode ? kMaxCode : code);
}

}  // namespace detail

inline float fp8_e4m3_to_float(std::uint8_t v) noexcept {
  return detail::fp8_to_float<3, 7, false>(v);
}
inline std::uint8_t float_to_fp8_e4m3(float value) noexcept {
  return detail::float_to_fp8<3, 7, 0x7e, 0x7f>(value);
}
inline float fp8_e5m2_to_float(std::uint8_t v) noexcept {
  return detail::fp8_to_float<2, 15, true>(v);
}
inline std::uint8_t float_to_fp8_e5m2(float value) noexcept {
  return detail::float_to_fp8<2, 15, 0x7b, 0x7e>(value);
}

// Largest finite value of a storage type (127 for int8).
constexpr float dtype_max_finite(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return 3.40282347e38f;
    case DType::kF16:
      return 65504.0f;
    case DType::kBF16:
      return 3.38953139e38f;
    case DType::kFP8E4M3:
      return 448.0f;
    case DType::kFP8E5M2:
      return 57344.0f;
    case DType::kINT8:
      return 127.0f;
  }
  return 0.0f;
}

// int8: round to nearest even, clamp to [-127, 127] (symmetric); NaN -> 0.
inline std::int8_t float_to_int8(float value) noexcept {
  if (!(value == value)) return 0;
  const float r = __builtin_rintf(value);
  return static_cast<std::int8_t>(r > 127.0f ? 127.0f : (r < -127.0f ? -127.0f : r));
}

// Reads element `index` of a buffer of type `t` as float (quantised types
// without their scale).
inline float load_as_float(const void* data, DType t, std::size_t index) noexcept {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kF16:
      return f16_bits_to_float(static_cast<const std::uint16_t*>(data)[index]);
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const std::uint16_t*>(data)[index]);
    case DType::kFP8E4M3:
      return fp8_e4m3_to_float(static_cast<const std::uint8_t*>(data)[index]);
    case DType::kFP8E5M2:
      return fp8_e5m2_to_float(static_cast<const std::uint8_t*>(data)[index]);
    case DType::kINT8:
      return static_cast<float>(static_cast<const std::int8_t*>(data)[index]);
  }
  return 0.0f;
}

// Writes `value` (rounded to nearest even; fp8 and int8 saturate) as element
// `index` of type `t` (quantised types without their scale).
inline void store_from_float(void* data, DType t, std::size_t index, float value) noexcept {
  switch (t) {
    case DType::kF32:
      static_cast<float*>(data)[index] = value;
      return;
    case DType::kF16:
      static_cast<std::uint16_t*>(data)[index] = float_to_f16_bits(value);
      return;
    case DType::kBF16:
      static_cast<std::uint16_t*>(data)[index] = float_to_bf16_bits(value);
      return;
    case DType::kFP8E4M3:
      static_cast<std::uint8_t*>(data)[index] = float_to_fp8_e4m3(value);
      return;
    case DType::kFP8E5M2:
      static_cast<std::uint8_t*>(data)[index] = float_to_fp8_e5m2(value);
      return;
    case DType::kINT8:
      static_cast<std::int8_t*>(data)[index] = float_to_int8(value);
      return;
  }
}

}  // namespace pagedattn
