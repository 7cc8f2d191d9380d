// The decode micro-kernels for fp8 e4m3 and f16 KV on AVX512-FP16
// multiply-adds (32 f16 lanes per instruction, twice the products of an f32
// FMA), per target (Highway -inl.h pattern; Highway 1.0.3 has no f16
// arithmetic, so raw intrinsics, compiled on the AVX-512 targets and run
// only when the CPU reports avx512_fp16: KernelContext::f16_decode,
// AttentionPlanOptions::f16_products). The two f16 instructions
// (vfmadd231ph, vaddph) are inline assembly on f16 bits held in __m512i:
// clang 14's intrinsics and __m512h exist only where the whole translation
// unit targets AVX512-FP16.
//
// K and V rows are used exactly as stored: f16 as it is, e4m3 moved into
// f16's fields, its value x 2^-8 with subnormals (3 instructions per 32
// codes instead of 10 for 32 f32 lanes). A block the path cannot take (an
// e4m3 NaN code; f16 V past F16Bounds, or f16 scores that overflowed or met
// an infinity or NaN in K) takes the f32 path: QK probes for it
// (BlockProbe).
//
//   queries  each row x a power of two (RoundQueries) so that its largest
//            element lies in [2^(e-1), 2^e) (e = 8 for e4m3, 2 for f16),
//            then rounded to f16 (11 significant bits); scores are
//            multiplied back.
//   QK       per (row, key) an accumulator of 32 f16 lanes over the row's
//            32-dim chunks, reduced to 2 lanes in f16 (ReduceF16: at most
//            256 / 2 products a sum; F16Bounds), then in f32.
//   PV       the softmax weights (without the V scale) rounded to f16; per
//            (row, 32-dim chunk) an f16 accumulator over kFlushKeys keys,
//            then widened and added to the f32 outputs times the V scale
//            (uniform over a head's keys: fp8's per head or tensor, 1 for
//            f16).
// Head dims: multiples of 32, at most kF16DecodeMaxDim (f16_decode_dims).
#ifndef PAGEDATTN_KERNELS_CPU_F16_DECODE_MACROS_
#define PAGEDATTN_KERNELS_CPU_F16_DECODE_MACROS_
// True in the per-target pass of a target that compiles the f16 kernels.
#define PAGEDATTN_F16_DECODE_TARGET \
  (HWY_ARCH_X86 && (HWY_TARGET == HWY_AVX3 || HWY_TARGET == HWY_AVX3_DL))
// The target's extensions (the f16 instructions are assembly).
#define PAGEDATTN_F16_ATTR __attribute__((target(HWY_TARGET_STR)))
#endif

#if defined(PAGEDATTN_KERNELS_CPU_F16_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_F16_DECODE_INL_H_
#undef PAGEDATTN_KERNELS_CPU_F16_DECODE_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_F16_DECODE_INL_H_
#endif

#include <hwy/highway.h>

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "kernels/attention_traits.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_F16_DECODE_TARGET

namespace f16dec {

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
constexpr std::size_t kChunk = 32;  // dims per vector of f16
static_assert(kKB == 32, "a block's weights are two vectors of 16 f32");
// Keys summed in f16 per PV accumulator before it is added to the f32
// outputs: each add rounds to 11 bits of the running sum, so fewer keys
// mean less error and more widening work.
constexpr std::int32_t kFlushKeys = 16;

// What keeps the f16 sums finite. Queries are scaled to |q| <
// 2^kQueryExponent; a QK lane sums head_dim / 32 products and ReduceF16's
// four f16 levels add 16 lanes: at most kF16DecodeMaxDim / 2 products of a
// query element and a key element. PV sums kFlushKeys products of a weight
// (<= 1) and a value, |v| < kValueBound. e4m3 (as value x 2^-8) is within
// 1.75 by construction, so no e4m3 sum overflows. f16 V is probed per block
// against kValueBound; f16 K is not bounded: a score that came out infinite
// or NaN (an overflow, or an infinity or NaN in K) sends the block to the
// f32 path (BlockProbe), which an overflow cannot escape (inf + x stays inf
// or NaN).
template <DType kT>
struct F16Bounds;
template <>
struct F16Bounds<DType::kFP8E4M3> {
  static constexpr int kQueryExponent = 8;
  static constexpr float kKeyBound = 1.875f, kValueBound = 1.875f;
};
template <>
struct F16Bounds<DType::kF16> {
  static constexpr int kQueryExponent = 2;
  static constexpr float kValueBound = 2048.0f;
  static constexpr std::uint16_t kValueBoundBits = 0x6800;  // 2048 as f16
};
static_assert(kF16DecodeMaxDim / 2 * float(1 << F16Bounds<DType::kFP8E4M3>::kQueryExponent) *
                      F16Bounds<DType::kFP8E4M3>::kKeyBound <
                  65504.0f,
              "e4m3 scores stay finite in f16");
static_assert(kFlushKeys * F16Bounds<DType::kFP8E4M3>::kValueBound < 65504.0f &&
                  kFlushKeys * F16Bounds<DType::kF16>::kValueBound < 65504.0f,
              "PV sums stay finite in f16");

template <class V>
HWY_INLINE V Pinned(V v) {
  asm("" : "+v"(v));
  return v;
}

// acc + a x b on 32 f16 lanes (vfmadd231ph).
HWY_INLINE PAGEDATTN_F16_ATTR __m512i FmaF16(__m512i a, __m512i b, __m512i acc) {
  asm("vfmadd231ph %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
  return acc;
}

// x + y on 32 f16 lanes (vaddph).
HWY_INLINE PAGEDATTN_F16_ATTR __m512i AddF16(__m512i x, __m512i y) {
  __m512i sum;
  asm("vaddph %2, %1, %0" : "=v"(sum) : "v"(x), "v"(y));
  return sum;
}

// Elements [d, d + 32) of a kT row as f16. e4m3 codes come out as value x
// 2^-8: sign-extend, shift left 7 (the sign lands on bits 15 and 14), clear
// bit 14.
template <DType kT>
HWY_INLINE PAGEDATTN_F16_ATTR __m512i LoadChunk(const void* row, std::size_t d) {
  if constexpr (kT == DType::kF16) {
    return _mm512_loadu_si512(static_cast<const std::uint16_t*>(row) + d);
  } else {
    static_assert(kT == DType::kFP8E4M3, "e4m3 or f16 rows");
    const auto* p = static_cast<const std::uint8_t*>(row) + d;
    const __m512i h = _mm512_slli_epi16(
        _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 7);
    return _mm512_and_si512(h, _mm512_set1_epi16(static_cast<std::int16_t>(0xBF80)));
  }
}

// Rounds `rows` f32 query rows (stride dq) to f16 rows (stride dq) after
// multiplying each by the power of two that puts its largest magnitude in
// [2^(e - 1), 2^e), e = F16Bounds<kT>::kQueryExponent (a zero row: by 1);
// inv[r] gets the inverse factor. False when an element is not finite (the
// caller keeps f32 products).
template <DType kT>
PAGEDATTN_F16_ATTR bool RoundQueries(const float* q, std::int32_t rows, std::size_t dim,
                                     std::size_t dq, std::uint16_t* out, float* inv) {
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* x = q + std::size_t(r) * dq;
    __m512 vpeak = _mm512_setzero_ps();
    __mmask16 not_finite = 0;  // |x| >= inf, or unordered (NaN)
    for (std::size_t d = 0; d < dim; d += 16) {
      const __m512 a = _mm512_abs_ps(_mm512_loadu_ps(x + d));
      not_finite |= _mm512_cmp_ps_mask(a, _mm512_set1_ps(HUGE_VALF), _CMP_NLT_UQ);
      vpeak = _mm512_max_ps(vpeak, a);
    }
    if (not_finite != 0) return false;
    const float peak = _mm512_reduce_max_ps(vpeak);
    int e = 0;
    if (peak > 0.0f) std::frexp(peak, &e);  // peak in [2^(e-1), 2^e)
    const int shift = F16Bounds<kT>::kQueryExponent - e;
    const __m512 factor = _mm512_set1_ps(std::ldexp(1.0f, shift));
    inv[r] = std::ldexp(1.0f, -shift);
    std::uint16_t* y = out + std::size_t(r) * dq;
    for (std::size_t d = 0; d < dim; d += 16) {
      const __m256i h = _mm512_cvtps_ph(_mm512_mul_ps(_mm512_loadu_ps(x + d), factor),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + d), h);
    }
  }
  return true;
}

// --- QK ---------------------------------------------------------------------------------

// Sums of 16 accumulators of 32 f16 lanes: lane i of the result is the sum
// of a[i]. Four levels in f16, each adding the halves of a pair's lanes
// (128-bit blocks, then 64-bit, then 32-bit units; 3 instructions a pair),
// leave 2 lanes per accumulator; those are widened and added in f32 (52
// instructions in all, against 101 for widening all 16 to Reduce16).
HWY_INLINE PAGEDATTN_F16_ATTR __m512 ReduceF16(const __m512i* a) {
  __m512i l1[8], l2[4], l3[2];
  for (int i = 0; i < 8;
       ++i) {  // blocks [a0 + a2, a1 + a3, b0 + b2, b1 + b3] of a = a[2i], b = a[2i + 1]
    const __m512i x = a[2 * i], y = a[2 * i + 1];
    l1[i] = AddF16(_mm512_shuffle_i64x2(x, y, 0x44), _mm512_shuffle_i64x2(x, y, 0xEE));
  }
  for (int j = 0; j < 4; ++j)  // block b: a[4j + b], 8 lanes
    l2[j] = AddF16(_mm512_shuffle_i64x2(l1[2 * j], l1[2 * j + 1], 0x88),
                   _mm512_shuffle_i64x2(l1[2 * j], l1[2 * j + 1], 0xDD));
  for (int m = 0; m < 2; ++m)  // block b: a[8m + b] in lanes 0-3, a[8m + 4 + b] in lanes 4-7
    l3[m] = AddF16(_mm512_unpacklo_epi64(l2[2 * m], l2[2 * m + 1]),
                   _mm512_unpackhi_epi64(l2[2 * m], l2[2 * m + 1]));
  // Block b, 32-bit unit k (2 lanes): a[4k + b].
  const __m512 u = _mm512_castsi512_ps(l3[0]), w = _mm512_castsi512_ps(l3[1]);
  const __m512i l4 = AddF16(_mm512_castps_si512(_mm512_shuffle_ps(u, w, _MM_SHUFFLE(2, 0, 2, 0))),
                            _mm512_castps_si512(_mm512_shuffle_ps(u, w, _MM_SHUFFLE(3, 1, 3, 1))));
  // Blocks 0-1 widen to lo, 2-3 to hi; accumulator i = 4k + b sits in lanes
  // 2t, 2t + 1 of lo (b < 2) or hi (b >= 2), t = 4 (b % 2) + k.
  const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(l4));
  const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(l4, 1));
  alignas(64) static constexpr std::int32_t kFirst[16] = {0, 8,  16, 24, 2, 10, 18, 26,
                                                          4, 12, 20, 28, 6, 14, 22, 30};
  const __m512i first = _mm512_load_si512(kFirst);
  const __m512i second = _mm512_add_epi32(first, _mm512_set1_epi32(1));
  return _mm512_add_ps(_mm512_permutex2var_ps(lo, first, hi),
                       _mm512_permutex2var_ps(lo, second, hi));
}

// Checks a block for what the f16 path cannot take: e4m3 NaN codes
// (S.1111.111) in K or V; f16 V elements at or past kValueBound (infinities
// and NaNs included), and f16 scores that are not finite. The QK tiles of a
// block's first row group feed it the rows they touch, 64 bytes at a time
// (kElems elements), so the check overlaps the arithmetic and pulls V into
// L1 ahead of PV; two instructions per 64 bytes.
template <DType kT>
struct BlockProbe {
  static constexpr std::size_t kElems = 64 / dtype_size(kT);
  static constexpr bool kKeys = kT == DType::kFP8E4M3;  // K bytes probed (f16 K: the scores)
  __m512i k_max, v_max;
  __mmask16 bad_scores = 0;
  HWY_INLINE PAGEDATTN_F16_ATTR BlockProbe()
      : k_max(_mm512_setzero_si512()), v_max(_mm512_setzero_si512()) {}
  // f16 scores: infinite or NaN lanes.
  HWY_INLINE PAGEDATTN_F16_ATTR void AddScores(__m512 x) {
    if constexpr (kT == DType::kF16)
      bad_scores |= _mm512_fpclass_ps_mask(x, 0x99);  // QNaN, SNaN, +-inf
  }
  // Elements [d, min(d + kElems, n)) of a K (value false) or V row of n.
  HWY_INLINE PAGEDATTN_F16_ATTR void Add(const void* row, std::size_t d, std::size_t n,
                                         bool value) {
    const auto* p = static_cast<const std::uint8_t*>(row) + d * dtype_size(kT);
    const std::size_t bytes = (d + kElems <= n ? kElems : n - d) * dtype_size(kT);
    const __m512i x =
        bytes == 64 ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi8(~0ull >> (64 - bytes), p);
    __m512i& max = value ? v_max : k_max;
    if constexpr (kT == DType::kF16)  // magnitudes' bits, ordered as the magnitudes
      max = _mm512_max_epu16(max, _mm512_and_si512(x, _mm512_set1_epi16(0x7FFF)));
    else  // OR-ing 0x80 makes a NaN code 0xFF and no other byte
      max = _mm512_max_epu8(max, _mm512_or_si512(x, _mm512_set1_epi8(static_cast<char>(0x80))));
  }
  HWY_INLINE PAGEDATTN_F16_ATTR bool Found() const {
    if constexpr (kT == DType::kF16) {
      using B = F16Bounds<kT>;
      return bad_scores != 0 ||
             _mm512_cmpge_epu16_mask(
                 v_max, _mm512_set1_epi16(static_cast<std::int16_t>(B::kValueBoundBits))) != 0;
    } else {
      const __m512i nan = _mm512_set1_epi8(static_cast<char>(0xFF));
      return (_mm512_cmpeq_epi8_mask(k_max, nan) | _mm512_cmpeq_epi8_mask(v_max, nan)) != 0;
    }
  }
};

// The K and V rows a block's QK reads (and shows BlockProbe).
struct BlockRows {
  const void* const* k;
  const void* const* v;
  std::size_t k_dim, v_dim;
};

// Raw scores of kRows rows x kKeys keys from key jj (16 accumulators): lane
// r * kKeys + e holds row r, key jj + e. `prefetch` (or null): the next
// head's K rows, a line per line read. kProbe: the K and V rows of these
// keys go through `probe` too.
template <DType kT, int kRows, int kKeys, bool kProbe>
HWY_INLINE PAGEDATTN_F16_ATTR __m512 ScoreTile(const std::uint16_t* q, std::size_t dq,
                                               const BlockRows& rows, const void* const* prefetch,
                                               std::int32_t jj, BlockProbe<kT>& probe) {
  static_assert(kRows * kKeys == 16, "one reduction of 16 accumulators");
  const void* const* k = rows.k;
  const std::size_t dim = rows.k_dim;
  __m512i acc[16];
  for (auto& a : acc) a = _mm512_setzero_si512();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    __m512i kc[kKeys];
    for (int e = 0; e < kKeys; ++e) kc[e] = Pinned(LoadChunk<kT>(k[jj + e], d));
    if (prefetch != nullptr)
      for (int e = 0; e < kKeys; ++e) PrefetchLine<kT>(prefetch[jj + e], d, dim);
    if (kProbe && BlockProbe<kT>::kKeys && d % BlockProbe<kT>::kElems == 0)
      for (int e = 0; e < kKeys; ++e) probe.Add(k[jj + e], d, dim, false);
    for (int r = 0; r < kRows; ++r) {
      const __m512i qc = Pinned(_mm512_loadu_si512(q + std::size_t(r) * dq + d));
      for (int e = 0; e < kKeys; ++e) acc[r * kKeys + e] = FmaF16(qc, kc[e], acc[r * kKeys + e]);
    }
  }
  if constexpr (kProbe)
    for (int e = 0; e < kKeys; ++e)
      for (std::size_t d = 0; d < rows.v_dim; d += BlockProbe<kT>::kElems)
        probe.Add(rows.v[jj + e], d, rows.v_dim, true);
  return ReduceF16(acc);
}

// Scores of kRows rows x the block's keys, times k_scale[key] (when given)
// x q_inv[row], to s (row stride kKB), whole rows at a time.
template <DType kT, int kRows, bool kProbe>
HWY_INLINE PAGEDATTN_F16_ATTR void ScoreRows(const std::uint16_t* q, std::size_t dq,
                                             const float* q_inv, const BlockRows& rows,
                                             const void* const* prefetch, const float* k_scale,
                                             float* s, BlockProbe<kT>& probe) {
  constexpr int kKeys = 16 / kRows;
  __m512 tiles[2 * kRows], out[2 * kRows];
  for (int t = 0; t < 2 * kRows; ++t)
    tiles[t] = ScoreTile<kT, kRows, kKeys, kProbe>(q, dq, rows, prefetch, t * kKeys, probe);
  TilesToRows<kRows>(tiles, out);
  const __m512 one = _mm512_set1_ps(1.0f);
  const __m512 ks[2] = {k_scale ? _mm512_loadu_ps(k_scale) : one,
                        k_scale ? _mm512_loadu_ps(k_scale + 16) : one};
  for (int r = 0; r < kRows; ++r)
    for (int h = 0; h < 2; ++h) {
      const __m512 x =
          _mm512_mul_ps(out[2 * r + h], _mm512_mul_ps(ks[h], _mm512_set1_ps(q_inv[r])));
      probe.AddScores(x);
      _mm512_store_ps(s + std::size_t(r) * kKB + 16 * h, x);
    }
}

// The next group of rows from r (8, 4, 2 or 1 of them); returns how many.
template <DType kT, bool kProbe>
HWY_INLINE PAGEDATTN_F16_ATTR std::int32_t ScoreGroup(const std::uint16_t* q, std::size_t dq,
                                                      const float* q_inv, const BlockRows& b,
                                                      const void* const* prefetch,
                                                      const float* k_scale, float* s,
                                                      std::int32_t r, std::int32_t rows,
                                                      BlockProbe<kT>& probe) {
  return RowGroups<8, 4, 2, 1>::VisitFirst(
      r, rows, [&](auto group, std::int32_t row) PAGEDATTN_F16_ATTR {
        ScoreRows<kT, group(), kProbe>(q + std::size_t(row) * dq, dq, q_inv + row, b, prefetch,
                                       k_scale, s + std::size_t(row) * kKB, probe);
      });
}

// Scores of `rows` (at most 8) f16 query rows (RoundQueries; stride dq)
// against the kKB kT rows `k` of k_dim elements into s ([rows][kKB]), times
// k_scale[key] (when given) x q_inv[row]. The first group of rows
// prefetches `prefetch` (the next head's K rows) and, with `probe_rows`,
// probes the K and V rows (`v`, v_dim elements; BlockProbe): returns false,
// scores unusable, when the block holds what the path cannot take. Without
// `probe_rows` (e4m3 rows whose pages are known free of NaN codes) only the
// scores are checked.
template <DType kT, int kDim>
PAGEDATTN_F16_ATTR bool ScoreBlock(const std::uint16_t* q, std::size_t dq, const float* q_inv,
                                   const void* const* k, const void* const* v,
                                   const void* const* prefetch, std::size_t k_dim,
                                   std::size_t v_dim, const float* k_scale, float* s,
                                   std::int32_t rows, bool probe_rows) {
  const BlockRows b{k, v, kDim > 0 ? std::size_t(kDim) : k_dim,
                    kDim > 0 ? std::size_t(kDim) : v_dim};
  BlockProbe<kT> probe;
  std::int32_t r =
      probe_rows ? ScoreGroup<kT, true>(q, dq, q_inv, b, prefetch, k_scale, s, 0, rows, probe)
                 : ScoreGroup<kT, false>(q, dq, q_inv, b, prefetch, k_scale, s, 0, rows, probe);
  while (r < rows) r += ScoreGroup<kT, false>(q, dq, q_inv, b, nullptr, k_scale, s, r, rows, probe);
  return !probe.Found();
}

// --- PV ---------------------------------------------------------------------------------

// Rows [row0, row_end) of softmax weights (f32, [rows][kKB]) rounded to f16
// in place, each weight in both halves of the 32-bit word of its key (so
// one 32-bit broadcast from memory repeats it over 32 lanes).
PAGEDATTN_F16_ATTR inline void RoundWeights(float* s, std::int32_t row0, std::int32_t row_end) {
  for (std::int32_t r = row0; r < row_end; ++r) {
    float* x = s + std::size_t(r) * kKB;
    for (int h = 0; h < 2; ++h) {
      const __m256i w = _mm512_cvtps_ph(_mm512_load_ps(x + 16 * h),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
      const __m512i words = _mm512_cvtepu16_epi32(w);
      _mm512_store_si512(x + 16 * h, _mm512_or_si512(words, _mm512_slli_epi32(words, 16)));
    }
  }
}

// o[kRows rows][d, d + 32 x kChunks) += v_scale x weights x V over keys
// [0, count): f16 accumulators summed over kFlushKeys keys at a time.
template <DType kT, int kRows, int kChunks>
HWY_INLINE PAGEDATTN_F16_ATTR void AccumulateTile(const float* s, const void* const* v,
                                                  const void* const* prefetch, std::int32_t count,
                                                  std::size_t d, std::size_t dim, float v_scale,
                                                  float* o, std::size_t o_stride) {
  static_assert(kRows * kChunks <= 16, "at most 16 accumulators");
  const auto* w = reinterpret_cast<const std::int32_t*>(s);
  const __m512 vs = _mm512_set1_ps(v_scale);
  for (std::int32_t g = 0; g < count; g += kFlushKeys) {
    __m512i acc[kRows][kChunks];
    for (auto& row : acc)
      for (auto& a : row) a = _mm512_setzero_si512();
    const std::int32_t end = g + kFlushKeys < count ? g + kFlushKeys : count;
    for (std::int32_t jj = g; jj < end; ++jj) {
      __m512i x[kChunks];
      for (int c = 0; c < kChunks; ++c) {
        if (prefetch != nullptr) PrefetchLine<kT>(prefetch[jj], d + kChunk * c, dim);
        x[c] = Pinned(LoadChunk<kT>(v[jj], d + kChunk * c));
      }
      for (int r = 0; r < kRows; ++r) {
        const __m512i wr = _mm512_set1_epi32(w[std::size_t(r) * kKB + std::size_t(jj)]);
        for (int c = 0; c < kChunks; ++c) acc[r][c] = FmaF16(wr, x[c], acc[r][c]);
      }
    }
    for (int r = 0; r < kRows; ++r)
      for (int c = 0; c < kChunks; ++c) {
        float* out = o + std::size_t(r) * o_stride + d + kChunk * c;
        const __m512i bits = acc[r][c];
        _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_castsi512_si256(bits)), vs,
                                              _mm512_loadu_ps(out)));
        _mm512_storeu_ps(out + 16,
                         _mm512_fmadd_ps(_mm512_cvtph_ps(_mm512_extracti64x4_epi64(bits, 1)), vs,
                                         _mm512_loadu_ps(out + 16)));
      }
  }
}

template <DType kT, int kRows>
HWY_INLINE PAGEDATTN_F16_ATTR void AccumulateRows(const float* s, const void* const* v,
                                                  const void* const* prefetch, std::int32_t count,
                                                  std::size_t dim, float v_scale, float* o,
                                                  std::size_t o_stride) {
  constexpr int kChunks = 16 / kRows;
  std::size_t d = 0;
  for (; d + kChunks * kChunk <= dim; d += kChunks * kChunk)
    AccumulateTile<kT, kRows, kChunks>(s, v, prefetch, count, d, dim, v_scale, o, o_stride);
  for (; d < dim; d += kChunk)
    AccumulateTile<kT, kRows, 1>(s, v, prefetch, count, d, dim, v_scale, o, o_stride);
}

// o ([rows][o_stride] f32) += v_scale x weights x V for `rows` (at most 8)
// rows: the weights rounded in place (RoundWeights), the first `count` of
// the kKB kT rows `v` of `dim` elements (v_scale: uniform over the keys).
// The first group of rows prefetches `prefetch` (the next head's V rows).
template <DType kT, int kDim>
PAGEDATTN_F16_ATTR void AccumulateBlock(const float* s, const void* const* v,
                                        const void* const* prefetch, std::int32_t count,
                                        std::size_t dim, float v_scale, float* o,
                                        std::size_t o_stride, std::int32_t rows) {
  const std::size_t n = kDim > 0 ? std::size_t(kDim) : dim;
  RowGroups<8, 4, 2, 1>::VisitAll(0, rows, [&](auto group, std::int32_t r) PAGEDATTN_F16_ATTR {
    AccumulateRows<kT, group()>(s + std::size_t(r) * kKB, v, r == 0 ? prefetch : nullptr, count, n,
                                v_scale, o + std::size_t(r) * o_stride, o_stride);
  });
}

}  // namespace f16dec

#endif  // PAGEDATTN_F16_DECODE_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_F16_DECODE_INL_H_
