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
// The op of the sums below.
struct AddLanes {
  HWY_INLINE __m512 operator()(__m512 x, __m512 y) const { return _mm512_add_ps(x, y); }
};

// The tree's first two levels, within 128-bit blocks: u[i] (i < kN / 4)
// lane 4k + l = op over block k of a[4i + l] (kN a multiple of 4).
template <int kN, class Op>
HWY_INLINE void ReduceWithinBlocks(const __m512* a, Op op, __m512* u) {
  static_assert(kN % 4 == 0, "groups of four vectors");
  __m512 t[kN / 2];
  for (int i = 0; i < kN / 2; ++i)  // per 128-bit block: [a0 op a2, b0 op b2, a1 op a3, b1 op b3]
    t[i] =
        op(_mm512_unpacklo_ps(a[2 * i], a[2 * i + 1]), _mm512_unpackhi_ps(a[2 * i], a[2 * i + 1]));
  for (int i = 0; i < kN / 4; ++i) {  // per block: the block's partial result of a[4i .. 4i + 3]
    const __m512d x = _mm512_castps_pd(t[2 * i]), y = _mm512_castps_pd(t[2 * i + 1]);
    u[i] =
        op(_mm512_castpd_ps(_mm512_unpacklo_pd(x, y)), _mm512_castpd_ps(_mm512_unpackhi_pd(x, y)));
  }
}

// Reductions of kN vectors (4, 8 or 16): lane i (i < kN) of the result is
// op over the lanes of a[i] (pairwise interleave-ops: 30 shuffles and 15 ops
// for 16 rows, 16 and 9 for 8, 10 and 5 for 4; lanes kN and up: don't
// care). Fewer rows fold their blocks onto themselves in the same order,
// (0 + 1) + (2 + 3), so a row's sum has the same bits whichever tree its
// rows took (batch invariance).
template <int kN, class Op>
HWY_INLINE __m512 ReduceN(const __m512* a, Op op) {
  static_assert(kN == 4 || kN == 8 || kN == 16, "whole levels of the tree");
  __m512 u[kN / 4];
  ReduceWithinBlocks<kN>(a, op, u);
  // Blocks combined across: block i of the result holds a[4i .. 4i + 3]
  // (u and v past the rows: the last ones again).
  auto pairs = [&](__m512 x, __m512 y) {
    return op(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
  };
  const __m512 v01 = pairs(u[0], u[kN > 4 ? 1 : 0]);
  if constexpr (kN == 16) return pairs(v01, pairs(u[2], u[3]));
  return pairs(v01, v01);
}

// ReduceN of 16 vectors.
template <class Op>
HWY_INLINE __m512 Reduce16(const __m512* a, Op op) {
  return ReduceN<16>(a, op);
}

// A block's scores from tile vectors to row vectors. tiles[t] (t < 2 kRows):
// lane r * kKeys + e = row r, key t * kKeys + e (kKeys = 16 / kRows), what
// Reduce16 leaves for the tile of keys from t * kKeys; rows[2r + h]: row r's
// keys 16h .. 16h + 15. Whole-vector stores of the rows let the softmax load
// them at once (a load over several masked or narrower stores waits for them
// to reach the cache).
template <int kRows>
HWY_INLINE void TilesToRows(const __m512* tiles, __m512* rows) {
  static_assert(kRows == 1 || kRows == 2 || kRows == 4 || kRows == 8, "16 / kRows keys a tile");
  if constexpr (kRows == 1) {
    rows[0] = tiles[0];
    rows[1] = tiles[1];
  } else if constexpr (kRows == 2) {  // row r: 256-bit half r of two tiles
    for (int h = 0; h < 2; ++h) {
      rows[h] = _mm512_shuffle_f32x4(tiles[2 * h], tiles[2 * h + 1], 0x44);
      rows[2 + h] = _mm512_shuffle_f32x4(tiles[2 * h], tiles[2 * h + 1], 0xEE);
    }
  } else if constexpr (kRows == 4) {  // row r: 128-bit block r of four tiles
    for (int h = 0; h < 2; ++h) {
      const __m512* t = tiles + 4 * h;
      const __m512 u0 = _mm512_shuffle_f32x4(t[0], t[1], 0x44),
                   u1 = _mm512_shuffle_f32x4(t[0], t[1], 0xEE);
      const __m512 u2 = _mm512_shuffle_f32x4(t[2], t[3], 0x44),
                   u3 = _mm512_shuffle_f32x4(t[2], t[3], 0xEE);
      rows[0 + h] = _mm512_shuffle_f32x4(u0, u2, 0x88);
      rows[2 + h] = _mm512_shuffle_f32x4(u0, u2, 0xDD);
      rows[4 + h] = _mm512_shuffle_f32x4(u1, u3, 0x88);
      rows[6 + h] = _mm512_shuffle_f32x4(u1, u3, 0xDD);
    }
  } else {  // row r: 64-bit element r of eight tiles (an 8 x 8 transpose)
    for (int h = 0; h < 2; ++h) {
      __m512d a[8], b[8];
      for (int i = 0; i < 8; ++i) a[i] = _mm512_castps_pd(tiles[8 * h + i]);
      for (int k = 0; k < 4; ++k) {  // block c: [x2k.q(2c), x2k+1.q(2c)] and the odd elements
        b[2 * k] = _mm512_unpacklo_pd(a[2 * k], a[2 * k + 1]);
        b[2 * k + 1] = _mm512_unpackhi_pd(a[2 * k], a[2 * k + 1]);
      }
      for (int i = 0; i < 4; ++i) {  // pairs (0, 2), (1, 3), (4, 6), (5, 7)
        const int j = i + (i & 2);
        a[j] = _mm512_shuffle_f64x2(b[j], b[j + 2], 0x88);
        a[j + 2] = _mm512_shuffle_f64x2(b[j], b[j + 2], 0xDD);
      }
      for (int j = 0; j < 4; ++j) {
        b[j] = _mm512_shuffle_f64x2(a[j], a[j + 4], 0x88);
        b[j + 4] = _mm512_shuffle_f64x2(a[j], a[j + 4], 0xDD);
      }
      for (int r = 0; r < 8; ++r) rows[2 * r + h] = _mm512_castpd_ps(b[r]);
    }
  }
}

// Sums of 16 vectors (16 dot products at once).
HWY_INLINE __m512 Reduce16(const __m512* a) {
  return Reduce16(a, AddLanes());
}

#endif

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_REDUCE16_INL_H_
