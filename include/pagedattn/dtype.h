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
};

// Bytes per element.
constexpr std::size_t dtype_size(DType t) noexcept {
  switch (t) {
    case DType::kF32:
      return 4;
    case DType::kF16:
    case DType::kBF16:
      return 2;
  }
  return 0;
}

// "float32", "float16", "bfloat16".
std::string_view dtype_name(DType t) noexcept;

// Parses the names above (and "f32", "f16", "bf16"); throws InvalidArgument.
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

inline float f16_bits_to_float(std::uint16_t bits) noexcept {
  return static_cast<float>(std::bit_cast<_Float16>(bits));
}

inline std::uint16_t float_to_f16_bits(float value) noexcept {
  return std::bit_cast<std::uint16_t>(static_cast<_Float16>(value));
}

// Reads element `index` of a buffer of type `t` as float.
inline float load_as_float(const void* data, DType t, std::size_t index) noexcept {
  switch (t) {
    case DType::kF32:
      return static_cast<const float*>(data)[index];
    case DType::kF16:
      return f16_bits_to_float(static_cast<const std::uint16_t*>(data)[index]);
    case DType::kBF16:
      return bf16_bits_to_float(static_cast<const std::uint16_t*>(data)[index]);
  }
  return 0.0f;
}

// Writes `value` (rounded to nearest even) as element `index` of type `t`.
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
  }
}

}  // namespace pagedattn
