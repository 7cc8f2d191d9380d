// Which measured compute peak a run of the attention kernel is a fraction of:
// the peak of the instruction class that its inner products (QK^T and PV)
// execute, at the vector width it computes on. The class follows the product
// paths the kernel chose for the call (kernels::product_choice: allowed by
// the plan, present on the CPU and target, measured faster where the plan
// asks):
//   * prefill tiles on AMX (tdpbf16ps) or on vdpbf16ps;
//   * decode rows on AVX512-FP16 multiply-adds, vpdpbusd or vdpbf16ps;
//   * otherwise fp32 FMAs at min(the target's width, kKernelMaxF32Lanes)
//     lanes: zmm for 16, ymm for 8; targets below AVX2 have no FMA: SSE
//     multiply + add.
// The kKernel* constants and the *_dims predicates describe the kernel in
// src/kernels/cpu for the tests that predict its paths, and must change with it.
#pragma once

#include "kernels/cpu/attention_cpu.h"
#include "machine_probes.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/dtype.h"

namespace pagedattn::bench {

// The kernel's inner products (prefill QK outer products, PV, masks and the
// softmax) run on the target's full width: 16 lanes on AVX-512.
inline constexpr int kKernelMaxF32Lanes = 16;
inline constexpr bool kKernelUsesBf16Dot = true;
inline constexpr bool kKernelUsesInt8Dot = true;
inline constexpr bool kKernelUsesAmx = true;
// e4m3 and f16 decode with f16 products allowed, on an AVX-512 target with
// AVX512-FP16 (attention_f16_decode_dims): vfmadd...ph on 32 f16 lanes.
inline constexpr bool kKernelUsesF16Decode = true;

// The extensions of `used` (dispatched_features()) the kernel does use: the
// dot-product ones only where it has those paths.
inline CpuFeatures attention_kernel_features(CpuFeatures used) {
  used.avx512_bf16 = used.avx512_bf16 && kKernelUsesBf16Dot;
  used.avx512_vnni = used.avx512_vnni && kKernelUsesInt8Dot;
  used.amx_bf16 = used.amx_bf16 && used.avx512_bf16 && kKernelUsesAmx;
  return used;
}

// fp32 lanes per vector the kernel computes on at the target of `used`
// (0: Highway's portable C++ fallback).
inline int attention_kernel_lanes(const CpuFeatures& used) {
  const int target_lanes = used.avx512f ? 16 : used.avx2 ? 8 : used.sse4_2 ? 4 : 0;
  return target_lanes < kKernelMaxF32Lanes ? target_lanes : kKernelMaxF32Lanes;
}

// Whether head dims suit the f16 decode path (kernels::f16_decode_dims).
inline constexpr bool attention_f16_decode_dims(int head_dim, int v_head_dim) {
  return head_dim > 0 && head_dim % 32 == 0 && head_dim <= 256 && v_head_dim > 0 &&
         v_head_dim % 32 == 0;
}

// Whether head dim `head_dim` (K and V alike) suits the int8 dot-product path.
inline constexpr bool attention_int8_dot_dims(int head_dim) {
  return head_dim > 0 && head_dim % 64 == 0;
}

// prefill: the call's rows per KV head take the outer-product tiles (more
// than 8); else the decode rows. `used` as pagedattn::dispatched_features().
// Decode takes the f16 path before the int8 and bf16 ones where the kernel
// has several for the KV type (e4m3), as ProcessHeadBlock does.
inline PeakClass attention_peak_class(const kernels::ProductChoice& paths, bool prefill,
                                      const CpuFeatures& used) {
  if (prefill && paths.amx_bf16) return PeakClass::kBf16Amx;
  if (prefill && paths.bf16_dot) return PeakClass::kBf16DotZmm;
  if (!prefill && paths.f16_decode) return PeakClass::kF16FmaZmm;
  if (!prefill && paths.int8_dot) return PeakClass::kInt8DotZmm;
  if (!prefill && paths.bf16_decode) return PeakClass::kBf16DotZmm;
  if (used.avx512f && kKernelMaxF32Lanes >= 16) return PeakClass::kFp32FmaZmm;
  if (used.avx2 && used.fma) return PeakClass::kFp32FmaYmm;
  return PeakClass::kFp32MulAddXmm;
}

}  // namespace pagedattn::bench
