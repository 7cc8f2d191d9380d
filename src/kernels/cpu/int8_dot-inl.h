// The decode micro-kernels for int8 KV on AVX512-VNNI dot products
// (vpdpbusd: 16 int32 lanes, each += the dot product of 4 unsigned bytes
// with 4 signed bytes), per target (Highway -inl.h pattern). Highway 1.0.3
// has no such op, so these are raw intrinsics, compiled only on the AVX-512
// targets (PAGEDATTN_INT8_DOT_TARGET) and run only when the CPU reports
// avx512_vnni (KernelContext::int8_dot). Head dims are multiples of 64
// (whole 512-bit rows of int8); other dims keep the f32 path.
//
// Layouts (dwords = 4 bytes, the unit the instruction reduces over):
//   queries  [rows][dq] int8, per row absmax / 127, with the row's scale and
//            the sum of its int8 elements;
//   keys     [dim / 4][kKB] dwords, stored K xor 0x80 (= K + 128, unsigned):
//            dword p of every key of the block, so QK is an outer product (a
//            query dword broadcast against 16 keys) and needs no reduction;
//            the +128 is removed per row as 128 x the query's sum;
//   weights  [rows][kKB] u8 in place of the f32 scores' first 32 bytes: each
//            row's block of softmax weights (x the V token scale) against
//            its largest, w / wmax x 255 rounded, and wmax / 255 per row;
//   values   [kKB / 4][dim] dwords: dword d of key quad jq holds dim d of
//            keys 4jq .. 4jq + 3, so PV reduces over keys four at a time
//            (packed in registers where one tile of 4 rows or 1 covers the
//            head's rows, else once per block into scratch).
// Rounding: the queries to 8 bits per row and the weights to 8 bits per row
// and block (K and V are used as stored). Products and sums are exact in
// int32, then scaled in f32.
#ifndef PAGEDATTN_KERNELS_CPU_INT8_DOT_MACROS_
#define PAGEDATTN_KERNELS_CPU_INT8_DOT_MACROS_
// True in the per-target pass of a target that compiles the int8 kernels.
// The same AVX-512 targets as the bf16 kernels (bf16_dot-inl.h, included below).
#define PAGEDATTN_INT8_DOT_TARGET PAGEDATTN_BF16_DOT_TARGET
// The target's extensions plus AVX512-VNNI (functions with it are called,
// never inlined, from code without it).
#define PAGEDATTN_INT8_ATTR __attribute__((target(HWY_TARGET_STR ",avx512vnni")))
#endif

#if defined(PAGEDATTN_KERNELS_CPU_INT8_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_INT8_DOT_INL_H_
#undef PAGEDATTN_KERNELS_CPU_INT8_DOT_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_INT8_DOT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <limits>

#include "kernels/attention_traits.h"
#include "kernels/cpu/bf16_dot-inl.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/row_groups.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_INT8_DOT_TARGET

namespace int8dot {

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
static_assert(kKB == 32, "a block's scores are two 16-lane vectors, its keys 8 quads");
constexpr std::size_t kRowBytes = 64;  // one zmm of int8: the unit of every row

using bf16dot::Pinned;  // vectors shared by several dot products stay in registers

// acc + the dot products of the u8 quads of `a` with the s8 quads of `b`
// (vpdpbusd), in inline assembly: GCC 12's pattern for the intrinsic only
// takes registers 0-15 (those of AVX-VNNI's encoding), so a tile of 16
// accumulators was copied in and out of them, and spilled, every step.
HWY_INLINE __m512i Dpbusd(__m512i acc, __m512i a, __m512i b) {
  asm("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

HWY_INLINE __m512i LoadRow(const void* row, std::size_t byte) {
  return _mm512_loadu_si512(static_cast<const char*>(row) + byte);
}

// `rows` f32 rows of `dim` (stride `stride`) to int8 rows (same stride, in
// bytes) against each row's absmax / 127: scale[r] and the sum of the
// row's int8 elements (QK removes K's +128 offset with it).
PAGEDATTN_INT8_ATTR inline void QuantizeRows(const float* in, std::int32_t rows, std::size_t dim,
                                             std::size_t stride, std::int8_t* out, float* scale,
                                             std::int32_t* sum) {
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* x = in + std::size_t(r) * stride;
    std::int8_t* y = out + std::size_t(r) * stride;
    __m512 amax = _mm512_setzero_ps();
    for (std::size_t d = 0; d < dim; d += 16)
      amax = _mm512_max_ps(amax, _mm512_abs_ps(_mm512_loadu_ps(x + d)));
    const float a = _mm512_reduce_max_ps(amax);
    const __m512 inv = _mm512_set1_ps(a > 0.0f ? 127.0f / a : 0.0f);
    __m512i s = _mm512_setzero_si512();
    for (std::size_t d = 0; d < dim; d += 16) {
      const __m512i i =
          _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(x + d), inv));  // nearest even
      const __m128i b = _mm512_cvtsepi32_epi8(i);
      s = _mm512_add_epi32(s, _mm512_cvtepi8_epi32(b));
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + d), b);
    }
    scale[r] = a / 127.0f;
    sum[r] = _mm512_reduce_add_epi32(s);
  }
}

// Transposes 16 rows of 16 dwords: out[j] holds dword j of every row.
HWY_INLINE void Transpose16x16(const __m512i* in, __m512i* out) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16;
       i += 2) {  // lane L of a[i], a[i + 1]: rows i, i + 1 at dwords 4L .. 4L + 3, interleaved
    a[i] = _mm512_unpacklo_epi32(in[i], in[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(in[i], in[i + 1]);
  }
  for (int g = 0; g < 4; ++g) {  // b[4g + c] lane L: dword 4L + c of rows 4g .. 4g + 3
    const __m512i* x = a + 4 * g;
    b[4 * g + 0] = _mm512_unpacklo_epi64(x[0], x[2]);
    b[4 * g + 1] = _mm512_unpackhi_epi64(x[0], x[2]);
    b[4 * g + 2] = _mm512_unpacklo_epi64(x[1], x[3]);
    b[4 * g + 3] = _mm512_unpackhi_epi64(x[1], x[3]);
  }
  for (int c = 0; c < 4; ++c) {  // lane L of the row groups 0 .. 3 side by side: dword 4L + c
    const __m512i u0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x88),
                  u1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xDD);
    const __m512i u2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x88),
                  u3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xDD);
    out[c] = _mm512_shuffle_i32x4(u0, u2, 0x88);
    out[4 + c] = _mm512_shuffle_i32x4(u1, u3, 0x88);
    out[8 + c] = _mm512_shuffle_i32x4(u0, u2, 0xDD);
    out[12 + c] = _mm512_shuffle_i32x4(u1, u3, 0xDD);
  }
}

// Keys of a block (kKB int8 rows of `dim`) as unsigned dword columns
// [dim / 4][kKB].
PAGEDATTN_INT8_ATTR inline void PackKeys(const void* const* k, std::size_t dim,
                                         std::uint32_t* out) {
  const __m512i offset = _mm512_set1_epi8(static_cast<char>(0x80));
  for (std::int32_t j0 = 0; j0 < kKB; j0 += 16)
    for (std::size_t c = 0; c < dim; c += kRowBytes) {
      __m512i r[16], t[16];
      for (int i = 0; i < 16; ++i) r[i] = _mm512_xor_si512(LoadRow(k[j0 + i], c), offset);
      Transpose16x16(r, t);
      for (int p = 0; p < 16; ++p)
        _mm512_store_si512(out + (c / 4 + std::size_t(p)) * kKB + std::size_t(j0), t[p]);
    }
}

// Scores kRows rows x kKB keys: per query dword, a broadcast against the
// two vectors of key dwords; then (dot - 128 x sum(q)) x q_scale x k_scale to
// s. `next`: kKB rows of `dwords` x 4 bytes prefetched meanwhile, two lines
// per dword (the line of dword p of keys 2 (p mod 16) and the next; a branch
// here would cost GCC its register allocation of the accumulators).
template <int kRows>
HWY_INLINE PAGEDATTN_INT8_ATTR void ScoreRows(const std::int8_t* q, std::size_t dq,
                                              const float* q_scale, const std::int32_t* q_sum,
                                              const std::uint32_t* kt, std::size_t dwords,
                                              const float* k_scale, float* s,
                                              const void* const* next) {
  __m512i acc[kRows][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_si512();
  for (std::size_t p = 0; p < dwords; ++p) {
    const std::size_t j = 2 * (p % 16), line = p / 16 * kRowBytes;
    PrefetchToL2(static_cast<const char*>(next[j]) + line);
    PrefetchToL2(static_cast<const char*>(next[j + 1]) + line);
    const __m512i k0 = Pinned(_mm512_load_si512(kt + p * kKB));
    const __m512i k1 = Pinned(_mm512_load_si512(kt + p * kKB + 16));
    for (int r = 0; r < kRows; ++r) {
      std::int32_t word;
      __builtin_memcpy(&word, q + std::size_t(r) * dq + 4 * p, sizeof(word));
      const __m512i qb = _mm512_set1_epi32(word);
      acc[r][0] = Dpbusd(acc[r][0], k0, qb);
      acc[r][1] = Dpbusd(acc[r][1], k1, qb);
    }
  }
  const __m512 ks0 = _mm512_loadu_ps(k_scale), ks1 = _mm512_loadu_ps(k_scale + 16);
  for (int r = 0; r < kRows; ++r) {
    const __m512i offset = _mm512_set1_epi32(128 * q_sum[r]);
    const __m512 qs = _mm512_set1_ps(q_scale[r]);
    float* out = s + std::size_t(r) * kKB;
    _mm512_store_ps(
        out, _mm512_mul_ps(
                 _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][0], offset)), qs), ks0));
    _mm512_store_ps(
        out + 16,
        _mm512_mul_ps(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(acc[r][1], offset)), qs),
                      ks1));
  }
}

// Scores rows [row0, row_end) of the int8 queries (row stride dq) against
// the packed keys (head dim `dim`) into s, prefetching the K rows `next`
// (as long) meanwhile (again for a second group of rows: no cost to speak of).
template <int kDim>
PAGEDATTN_INT8_ATTR void ScoreBlock(const std::int8_t* q, std::size_t dq, const float* q_scale,
                                    const std::int32_t* q_sum, const std::uint32_t* kt,
                                    std::size_t dim, const float* k_scale, float* s,
                                    std::int32_t row0, std::int32_t row_end,
                                    const void* const* next) {
  const std::size_t dwords = kDim > 0 ? std::size_t(kDim) / 4 : dim / 4;
  RowGroups<8, 4, 2, 1>::VisitAll(
      row0, row_end, [&](auto group, std::int32_t r) PAGEDATTN_INT8_ATTR {
        ScoreRows<group()>(q + std::size_t(r) * dq, dq, q_scale + r, q_sum + r, kt, dwords, k_scale,
                           s + std::size_t(r) * kKB, next);
      });
}

// Each row's kKB f32 weights (>= 0: e x the V token scale, absmax / 127)
// to u8 against the row's largest, into the row's first kKB bytes;
// w_scale[row] = that largest / 255 (0 for a row with no weight, NaN for a
// row with a NaN weight - a NaN V token scale - so that its output is NaN).
PAGEDATTN_INT8_ATTR inline void QuantizeWeights(float* s, float* w_scale, std::int32_t row0,
                                                std::int32_t row_end) {
  for (std::int32_t r = row0; r < row_end; ++r) {
    float* x = s + std::size_t(r) * kKB;
    const __m512 w0 = _mm512_load_ps(x), w1 = _mm512_load_ps(x + 16);
    const bool nan = _mm512_cmp_ps_mask(w0, w1, _CMP_UNORD_Q) != 0;
    const float wmax = _mm512_reduce_max_ps(_mm512_max_ps(w0, w1));
    const __m512 f = _mm512_set1_ps(wmax > 0.0f ? 255.0f / wmax : 0.0f);
    const __m512i zero = _mm512_setzero_si512();
    const __m512i i0 = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w0, f)), zero);
    const __m512i i1 = _mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(w1, f)), zero);
    _mm_store_si128(reinterpret_cast<__m128i*>(x), _mm512_cvtusepi32_epi8(i0));
    _mm_store_si128(reinterpret_cast<__m128i*>(x + 4), _mm512_cvtusepi32_epi8(i1));
    w_scale[r] = nan ? std::numeric_limits<float>::quiet_NaN() : wmax > 0.0f ? wmax / 255.0f : 0.0f;
  }
}

// The values of 4 keys (rows `v`) at dims [byte, byte + 64) in a quad's
// layout: x[m] dword t holds dim byte + 16m + t of the 4 keys.
HWY_INLINE PAGEDATTN_INT8_ATTR void PackQuad(const void* const* v, std::size_t byte, __m512i* x) {
  // Dword 4i + m of a row <- dword 4m + i: lane i then holds dims 16m + 4i
  // .. 16m + 4i + 3 for m = 0 .. 3, so the in-lane byte and word
  // interleaves below leave dims 16m .. 16m + 15 in order in vector m.
  const __m512i idx = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  __m512i a[4];
  for (int i = 0; i < 4; ++i) a[i] = _mm512_permutexvar_epi32(idx, LoadRow(v[i], byte));
  const __m512i lo01 = _mm512_unpacklo_epi8(a[0], a[1]), hi01 = _mm512_unpackhi_epi8(a[0], a[1]);
  const __m512i lo23 = _mm512_unpacklo_epi8(a[2], a[3]), hi23 = _mm512_unpackhi_epi8(a[2], a[3]);
  x[0] = _mm512_unpacklo_epi16(lo01, lo23);
  x[1] = _mm512_unpackhi_epi16(lo01, lo23);
  x[2] = _mm512_unpacklo_epi16(hi01, hi23);
  x[3] = _mm512_unpackhi_epi16(hi01, hi23);
}

// Values of a block in key quads, [kKB / 4][dim] dwords.
PAGEDATTN_INT8_ATTR inline void PackValues(const void* const* v, std::size_t dim,
                                           std::uint32_t* out) {
  for (std::int32_t jq = 0; jq < kKB / 4; ++jq)
    for (std::size_t c = 0; c < dim; c += kRowBytes) {
      __m512i x[4];
      PackQuad(v + 4 * jq, c, x);
      for (int m = 0; m < 4; ++m)
        _mm512_store_si512(out + std::size_t(jq) * dim + c + 16 * m, x[m]);
    }
}

// o[kRows rows] += weights x V over the block's key quads for the 64 dims
// from d: kRows x 4 int32 accumulators; per quad each row's weight dword is
// broadcast against 4 vectors of value dwords, packed in registers from
// the rows `v` (kPacked false: the tile covers every row) or read from the
// packed values `vp` (quad stride dim). The sums, x w_scale, go into o in
// f32. The quad's 4 rows `next` are prefetched at byte d meanwhile.
template <int kRows, bool kPacked>
HWY_INLINE PAGEDATTN_INT8_ATTR void AccumulateTile(const float* s, const float* w_scale,
                                                   const void* const* v, const std::uint32_t* vp,
                                                   std::size_t dim, std::size_t d, float* o,
                                                   std::size_t o_stride, const void* const* next) {
  const auto* w = reinterpret_cast<const std::uint32_t*>(s);
  __m512i acc[kRows][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_si512();
  // Every quad, also past a short block's count (zero rows, zero weights):
  // the loop prefetches the next rows.
  for (std::int32_t jq = 0; jq < kKB / 4; ++jq) {
    for (int i = 0; i < 4; ++i) PrefetchToL2(static_cast<const char*>(next[4 * jq + i]) + d);
    __m512i x[4];
    if constexpr (kPacked) {
      for (int e = 0; e < 4; ++e)
        x[e] = Pinned(_mm512_load_si512(vp + std::size_t(jq) * dim + d + 16 * e));
    } else {
      PackQuad(v + 4 * jq, d, x);
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512i wb =
          _mm512_set1_epi32(static_cast<int>(w[std::size_t(r) * kKB + std::size_t(jq)]));
      for (int e = 0; e < 4; ++e) acc[r][e] = Dpbusd(acc[r][e], wb, x[e]);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    const __m512 ws = _mm512_set1_ps(w_scale[r]);
    float* out = o + std::size_t(r) * o_stride;
    for (int e = 0; e < 4; ++e)
      _mm512_store_ps(out + 16 * e, _mm512_fmadd_ps(_mm512_cvtepi32_ps(acc[r][e]), ws,
                                                    _mm512_load_ps(out + 16 * e)));
  }
}

// o[row] += weights (QuantizeWeights) x the block's V rows `v` (kKB rows
// of `dim`) for rows [row0, row_end), 4 rows x 64 dims at a time; o rows
// have stride dv. One or four rows: each quad is packed in registers where
// it is used; other counts pack the block into `vp` first (scratch of
// kKB x dim bytes). The V rows `next` are prefetched meanwhile.
template <int kDim>
PAGEDATTN_INT8_ATTR void AccumulateBlock(const float* s, const float* w_scale, const void* const* v,
                                         std::uint32_t* vp, std::size_t dim, std::size_t dv,
                                         float* o, std::int32_t row0, std::int32_t row_end,
                                         const void* const* next) {
  const std::size_t v_dim = kDim > 0 ? std::size_t(kDim) : dim;
  const std::int32_t rows = row_end - row0;
  if (rows == 4 || rows == 1) {
    for (std::size_t d = 0; d < v_dim; d += kRowBytes) {
      if (rows == 4)
        AccumulateTile<4, false>(s + std::size_t(row0) * kKB, w_scale + row0, v, vp, v_dim, d,
                                 o + std::size_t(row0) * dv + d, dv, next);
      else
        AccumulateTile<1, false>(s + std::size_t(row0) * kKB, w_scale + row0, v, vp, v_dim, d,
                                 o + std::size_t(row0) * dv + d, dv, next);
    }
    return;
  }
  PackValues(v, v_dim, vp);
  for (std::size_t d = 0; d < v_dim; d += kRowBytes) {
    RowGroups<4, 1>::VisitAll(row0, row_end, [&](auto group, std::int32_t r) PAGEDATTN_INT8_ATTR {
      AccumulateTile<group(), true>(s + std::size_t(r) * kKB, w_scale + r, v, vp, v_dim, d,
                                    o + std::size_t(r) * dv + d, dv, next);
    });
  }
}

}  // namespace int8dot

#endif  // PAGEDATTN_INT8_DOT_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_INT8_DOT_INL_H_
