// The decode micro-kernels on AVX512-BF16 dot products (vdpbf16ps), per
// target (Highway -inl.h pattern, raw intrinsics like bf16_dot-inl.h, whose
// macros this file uses): a KV head's few rows (a GQA group x 1 token, at
// most 8) against a block of kKB keys whose K/V rows are read straight from
// the pages and converted to bf16 in registers (bf16: none; fp8: exactly,
// fp8 e4m3 as value x 2^-8 like LoadConvert, through a 128-entry table; f16:
// widened, then rounded to bf16).
//
//   QK: a key's row chunk (32 dims, 16 words) against each row's query
//       chunk, one accumulator of 16 lanes per (row, key); 16 accumulators
//       (rows x keys) are reduced together into one vector of 16 scores.
//   PV: the softmax weights rounded to bf16 (RoundWeights: word p of a row
//       holds keys 2p, 2p + 1); the V rows of keys 2p, 2p + 1 interleaved
//       into words (unpacklo / unpackhi of 16-bit lanes), each row's weight
//       word broadcast against them. The interleave leaves the output dims of
//       a 32-dim chunk in two vectors of 4-dim groups {0-3, 8-11, 16-19,
//       24-27} and {4-7, ...}: the f32 outputs are regrouped so on load and
//       back on store, once per block.
// Head dims that are not multiples of 32 end in a masked chunk (AVX-512 masked
// loads and stores touch no memory outside the mask).
#if defined(PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#undef PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_traits.h"
#include "kernels/cpu/bf16_dot-inl.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/reduce16-inl.h"
#include "pagedattn/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_BF16_DOT_TARGET

namespace bf16dec {

// The path's functions may use AVX512-BF16 and AVX512-VBMI (PV's byte
// tables): they run only where both are present (bf16_decode_pays, and
// fp8_pairs_to_bf16_bits's check), so the compiler may use either anywhere.
#define PAGEDATTN_BF16DEC_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,avx512vbmi")))

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
constexpr std::size_t kChunk = 32;  // dims per vector of bf16

// --- fp8 -> bf16, exact --------------------------------------------------------------

// bf16 bits of an fp8 magnitude code (0..127), for e4m3 as value x 2^-8 (the
// kernel's convention: ReadScales multiplies the scale by kFormatScale). Every
// e4m3 and e5m2 value is a bf16 value: 3 or 2 mantissa bits, exponents within
// bf16's normal range (subnormal codes included).
constexpr std::uint16_t Fp8MagnitudeToBf16(bool e4m3, int code) {
  const int mant_bits = e4m3 ? 3 : 2;
  const int exp = code >> mant_bits, mant = code & ((1 << mant_bits) - 1);
  if (e4m3 && code == 0x7F) return 0x7FC0;                   // NaN
  if (!e4m3 && exp == 31) return mant == 0 ? 0x7F80 : 0x7FC0;  // inf, NaN
  // value = m x 2^e, m an integer: e4m3 with bias 7 and the 2^-8, e5m2 bias 15.
  const int bias = e4m3 ? 7 + 8 : 15;
  int m = exp == 0 ? mant : mant + (1 << mant_bits);
  int e = (exp == 0 ? 1 : exp) - bias - mant_bits;
  if (m == 0) return 0;
  while (m < (1 << mant_bits)) {  // subnormal: normalise to [2^mant_bits, 2^(mant_bits + 1))
    m <<= 1;
    --e;
  }
  const int biased = e + mant_bits + 127;  // the exponent of m's leading bit
  const int fraction = (m - (1 << mant_bits)) << (7 - mant_bits);
  return static_cast<std::uint16_t>(biased << 7 | fraction);
}

template <DType kT>
struct Fp8Table {
  alignas(64) std::uint16_t bits[128];
  constexpr Fp8Table() : bits() {
    for (int c = 0; c < 128; ++c) bits[c] = Fp8MagnitudeToBf16(kT == DType::kFP8E4M3, c);
  }
};
template <DType kT>
inline constexpr Fp8Table<kT> kFp8Table{};

// The table in four registers (entries 0-31, 32-63, 64-95, 96-127) and the
// constants of the conversion, loaded once per micro-kernel call.
struct Fp8Lut {
  __m512i t[4];
  __m512i bit6, sign;
};

template <DType kT>
HWY_INLINE Fp8Lut LoadFp8Lut() {
  Fp8Lut l;
  for (int i = 0; i < 4; ++i) l.t[i] = _mm512_load_si512(kFp8Table<kT>.bits + 32 * i);
  l.bit6 = _mm512_set1_epi16(0x40);
  l.sign = _mm512_set1_epi16(static_cast<std::int16_t>(0x8000));
  return l;
}

// 32 fp8 codes to bf16 bits: the byte sign-extended to 16 bits, its low 6
// bits index two 64-entry halves of the table (vpermi2w), bit 6 picks the
// half, the sign bit is or'ed back.
HWY_INLINE __m512i Fp8ToBf16(__m256i bytes, const Fp8Lut& l) {
  const __m512i x = _mm512_cvtepi8_epi16(bytes);
  const __m512i lo = _mm512_permutex2var_epi16(l.t[0], x, l.t[1]);
  const __m512i hi = _mm512_permutex2var_epi16(l.t[2], x, l.t[3]);
  const __m512i magnitude = _mm512_mask_blend_epi16(_mm512_test_epi16_mask(x, l.bit6), lo, hi);
  return _mm512_ternarylogic_epi32(magnitude, x, l.sign, 0xF8);  // magnitude | (x & sign)
}

// No table for the other types.
struct NoLut {};
template <DType kT>
using LutOf = std::conditional_t<is_fp8(kT), Fp8Lut, NoLut>;
template <DType kT>
HWY_INLINE LutOf<kT> LoadLut() {
  if constexpr (is_fp8(kT))
    return LoadFp8Lut<kT>();
  else
    return {};
}

// Elements [d, d + 32) of a row as bf16, zero from `left` on (`left`: the
// elements from d to the row's end).
HWY_INLINE __mmask32 ChunkMask(std::size_t left) {
  return left >= kChunk ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1u);
}

// Codes [d, d + 32) of an fp8 row, zero from `left` on.
HWY_INLINE __m256i LoadFp8Bytes(const void* row, std::size_t d, std::size_t left) {
  const auto* p = static_cast<const std::uint8_t*>(row) + d;
  return left >= kChunk ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                        : _mm256_maskz_loadu_epi8(ChunkMask(left), p);
}

template <DType kT>
HWY_INLINE __m512i LoadFp8Chunk(const void* row, std::size_t d, std::size_t left, const Fp8Lut& lut) {
  return Fp8ToBf16(LoadFp8Bytes(row, d, left), lut);
}

// PV's fp8 -> bf16 conversion, two V rows at a time, through byte tables
// (AVX512-VBMI: vpermi2b looks up 128 entries, the 7 magnitude bits): the
// low and the high byte of each code's bf16 bits, and the order that
// interleaves two rows' 32 bytes into (a, b) byte pairs. 7 instructions per
// 2 x 32 codes, where converting each row (LoadFp8Chunk) and interleaving
// the words took 14: fp8 b8 x 16k decode with bf16 products 1.13x on Zen 4.
template <DType kT>
struct Fp8ByteTables {
  alignas(64) std::uint8_t lo[128];
  alignas(64) std::uint8_t hi[128];
  alignas(64) std::uint8_t pair_index[64];
  constexpr Fp8ByteTables() : lo(), hi(), pair_index() {
    for (int c = 0; c < 128; ++c) {
      const std::uint16_t b = Fp8MagnitudeToBf16(kT == DType::kFP8E4M3, c);
      lo[c] = static_cast<std::uint8_t>(b & 0xFF);
      hi[c] = static_cast<std::uint8_t>(b >> 8);
    }
    for (int i = 0; i < 32; ++i) {
      pair_index[2 * i] = static_cast<std::uint8_t>(i);
      pair_index[2 * i + 1] = static_cast<std::uint8_t>(32 + i);
    }
  }
};
template <DType kT>
inline constexpr Fp8ByteTables<kT> kFp8ByteTables{};

struct Fp8PairLut {
  __m512i lo0, lo1, hi0, hi1, pair, sign;
};

template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR Fp8PairLut LoadFp8PairLut() {
  const auto& t = kFp8ByteTables<kT>;
  return {_mm512_load_si512(t.lo), _mm512_load_si512(t.lo + 64), _mm512_load_si512(t.hi),
          _mm512_load_si512(t.hi + 64), _mm512_load_si512(t.pair_index), _mm512_set1_epi8(static_cast<char>(0x80))};
}

// Rows a, b at [d, d + 32) (left: the real elements, zero from there) as
// interleaved bf16 pairs (a[i], b[i]) in 32-bit lanes, in the order of
// OutChunk: lo = dims {0-3, 8-11, 16-19, 24-27}, hi = {4-7, 12-15, ...}.
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void Fp8PairToBf16(const void* a, const void* b, std::size_t d, std::size_t left,
                                                   const Fp8PairLut& l, __m512i& out_lo, __m512i& out_hi) {
  const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(LoadFp8Bytes(a, d, left)), LoadFp8Bytes(b, d, left), 1);
  const __m512i x = _mm512_permutexvar_epi8(l.pair, ab);
  const __m512i lo = _mm512_permutex2var_epi8(l.lo0, x, l.lo1);
  const __m512i hi = _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(l.hi0, x, l.hi1), x, l.sign, 0xF8);
  out_lo = _mm512_unpacklo_epi8(lo, hi);
  out_hi = _mm512_unpackhi_epi8(lo, hi);
}

// PV's tables, loaded once per block: the pair tables for fp8, none for the
// 16-bit types.
template <DType kT>
using PvLutOf = std::conditional_t<is_fp8(kT), Fp8PairLut, NoLut>;
template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR PvLutOf<kT> LoadPvLut() {
  if constexpr (is_fp8(kT))
    return LoadFp8PairLut<kT>();
  else
    return {};
}


template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR __m512i LoadChunk(const void* row, std::size_t d, std::size_t left,
                                                 const LutOf<kT>& lut) {
  if constexpr (is_fp8(kT)) {
    return LoadFp8Chunk<kT>(row, d, left, lut);
  } else {
    static_assert(kT == DType::kBF16 || kT == DType::kF16, "16-bit rows");
    const auto* p = static_cast<const std::uint16_t*>(row) + d;
    const __m512i x = left >= kChunk ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(ChunkMask(left), p);
    if constexpr (kT == DType::kBF16) return x;
    // f16: widened exactly (F16C), rounded to bf16 (11 -> 8 significant bits).
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(x));
    const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(x, 1));
    return (__m512i)_mm512_cvtne2ps_pbh(hi, lo);
  }
}

// The conversion, for the exhaustive test: n codes (a multiple of 8).
template <DType kT>
inline void Fp8RowToBf16(const std::uint8_t* in, std::size_t n, std::uint16_t* out) {
  const Fp8Lut lut = LoadFp8Lut<kT>();
  for (std::size_t d = 0; d < n; d += kChunk) {
    const __m512i x = LoadFp8Chunk<kT>(in, d, n - d, lut);
    _mm512_mask_storeu_epi16(out + d, ChunkMask(n - d), x);
  }
}

// The pair conversion, for the exhaustive test: rows a, b of n codes (a
// multiple of 8) to out[i] = bf16(a[i]) | bf16(b[i]) << 16.
template <DType kT>
PAGEDATTN_BF16DEC_ATTR inline void Fp8RowsToBf16Pairs(const std::uint8_t* a, const std::uint8_t* b, std::size_t n,
                                                      std::uint32_t* out) {
  const Fp8PairLut lut = LoadFp8PairLut<kT>();
  for (std::size_t d = 0; d < n; d += kChunk) {
    __m512i lo, hi;
    Fp8PairToBf16(a, b, d, n - d, lut, lo, hi);
    alignas(64) std::uint32_t pairs[2][16];
    _mm512_store_si512(pairs[0], lo);
    _mm512_store_si512(pairs[1], hi);
    for (std::size_t i = 0; i < kChunk && d + i < n; ++i)  // OutChunk's order back to dims
      out[d + i] = pairs[(i / 4) % 2][(i / 8) * 4 + i % 4];
  }
}

// --- QK ---------------------------------------------------------------------------------

// Scores kRows rows x kKeys keys from key jj (kRows x kKeys = 16 dot
// products): per 32-dim chunk, each key's chunk converted once and each
// row's query chunk loaded once. `prefetch` (or null): rows of the same
// length whose lines are fetched meanwhile (the next head's K rows).
template <DType kT, int kDim, int kRows, int kKeys>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreTile(const std::uint16_t* q, std::size_t dq, const void* const* k,
                                               const void* const* prefetch, std::size_t dim,
                                               std::int32_t jj, float* s,
                                               const LutOf<kT>& lut) {
  static_assert(kRows * kKeys == 16, "one reduction of 16 accumulators");
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    const std::size_t left = dim - d;
    __m512i kc[kKeys];
    for (int e = 0; e < kKeys; ++e) kc[e] = bf16dot::Pinned(LoadChunk<kT>(k[jj + e], d, left, lut));
    if (prefetch != nullptr)
      for (int e = 0; e < kKeys; ++e) PrefetchLine<kT>(prefetch[jj + e], d, dim);
    for (int r = 0; r < kRows; ++r) {
      const std::uint16_t* qr = q + std::size_t(r) * dq + d;
      const __m512bh qc =
          (__m512bh)bf16dot::Pinned(left >= kChunk ? _mm512_loadu_si512(qr) : _mm512_maskz_loadu_epi16(ChunkMask(left), qr));
      for (int e = 0; e < kKeys; ++e) acc[r * kKeys + e] = _mm512_dpbf16_ps(acc[r * kKeys + e], qc, (__m512bh)kc[e]);
    }
  }
  const __m512 sums = Reduce16(acc);
  for (int r = 0; r < kRows; ++r) {  // lanes r * kKeys .. + kKeys to row r's keys jj ..
    float* out = s + std::size_t(r) * kKB + std::size_t(jj) - std::size_t(r) * kKeys;
    _mm512_mask_storeu_ps(out, static_cast<__mmask16>(((1u << kKeys) - 1u) << (r * kKeys)), sums);
  }
}

template <DType kT, int kDim, int kRows>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreRows(const std::uint16_t* q, std::size_t dq, const void* const* k,
                                               const void* const* prefetch, std::size_t dim, float* s,
                                               const LutOf<kT>& lut) {
  constexpr int kKeys = 16 / kRows;
  for (std::int32_t jj = 0; jj < kKB; jj += kKeys)
    ScoreTile<kT, kDim, kRows, kKeys>(q, dq, k, prefetch, dim, jj, s, lut);
}

// Scores of `rows` (at most 8) bf16 query rows (stride dq elements) against
// the kKB keys `k` (rows of `dim` kT elements) into s ([rows][kKB]), times
// k_scale when given. The first group of rows prefetches `prefetch` (the
// next head's K rows) a line per line of K read.
template <DType kT, int kDim>
PAGEDATTN_BF16DEC_ATTR void ScoreBlock(const std::uint16_t* q, std::size_t dq, const void* const* k,
                                    const void* const* prefetch, std::size_t dim, const float* k_scale, float* s, std::int32_t rows) {
  const LutOf<kT> lut = LoadLut<kT>();
  const std::size_t n = kDim > 0 ? std::size_t(kDim) : dim;
  std::int32_t r = 0;
  while (r < rows) {
    const std::uint16_t* qr = q + std::size_t(r) * dq;
    float* sr = s + std::size_t(r) * kKB;
    const void* const* pf = r == 0 ? prefetch : nullptr;
    if (r + 8 <= rows) {
      ScoreRows<kT, kDim, 8>(qr, dq, k, pf, n, sr, lut);
      r += 8;
    } else if (r + 4 <= rows) {
      ScoreRows<kT, kDim, 4>(qr, dq, k, pf, n, sr, lut);
      r += 4;
    } else if (r + 2 <= rows) {
      ScoreRows<kT, kDim, 2>(qr, dq, k, pf, n, sr, lut);
      r += 2;
    } else {
      ScoreRows<kT, kDim, 1>(qr, dq, k, pf, n, sr, lut);
      r += 1;
    }
  }
  if (k_scale == nullptr) return;
  const __m512 ks0 = _mm512_loadu_ps(k_scale), ks1 = _mm512_loadu_ps(k_scale + 16);
  for (std::int32_t i = 0; i < rows; ++i) {
    float* x = s + std::size_t(i) * kKB;
    _mm512_store_ps(x, _mm512_mul_ps(_mm512_load_ps(x), ks0));
    _mm512_store_ps(x + 16, _mm512_mul_ps(_mm512_load_ps(x + 16), ks1));
  }
}

// --- PV ---------------------------------------------------------------------------------

// f32 output dims [d, d + 32) of a row (`left` of them real) regrouped as
// the interleaved V words leave them: lo = dims {0-3, 8-11, 16-19, 24-27},
// hi = {4-7, 12-15, 20-23, 28-31}.
struct OutChunk {
  __m512 lo, hi;
};

HWY_INLINE __mmask16 OutMask(std::size_t left, std::size_t half) {
  const std::size_t n = left > 16 * half ? left - 16 * half : 0;
  return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

HWY_INLINE OutChunk LoadOut(const float* o, std::size_t left) {
  const __m512 x0 = left >= kChunk ? _mm512_load_ps(o) : _mm512_maskz_loadu_ps(OutMask(left, 0), o);
  const __m512 x1 = left >= kChunk ? _mm512_load_ps(o + 16) : _mm512_maskz_loadu_ps(OutMask(left, 1), o + 16);
  return {_mm512_shuffle_f32x4(x0, x1, 0x88), _mm512_shuffle_f32x4(x0, x1, 0xDD)};
}

HWY_INLINE void StoreOut(const OutChunk& c, float* o, std::size_t left) {
  alignas(64) static constexpr std::int32_t kFirst[16] = {0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23};
  alignas(64) static constexpr std::int32_t kSecond[16] = {8,  9,  10, 11, 24, 25, 26, 27,
                                                           12, 13, 14, 15, 28, 29, 30, 31};
  const __m512 x0 = _mm512_permutex2var_ps(c.lo, _mm512_load_si512(kFirst), c.hi);
  const __m512 x1 = _mm512_permutex2var_ps(c.lo, _mm512_load_si512(kSecond), c.hi);
  if (left >= kChunk) {
    _mm512_store_ps(o, x0);
    _mm512_store_ps(o + 16, x1);
  } else {
    _mm512_mask_storeu_ps(o, OutMask(left, 0), x0);
    _mm512_mask_storeu_ps(o + 16, OutMask(left, 1), x1);
  }
}

// o[kRows rows] += weights x V over `pairs` key pairs for the kChunks x 32
// dims from d (`left`: the real dims from d; only a lone last chunk may hold
// fewer than 32): kRows x kChunks x 2 accumulators (at most 16). `prefetch`
// (or null): rows whose lines at these dims are fetched meanwhile (the next
// head's V rows).
template <DType kT, int kRows, int kChunks>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void AccumulateTile(const float* s, const void* const* v, const void* const* prefetch,
                                                   std::int32_t pairs, std::size_t d, std::size_t left, float* o,
                                                   std::size_t o_stride,
                                                   const PvLutOf<kT>& lut) {
  static_assert(kRows * kChunks <= 8, "at most 16 accumulators");
  const auto* w = reinterpret_cast<const std::uint32_t*>(s);
  OutChunk acc[kRows][kChunks];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunks; ++c) acc[r][c] = LoadOut(o + std::size_t(r) * o_stride + d + kChunk * c, left - kChunk * c);
  for (std::int32_t p = 0; p < pairs; ++p) {
    OutChunk x[kChunks];
    for (int c = 0; c < kChunks; ++c) {
      const std::size_t dc = d + kChunk * c, lc = left - kChunk * c;
      if (prefetch != nullptr) {
        PrefetchLine<kT>(prefetch[2 * p], dc, dc + lc);
        PrefetchLine<kT>(prefetch[2 * p + 1], dc, dc + lc);
      }
      if constexpr (is_fp8(kT)) {
        __m512i xl, xh;
        Fp8PairToBf16(v[2 * p], v[2 * p + 1], dc, lc, lut, xl, xh);
        x[c] = {_mm512_castsi512_ps(xl), _mm512_castsi512_ps(xh)};
      } else {
        const __m512i a = LoadChunk<kT>(v[2 * p], dc, lc, lut), b = LoadChunk<kT>(v[2 * p + 1], dc, lc, lut);
        x[c] = {_mm512_castsi512_ps(_mm512_unpacklo_epi16(a, b)), _mm512_castsi512_ps(_mm512_unpackhi_epi16(a, b))};
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512bh wr = (__m512bh)_mm512_set1_epi32(static_cast<int>(w[std::size_t(r) * kKB + std::size_t(p)]));
      for (int c = 0; c < kChunks; ++c) {
        acc[r][c].lo = _mm512_dpbf16_ps(acc[r][c].lo, wr, (__m512bh)_mm512_castps_si512(x[c].lo));
        acc[r][c].hi = _mm512_dpbf16_ps(acc[r][c].hi, wr, (__m512bh)_mm512_castps_si512(x[c].hi));
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunks; ++c) StoreOut(acc[r][c], o + std::size_t(r) * o_stride + d + kChunk * c, left - kChunk * c);
}

// Whole tiles of kChunks chunks, then chunk by chunk (the last one masked).
template <DType kT, int kRows>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void AccumulateRows(const float* s, const void* const* v, const void* const* prefetch,
                                                   std::int32_t pairs, std::size_t dim, float* o, std::size_t o_stride,
                                                   const PvLutOf<kT>& lut) {
  constexpr int kChunks = 8 / kRows;
  std::size_t d = 0;
  for (; d + kChunks * kChunk <= dim; d += kChunks * kChunk)
    AccumulateTile<kT, kRows, kChunks>(s, v, prefetch, pairs, d, dim - d, o, o_stride, lut);
  for (; d < dim; d += kChunk)
    AccumulateTile<kT, kRows, 1>(s, v, prefetch, pairs, d, dim - d, o, o_stride, lut);
}

// o ([rows][o_stride] f32) += weights x V for `rows` (at most 8) rows: the
// weights rounded to bf16 in place (bf16dot::RoundWeights), the kKB values
// `v` rows of `dim` kT elements (keys from `count` on: zero rows, zero
// weights). The first group of rows prefetches `prefetch` (the next head's
// V rows) a line per line of V read.
template <DType kT, int kDim>
PAGEDATTN_BF16DEC_ATTR void AccumulateBlock(const float* s, const void* const* v, const void* const* prefetch,
                                         std::int32_t count, std::size_t dim, float* o,
                                         std::size_t o_stride, std::int32_t rows) {
  const PvLutOf<kT> lut = LoadPvLut<kT>();
  const std::size_t n = kDim > 0 ? std::size_t(kDim) : dim;
  const std::int32_t pairs = (count + 1) / 2;  // a lone last key pairs with a zero row
  std::int32_t r = 0;
  while (r < rows) {
    const float* sr = s + std::size_t(r) * kKB;
    float* orow = o + std::size_t(r) * o_stride;
    const void* const* pf = r == 0 ? prefetch : nullptr;
    if (r + 8 <= rows) {
      AccumulateRows<kT, 8>(sr, v, pf, pairs, n, orow, o_stride, lut);
      r += 8;
    } else if (r + 4 <= rows) {
      AccumulateRows<kT, 4>(sr, v, pf, pairs, n, orow, o_stride, lut);
      r += 4;
    } else if (r + 2 <= rows) {
      AccumulateRows<kT, 2>(sr, v, pf, pairs, n, orow, o_stride, lut);
      r += 2;
    } else {
      AccumulateRows<kT, 1>(sr, v, pf, pairs, n, orow, o_stride, lut);
      r += 1;
    }
  }
}

}  // namespace bf16dec

#endif  // PAGEDATTN_BF16_DOT_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
