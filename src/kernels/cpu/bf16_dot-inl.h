// The prefill micro-kernels on AVX512-BF16 dot products (vdpbf16ps: 16 f32
// lanes, each += the dot product of a pair of bf16), per target (Highway
// -inl.h pattern). Highway 1.0.3 has no such op, so these are raw
// intrinsics, compiled only on the AVX-512 targets (PAGEDATTN_BF16_DOT_TARGET)
// and run only when the CPU reports avx512_bf16 (KernelContext::bf16_dot).
//
// Layouts (words = pairs of bf16, the unit the instruction reduces over):
//   queries  [rows][dq] bf16: word p of a row holds dims 2p, 2p + 1;
//   keys     [dq / 2][kKeyBlock] words: word p of every key of the block, so
//            QK is an outer product (a query word broadcast against 16 keys);
//   weights  [rows][kKeyBlock] bf16 in place of the f32 scores' first half:
//            word jp holds keys 2jp, 2jp + 1;
//   values   [kKeyBlock / 2][dv] words: word d of key pair jp holds dim d of
//            keys 2jp and 2jp + 1, so PV reduces over keys pairwise.
// Rounding: every input is rounded to bf16 (nearest even, 8 significant
// bits): queries, softmax weights, and K/V stored as f16 (bf16, fp8 and
// int8 convert exactly). Products and sums are f32.
#ifndef PAGEDATTN_KERNELS_CPU_BF16_DOT_MACROS_
#define PAGEDATTN_KERNELS_CPU_BF16_DOT_MACROS_
// True in the per-target pass of a target that compiles the bf16 kernels.
#define PAGEDATTN_BF16_DOT_TARGET \
  (HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL))
// The target's extensions plus AVX512-BF16 (clang replaces rather than
// extends the target of Highway's pragma; functions with it are called,
// never inlined, from code without it).
#define PAGEDATTN_BF16_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16")))
#endif

#if defined(PAGEDATTN_KERNELS_CPU_BF16_DOT_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_BF16_DOT_INL_H_
#undef PAGEDATTN_KERNELS_CPU_BF16_DOT_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_BF16_DOT_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>

#include "kernels/attention_traits.h"
#include "kernels/cpu/convert-inl.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_BF16_DOT_TARGET

namespace bf16dot {

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
static_assert(kKB == 32,
              "a block's scores are two 16-lane vectors, its weights one vector of bf16");

// Pins a vector to a register (GCC would otherwise fold a load shared by
// several dot products into each of them as a memory operand).
template <class V>
HWY_INLINE V Pinned(V v) {
  asm("" : "+v"(v));
  return v;
}

// 16 elements of a kT row from d as bf16, zero from `dim` on (head dims are
// multiples of 8, so a chunk holds 16 or 8 of the row's elements).
template <DType kT>
HWY_INLINE PAGEDATTN_BF16_ATTR __m256i LoadBf16x16(const void* row, std::size_t d,
                                                   std::size_t dim) {
  const bool full = d + 16 <= dim;
  if constexpr (kT == DType::kBF16) {
    const auto* p = static_cast<const std::uint16_t*>(row) + d;
    return full ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                : _mm256_zextsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  } else if (kT == DType::kF16 && full) {  // one widening of 16 lanes (F16C's, exact)
    const auto* p = static_cast<const std::uint16_t*>(row) + d;
    return (__m256i)_mm512_cvtneps_pbh(
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))));
  } else {
    const __m256 lo = LoadConvert<kT>(row, d).raw;
    const __m256 hi = full ? LoadConvert<kT>(row, d + 8).raw : _mm256_setzero_ps();
    return (__m256i)_mm512_cvtneps_pbh(_mm512_insertf32x8(_mm512_castps256_ps512(lo), hi, 1));
  }
}

// Stores 8 rows of 8 words transposed: word i of every row to the 8 words
// at out + i * stride.
HWY_INLINE void StoreWordsTransposed8x8(const __m256* r, std::uint32_t* out, std::size_t stride) {
  __m256 t[8], s[8];
  for (int i = 0; i < 4; ++i) {
    t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int h = 0; h < 2; ++h) {  // rows 4h .. 4h + 3: s[4h + i] holds word i (and i + 4) of them
    const __m256* x = t + 4 * h;
    s[4 * h + 0] = _mm256_shuffle_ps(x[0], x[2], 0x44);
    s[4 * h + 1] = _mm256_shuffle_ps(x[0], x[2], 0xEE);
    s[4 * h + 2] = _mm256_shuffle_ps(x[1], x[3], 0x44);
    s[4 * h + 3] = _mm256_shuffle_ps(x[1], x[3], 0xEE);
  }
  for (int i = 0; i < 4; ++i) {
    _mm256_storeu_ps(reinterpret_cast<float*>(out + std::size_t(i) * stride),
                     _mm256_permute2f128_ps(s[i], s[4 + i], 0x20));
    _mm256_storeu_ps(reinterpret_cast<float*>(out + std::size_t(i + 4) * stride),
                     _mm256_permute2f128_ps(s[i], s[4 + i], 0x31));
  }
}

// Keys of a block (kKB rows of `dim` kT elements) packed as word columns
// [pad16(dim) / 2][kKB]; the rows `next` are prefetched meanwhile.
template <DType kT>
PAGEDATTN_BF16_ATTR void PackKeys(const void* const* k, const void* const* next, std::size_t dim,
                                  std::uint32_t* out) {
  for (std::int32_t j0 = 0; j0 < kKB; j0 += 8)
    for (std::size_t d = 0; d < dim; d += 16) {
      __m256 r[8];
      for (int i = 0; i < 8; ++i) {
        PrefetchLine<kT>(next[j0 + i], d, dim);
        r[i] = _mm256_castsi256_ps(LoadBf16x16<kT>(k[j0 + i], d, dim));
      }
      StoreWordsTransposed8x8(r, out + d / 2 * kKB + std::size_t(j0), kKB);
    }
}

// Values of a block packed in key pairs, [kKB / 2][stride] words (stride:
// the padded dim, dims past `dim` zero); the rows `next` are prefetched meanwhile.
template <DType kT>
PAGEDATTN_BF16_ATTR void PackValues(const void* const* v, const void* const* next, std::size_t dim,
                                    std::size_t stride, std::uint32_t* out) {
  alignas(64) static constexpr std::uint16_t kInterleave[32] = {
      0, 32, 1, 33, 2,  34, 3,  35, 4,  36, 5,  37, 6,  38, 7,  39,
      8, 40, 9, 41, 10, 42, 11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  const __m512i idx = _mm512_load_si512(kInterleave);
  for (std::int32_t jp = 0; jp < kKB / 2; ++jp)
    for (std::size_t d = 0; d < dim; d += 16) {
      PrefetchLine<kT>(next[2 * jp], d, dim);
      PrefetchLine<kT>(next[2 * jp + 1], d, dim);
      const __m512i a = _mm512_castsi256_si512(LoadBf16x16<kT>(v[2 * jp], d, dim));
      const __m512i b = _mm512_castsi256_si512(LoadBf16x16<kT>(v[2 * jp + 1], d, dim));
      _mm512_store_si512(out + std::size_t(jp) * stride + d, _mm512_permutex2var_epi16(a, idx, b));
    }
}

// `rows` f32 rows of `dim` (a multiple of 8) to bf16 rows, same stride in elements.
PAGEDATTN_BF16_ATTR inline void RoundRows(const float* in, std::int32_t rows, std::size_t dim,
                                          std::size_t stride, std::uint16_t* out) {
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* x = in + std::size_t(r) * stride;
    std::uint16_t* y = out + std::size_t(r) * stride;
    std::size_t d = 0;
    for (; d + 16 <= dim; d += 16)
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + d),
                          (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + d)));
    if (d < dim)
      _mm_storeu_si128(reinterpret_cast<__m128i*>(y + d),
                       (__m128i)_mm256_cvtneps_pbh(_mm256_loadu_ps(x + d)));
  }
}

// Each row's kKB f32 weights rounded to bf16 into the first half of the row.
PAGEDATTN_BF16_ATTR inline void RoundWeights(float* s, std::int32_t row0, std::int32_t row_end) {
  for (std::int32_t r = row0; r < row_end; ++r) {
    float* x = s + std::size_t(r) * kKB;
    const __m512 lo = _mm512_load_ps(x), hi = _mm512_load_ps(x + 16);
    _mm512_store_si512(x, (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
  }
}

// Scores kRows rows x kKB keys: per query word, a broadcast against the two
// vectors of key words; scores x k_scale (when given) to s.
template <int kRows>
HWY_INLINE PAGEDATTN_BF16_ATTR void ScoreRows(const std::uint32_t* q, std::size_t q_words,
                                              const std::uint32_t* kt, std::size_t pairs,
                                              const float* k_scale, float* s) {
  __m512 acc[kRows][2];
  for (auto& row : acc) row[0] = row[1] = _mm512_setzero_ps();
  for (std::size_t p = 0; p < pairs; ++p) {
    const __m512bh k0 = (__m512bh)Pinned(_mm512_load_si512(kt + p * kKB));
    const __m512bh k1 = (__m512bh)Pinned(_mm512_load_si512(kt + p * kKB + 16));
    for (int r = 0; r < kRows; ++r) {
      const __m512bh qb =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(q[std::size_t(r) * q_words + p]));
      acc[r][0] = _mm512_dpbf16_ps(acc[r][0], qb, k0);
      acc[r][1] = _mm512_dpbf16_ps(acc[r][1], qb, k1);
    }
  }
  for (int r = 0; r < kRows; ++r) {
    float* out = s + std::size_t(r) * kKB;
    if (k_scale != nullptr) {
      acc[r][0] = _mm512_mul_ps(acc[r][0], _mm512_loadu_ps(k_scale));
      acc[r][1] = _mm512_mul_ps(acc[r][1], _mm512_loadu_ps(k_scale + 16));
    }
    _mm512_store_ps(out, acc[r][0]);
    _mm512_store_ps(out + 16, acc[r][1]);
  }
}

// Scores rows [row0, row_end) of the bf16 queries (row stride dq elements)
// against the packed keys (head dim `dim`, a multiple of 8) into s.
template <int kDim>
PAGEDATTN_BF16_ATTR void ScoreBlock(const std::uint16_t* q, std::size_t dq, const std::uint32_t* kt,
                                    std::size_t dim, const float* k_scale, float* s,
                                    std::int32_t row0, std::int32_t row_end) {
  const std::size_t pairs = kDim > 0 ? std::size_t(kDim) / 2 : dim / 2;
  const auto* qw = reinterpret_cast<const std::uint32_t*>(q);
  const std::size_t q_words = dq / 2;
  RowGroups<8, 4, 1>::VisitAll(row0, row_end, [&](auto group, std::int32_t r) PAGEDATTN_BF16_ATTR {
    ScoreRows<group()>(qw + std::size_t(r) * q_words, q_words, kt, pairs, k_scale,
                       s + std::size_t(r) * kKB);
  });
}

// o[kRows rows] += weights x V over `pairs` key pairs, for the kVecs x 16
// dims from d: kRows x kVecs accumulators; per key pair each row's weight
// word is broadcast against kVecs vectors of value words.
template <int kRows, int kVecs>
HWY_INLINE PAGEDATTN_BF16_ATTR void AccumulateTile(const float* s, const std::uint32_t* vp,
                                                   std::size_t v_stride, std::int32_t pairs,
                                                   float* o, std::size_t o_stride) {
  const auto* w = reinterpret_cast<const std::uint32_t*>(s);
  __m512 acc[kRows][kVecs];
  for (int r = 0; r < kRows; ++r)
    for (int e = 0; e < kVecs; ++e)
      acc[r][e] = _mm512_load_ps(o + std::size_t(r) * o_stride + 16 * e);
  for (std::int32_t jp = 0; jp < pairs; ++jp) {
    __m512bh x[kVecs];
    for (int e = 0; e < kVecs; ++e)
      x[e] = (__m512bh)Pinned(_mm512_load_si512(vp + std::size_t(jp) * v_stride + 16 * e));
    for (int r = 0; r < kRows; ++r) {
      const __m512bh wb =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(w[std::size_t(r) * kKB + std::size_t(jp)]));
      for (int e = 0; e < kVecs; ++e) acc[r][e] = _mm512_dpbf16_ps(acc[r][e], wb, x[e]);
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int e = 0; e < kVecs; ++e)
      _mm512_store_ps(o + std::size_t(r) * o_stride + 16 * e, acc[r][e]);
}

template <int kRows>
HWY_INLINE PAGEDATTN_BF16_ATTR void AccumulateRows(const float* s, const std::uint32_t* vp,
                                                   std::size_t dv_pad, std::int32_t pairs, float* o,
                                                   std::size_t o_stride) {
  std::size_t d = 0;
  for (; d + 64 <= dv_pad; d += 64)
    AccumulateTile<kRows, 4>(s, vp + d, o_stride, pairs, o + d, o_stride);
  for (; d < dv_pad; d += 16) AccumulateTile<kRows, 1>(s, vp + d, o_stride, pairs, o + d, o_stride);
}

// o[row] += weights (bf16, RoundWeights) x packed values for rows
// [row0, row_end); o rows and value rows share the stride dv (padded).
template <int kDim>
PAGEDATTN_BF16_ATTR void AccumulateBlock(const float* s, const std::uint32_t* vp, std::size_t dv,
                                         std::int32_t count, float* o, std::int32_t row0,
                                         std::int32_t row_end) {
  const std::size_t dv_pad = kDim > 0 ? std::size_t(kDim) : dv;
  const std::int32_t pairs = (count + 1) / 2;  // a lone last key pairs with a zero row
  RowGroups<4, 1>::VisitAll(row0, row_end, [&](auto group, std::int32_t r) PAGEDATTN_BF16_ATTR {
    AccumulateRows<group()>(s + std::size_t(r) * kKB, vp, dv_pad, pairs, o + std::size_t(r) * dv,
                            dv);
  });
}

}  // namespace bf16dot

#endif  // PAGEDATTN_BF16_DOT_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_BF16_DOT_INL_H_
