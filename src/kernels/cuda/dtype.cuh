// Element conversions on the device, bit-identical to the host ones in
// pagedattn/dtype.h: every stored K/V code converts exactly to f32 (and, for
// f16 / fp8 / int8, to f16; bf16 / int8 to bf16), and f32 rounds to f16 /
// bf16 to nearest even.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda::detail {

// fp8 e4m3fn: no infinities, S.1111.111 is NaN, max 448, subnormals 2^-9 steps.
__device__ __forceinline__ float e4m3_to_float(std::uint8_t code) {
  const std::uint32_t sign = static_cast<std::uint32_t>(code & 0x80u) << 24;
  const std::uint32_t exp = (code >> 3) & 0xfu, man = code & 0x7u;
  if (exp == 0xfu && man == 0x7u) return __uint_as_float(sign | 0x7fc00000u);
  if (exp == 0) {  // subnormal: man x 2^-9
    const float v = static_cast<float>(man) * 0.001953125f;
    return sign ? -v : v;
  }
  return __uint_as_float(sign | ((exp + 120u) << 23) | (man << 20));
}

// fp8 e5m2: the top byte of an IEEE binary16.
__device__ __forceinline__ float e5m2_to_float(std::uint8_t code) {
  return __half2float(__ushort_as_half(static_cast<unsigned short>(code << 8)));
}

// Any K/V, query or output element as f32.
template <DType kType>
__device__ __forceinline__ float load_float(const void* base, std::int64_t index) {
  if constexpr (kType == DType::kF32) {
    return static_cast<const float*>(base)[index];
  } else if constexpr (kType == DType::kF16) {
    return __half2float(static_cast<const __half*>(base)[index]);
  } else if constexpr (kType == DType::kBF16) {
    return __bfloat162float(static_cast<const __nv_bfloat16*>(base)[index]);
  } else if constexpr (kType == DType::kFP8E4M3) {
    return e4m3_to_float(static_cast<const std::uint8_t*>(base)[index]);
  } else if constexpr (kType == DType::kFP8E5M2) {
    return e5m2_to_float(static_cast<const std::uint8_t*>(base)[index]);
  } else {
    return static_cast<float>(static_cast<const std::int8_t*>(base)[index]);
  }
}

// An activation (f32, f16, bf16) chosen at run time: queries and outputs
// arrive in any of the three, and branching per element costs nothing next
// to the K/V stream.
__device__ __forceinline__ float load_activation(const void* base, DType type, std::int64_t index) {
  switch (type) {
    case DType::kF16:
      return load_float<DType::kF16>(base, index);
    case DType::kBF16:
      return load_float<DType::kBF16>(base, index);
    default:
      return load_float<DType::kF32>(base, index);
  }
}

// Stores f32 as f32, f16 or bf16 (round to nearest even; NaN stays NaN).
__device__ __forceinline__ void store_activation(void* base, DType type, std::int64_t index,
                                                 float value) {
  switch (type) {
    case DType::kF16:
      static_cast<__half*>(base)[index] = __float2half_rn(value);
      return;
    case DType::kBF16:
      static_cast<__nv_bfloat16*>(base)[index] = __float2bfloat16_rn(value);
      return;
    default:
      static_cast<float*>(base)[index] = value;
  }
}

}  // namespace pagedattn::cuda::detail
