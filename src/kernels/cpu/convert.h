// Vectorised row conversion between the activation and storage dtypes.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::kernels {

// dst[i] = round(src[i] * multiplier) in dst_dtype, i < n. Round to nearest
// even; fp8 and int8 saturate (int8 to [-127, 127]). multiplier == 1 and equal
// dtypes copy bits.
void convert_row(const void* src, DType src_dtype, void* dst, DType dst_dtype, std::int64_t n,
                 float multiplier);

// Whether any of the n >= 0 bytes is an e4m3 NaN code (S.1111.111): the
// attention kernel's check of a block (kernel code calls the per-target
// inline HasE4M3Nan directly), and the writers' of a row (page_may_hold_nan).
bool e4m3_has_nan(const void* src, std::int64_t n);
// The attention kernel's fp8 e4m3 decode step (kernel code calls LoadConvert
// directly), for the tests; n a non-negative multiple of 8 (else
// InvalidArgument, dst untouched).
// The bytes as f32 of value x 2^-8 (exact) without the NaN select: what the
// decode loops compute for blocks in which e4m3_has_nan found no NaN code.
void e4m3_to_f32_nan_free(const void* src, float* dst, std::int64_t n);

// Where the bf16 dot-product decode puts two fp8 rows a, b converted to bf16
// (two vectors of 32 words per 32 elements): V as interleaved pairs (a[i],
// b[i]) in element order for PV, K in 8-element blocks [A0 A2 | B0 B2], [A1 A3
// | B1 B3] for QK.
enum class Fp8PairOrder { kValues, kKeys };

// fp8 bytes (e4m3 or e5m2) of two rows to bf16 bits, exactly, as the bf16
// dot-product decode converts them (byte tables, AVX-512 targets on CPUs with
// AVX512-VBMI) in `order`, put back in element order: dst[i] = bf16(a[i]) |
// bf16(b[i]) << 16. e4m3 as value x 2^-8 (as above), e5m2 as its value; NaN
// to a bf16 NaN of the same sign, e5m2 infinities to bf16 infinities. n a
// non-negative multiple of 8 (else InvalidArgument, dst untouched); returns
// false (dst untouched) where the dispatched target or the CPU has none.
bool fp8_pairs_to_bf16_bits(const void* a, const void* b, DType src_dtype, Fp8PairOrder order,
                            std::uint32_t* dst, std::int64_t n);

// max |src[i]| over i < n (src in an activation dtype).
float abs_max_row(const void* src, DType src_dtype, std::int64_t n);

}  // namespace pagedattn::kernels
