// Which measured compute peak a run of the attention kernel is a fraction of.
//
// The rule: the peak of the instruction class that the dispatched kernel's
// inner products (QK^T and PV) execute, at the vector width it computes on.
//   * fp32 FMAs at min(the target's width, kKernelMaxF32Lanes) lanes: zmm for
//     16, ymm for 8; targets below AVX2 have no FMA: SSE multiply + add;
//   * bf16 products allowed, on an AVX-512 target with AVX512-BF16, when the
//     kernel does its products with vdpbf16ps (kKernelUsesBf16Dot): prefill
//     (more than 8 query rows per KV head) over KV of 16 bits or fewer, and
//     decode over the KV types kernel_bf16_decode names (bf16, f16, fp8) on
//     CPUs without AMX (there, decode keeps f32 FMAs): the vdpbf16ps peak;
//   * the same prefill on a CPU with AMX-BF16 and head dims that are
//     multiples of 32, when the kernel does those products on AMX tiles
//     (kKernelUsesAmx): the tdpbf16ps tile peak;
//   * decode (at most 8 query rows per KV head) over int8 KV with int8
//     products allowed and head dims that are multiples of 64, on an AVX-512
//     target with AVX512-VNNI, when the kernel does its products with
//     vpdpbusd (kKernelUsesInt8Dot): the vpdpbusd peak;
//   * decode over fp8 e4m3 or f16 KV with f16 products allowed and head dims that
//     are multiples of 32 up to 256, on an AVX-512 target with AVX512-FP16
//     (kKernelUsesF16Decode): the vfmadd231ph peak.
// The five kKernel* constants describe the kernel in src/kernels/cpu and
// must change with it.
#pragma once

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

// Whether head dim `head_dim` suits the AMX tile path (bf16 prefill).
inline constexpr bool attention_amx_dims(int head_dim) {
  return head_dim > 0 && head_dim % 32 == 0;
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

// KV types whose decode rows (at most 8 query rows per KV head, no inline
// key RoPE) run on vdpbf16ps when bf16 products are allowed.
inline constexpr bool kernel_bf16_decode(DType kv) {
  return kv == DType::kBF16 || kv == DType::kF16 || kv == DType::kFP8E4M3 || kv == DType::kFP8E5M2;
}

// What of an attention call decides the instruction class of its products.
struct AttentionCallKind {
  DType kv = DType::kF16;
  bool prefill = false;        // more than 8 query rows (tokens x group) per KV head
  bool bf16_products = false;  // AttentionPlanOptions::bf16_products
  bool int8_products = false;  // AttentionPlanOptions::int8_products
  bool f16_products = false;   // AttentionPlanOptions::f16_products
  int head_dim = 128;          // K and V alike
};

// `used` as pagedattn::dispatched_features().
inline PeakClass attention_peak_class(const AttentionCallKind& call, const CpuFeatures& used) {
  const bool avx512 = used.avx512f;
  const DType kv = call.kv;
  const bool bf16_kv = call.prefill ? kv != DType::kF32 : kernel_bf16_decode(kv);
  // Decode keeps f32 FMAs without AVX512-VBMI (kernels::bf16_decode_kernel),
  // and where bf16 products timed slower (kernels::choose_products), which
  // this header-only mirror takes to be the CPUs with AMX; a CPU that times
  // them slower elsewhere (Zen 5 over bf16 KV) gets this class wrongly.
  const bool bf16_dot_here =
      call.prefill || (!(kKernelUsesAmx && used.amx_bf16) && used.avx512_vbmi);
  if (avx512 && call.bf16_products && bf16_kv && kKernelUsesBf16Dot && used.avx512_bf16 &&
      bf16_dot_here) {
    if (call.prefill && kKernelUsesAmx && used.amx_bf16 && attention_amx_dims(call.head_dim))
      return PeakClass::kBf16Amx;
    return PeakClass::kBf16DotZmm;
  }
  if (avx512 && !call.prefill && call.int8_products && kv == DType::kINT8 &&
      attention_int8_dot_dims(call.head_dim) && kKernelUsesInt8Dot && used.avx512_vnni)
    return PeakClass::kInt8DotZmm;
  if (avx512 && !call.prefill && call.f16_products &&
      (kv == DType::kFP8E4M3 || kv == DType::kF16) &&
      attention_f16_decode_dims(call.head_dim, call.head_dim) && kKernelUsesF16Decode &&
      used.avx512_fp16)
    return PeakClass::kF16FmaZmm;
  if (avx512 && kKernelMaxF32Lanes >= 16) return PeakClass::kFp32FmaZmm;
  if (used.avx2 && used.fma) return PeakClass::kFp32FmaYmm;
  return PeakClass::kFp32MulAddXmm;
}

}  // namespace pagedattn::bench
