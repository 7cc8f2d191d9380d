// Sums (or maxima) of 16 vectors of 16 f32 lanes at once, for the decode
// score tiles of the f32 and bf16-dot kernels and the AMX path's softmax
// (Highway -inl.h pattern; AVX-512 targets only: raw intrinsics, as Highway
// 1.0.3 has no shuffle across 128-bit blocks).
#if defined(PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_
#undef PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_
#endif

#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
// Reductions of 16 vectors: lane i of the result is op over the lanes of
// a[i] (pairwise interleave-ops: 30 shuffles and 15 ops for 16 rows).
template <class Op>
HWY_INLINE __m512 Reduce16(const __m512* a, Op op) {
  __m512 t[8], u[4];
  for (int i = 0; i < 8; ++i)  // per 128-bit block: [a0 op a2, b0 op b2, a1 op a3, b1 op b3]
    t[i] = op(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < 4; ++i) {  // per block: the block's partial result of a[4i .. 4i + 3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] = op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
  // Blocks combined across: block i of the result holds a[4i .. 4i + 3].
  const __m512 v01 = op(_mm512_shuffle_f32x4(u[0], u[1], 0x88), _mm512_shuffle_f32x4(u[0], u[1], 0xDD));
  const __m512 v23 = op(_mm512_shuffle_f32x4(u[2], u[3], 0x88), _mm512_shuffle_f32x4(u[2], u[3], 0xDD));
  return op(_mm512_shuffle_f32x4(v01, v23, 0x88), _mm512_shuffle_f32x4(v01, v23, 0xDD));
}

// Sums of 16 vectors (16 dot products at once).
HWY_INLINE __m512 Reduce16(const __m512* a) {
  return Reduce16(a, [](__m512 x, __m512 y) { return _mm512_add_ps(x, y); });
}

// Maxima of 16 vectors.
HWY_INLINE __m512 ReduceMax16(const __m512* a) {
  return Reduce16(a, [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); });
}
#endif

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_
