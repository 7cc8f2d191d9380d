// The int8 tiles on 256-bit vectors (dot_tiles_int8_avx2.cc): a group of 8
// columns, one int32 lane each. Included once per dot instruction, inside a
// namespace of its own, after defining
//   PAGEDATTN_INT8_TARGET  the function attribute of the target;
//   PAGEDATTN_INT8_VNNI    1: AVX-VNNI's vpdpbusd (VEX); 0: AVX2's vpmaddubsw
//                          + vpmaddwd, whose 16-bit pair sums saturate.
// No include guard.

constexpr std::int32_t kGroupColumns = 8;
// Q8_0 keeps its signed quants where the pair sums saturate
// (int8_tiles_common.h).
constexpr bool kSaturating = !PAGEDATTN_INT8_VNNI;
using PassTiles = NoTileState;
// Row tiles: R rows x 8 columns keep 2R accumulators (int32 sums, f32
// totals; AVX2 also 16-bit sums) in the 16 registers, beside a vector of
// the group, the broadcast row and (AVX2) the 16-bit ones and the quants'
// magnitudes.
#if PAGEDATTN_INT8_VNNI
using Int8RowTiles = kernels::RowGroups<6, 4, 2, 1>;
#else
using Int8RowTiles = kernels::RowGroups<4, 2, 1>;
#endif

// dst[t][c] = dword t of src[c] + at for 8 rows of 16 dwords (a 64-byte
// line of each row of a group; dst 32 bytes a row): two 8 x 8 transposes,
// each unpacks of dwords and qwords within 128-bit halves, then a swap of
// halves.
PAGEDATTN_INT8_TARGET inline void TransposeLine(const std::uint8_t* const* src, std::size_t at,
                                                std::uint8_t* dst) {
  for (std::int32_t half = 0; half < 2; ++half) {
    __m256i r[8], t[8];
    for (std::int32_t c = 0; c < 8; ++c)
      r[c] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src[c] + at) + half);
    for (std::int32_t i = 0; i < 4; ++i) {  // rows 2i, 2i + 1 interleaved
      t[2 * i] = _mm256_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
      t[2 * i + 1] = _mm256_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
    }
    for (std::int32_t i = 0; i < 2; ++i) {  // r[4i + j]: rows 4i .. 4i + 3 of dwords j, j + 4
      r[4 * i] = _mm256_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 1] = _mm256_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
      r[4 * i + 2] = _mm256_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
      r[4 * i + 3] = _mm256_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
    }
    auto* out = reinterpret_cast<__m256i*>(dst) + 8 * half;
    for (std::int32_t j = 0; j < 4; ++j) {
      _mm256_storeu_si256(out + j, _mm256_permute2x128_si256(r[j], r[4 + j], 0x20));
      _mm256_storeu_si256(out + 4 + j, _mm256_permute2x128_si256(r[j], r[4 + j], 0x31));
    }
  }
}

// One step of 5- or 6-bit quants (Q5_K, Q6_K) from transposed dword rows
// (one dword per column): the low 4 bits from `ql` >> ql_shift, the high
// bits (`high_bits` of each byte) from `qh` >> qh_shift, into the group's
// quants' step `step`.
PAGEDATTN_INT8_TARGET inline void MergeHighBitsStep(const std::uint8_t* ql, std::int32_t ql_shift,
                                                    const std::uint8_t* qh, std::int32_t qh_shift,
                                                    std::int32_t high_bits, std::uint8_t* quants,
                                                    std::size_t step) {
  const __m256i low =
      _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql)),
                                        _mm_cvtsi32_si128(ql_shift)),
                       _mm256_set1_epi8(0x0f));
  const __m256i high =
      _mm256_and_si256(_mm256_srl_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(qh)),
                                        _mm_cvtsi32_si128(qh_shift)),
                       _mm256_set1_epi8(static_cast<char>(high_bits)));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(quants) + step,
                      _mm256_or_si256(low, _mm256_slli_epi16(high, 4)));
}

// Bytes [x, x + 4) of each column's row, from the ring of rows
// PackGroup32 transposes (ring_row). x is even (the 32-weight formats'
// blocks of 18, 22 and 34 bytes alternate between dword and half-dword
// starts): two dwords' halves where it is not a multiple of 4.
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE __m256i DwordsAt(const std::uint8_t* t, std::size_t x) {
  const auto* rows = reinterpret_cast<const __m256i*>(t);
  const auto* row = rows + ring_row(x);
  if (x % 4 == 0) return _mm256_loadu_si256(row);
  return _mm256_or_si256(_mm256_srli_epi32(_mm256_loadu_si256(row), 16),
                         _mm256_slli_epi32(_mm256_loadu_si256(rows + ring_row(x + 4)), 16));
}
// Per dword, byte i: 16 where bit `first` + i of the dword `qh` is set
// (first a multiple of 4): the byte that holds the four bits copied to each
// byte, then compared with each byte's bit.
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE __m256i FifthBits(__m256i qh, std::int32_t first) {
  const int byte = first / 8, spread = 0x01010101;  // dword j of a 128-bit lane: byte 4j + byte
  const __m256i copies = _mm256_shuffle_epi8(
      qh, _mm256_setr_epi32(byte * spread, (4 + byte) * spread, (8 + byte) * spread,
                            (12 + byte) * spread, byte * spread, (4 + byte) * spread,
                            (8 + byte) * spread, (12 + byte) * spread));
  const __m256i bits =
      _mm256_set1_epi32(static_cast<int>((1u << (first % 8)) * 0x08040201u));  // byte i: 1 << i
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(copies, bits), bits),
                          _mm256_set1_epi8(16));
}
// The dword of nibbles at byte x of the transposed rows `t` (DwordsAt)
// split into the tiles' steps `low_step` (low nibbles) and `low_step +
// half` (high nibbles), each + 16 where `qh` (a Q5_0 / Q5_1 block's fifth
// bits; null: none) has the weight's bit: bits 4k .. 4k + 3 for the low
// nibbles, 16 + 4k .. for the high ones.
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void NibbleSteps(const std::uint8_t* t, std::size_t x,
                                                             const __m256i* qh, std::int32_t k,
                                                             std::uint8_t* quants,
                                                             std::size_t low_step,
                                                             std::size_t half) {
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  const __m256i v = DwordsAt(t, x);
  __m256i low = _mm256_and_si256(v, low4), high = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
  if (qh != nullptr) {
    low = _mm256_or_si256(low, FifthBits(*qh, 4 * k));
    high = _mm256_or_si256(high, FifthBits(*qh, 16 + 4 * k));
  }
  auto* out = reinterpret_cast<__m256i*>(quants) + low_step;
  _mm256_storeu_si256(out, low);
  _mm256_storeu_si256(out + half, high);
}
// Step `step` of Q8_0 quants from the dword at byte x of the transposed
// rows `t`: xor 0x80 unless `signed_quants`.
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void ByteStep(const std::uint8_t* t, std::size_t x,
                                                          bool signed_quants, std::uint8_t* quants,
                                                          std::size_t step) {
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(signed_quants ? 0 : 0x80));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(quants) + step,
                      _mm256_xor_si256(DwordsAt(t, x), flip));
}
// The four-byte dot products of w's unsigned quants and x's signed int8
// values in each lane: VNNI adds them to the int32 `sum`; AVX2's
// vpmaddubsw forms pair sums in 16 bits, which a tile adds up over kWiden
// steps before widening them (vpmaddwd by ones) into its int32 sums: as
// many as stay below 2^15 for the format's quants. kSigned (AVX2, Q8_0): w
// signed, its signs moved onto x so that vpmaddubsw multiplies magnitudes
// of at most 128 by values of at most 127 (pair sums below 2^15).
template <bool kSigned>
PAGEDATTN_INT8_TARGET inline __m256i PairSums(__m256i w, __m256i magnitude, __m256i x) {
  return kSigned ? _mm256_maddubs_epi16(magnitude, _mm256_sign_epi8(x, w))
                 : _mm256_maddubs_epi16(w, x);
}

// Steps of four inputs whose 16-bit pair sums a tile adds before widening:
// 2 x 127 x the largest quant, times the steps, below 2^15; at most 4 (4-bit
// quants would allow 8, which measured slower: more live registers).
constexpr std::int32_t WidenSteps(std::int32_t bits, bool signed_quants) {
  const std::int32_t largest = signed_quants ? 128 : (1 << bits) - 1;
  std::int32_t steps = 1;
  while (2 * steps * 2 * 127 * largest < 32768 && steps < 4) steps *= 2;
  return steps;
}

// y[r][0..cols) (+)= the R rows of the pass from `row` times the group's
// columns: per row and column one int32 sum per S inputs (exact), then
// total += (sum * dx) * scale (+ min * xsum per 32 inputs) in f32, in input
// order: the operations of the AVX-512 tiles, so the same bits.
template <std::int32_t R, std::int32_t kSub, bool kMins, bool kSigned, std::int32_t kWiden>
PAGEDATTN_INT8_TARGET void Tile(const PassRows& p, std::int32_t row, const Group& g,
                                std::int32_t in, std::int32_t cols, float* y, std::int32_t ldy,
                                bool accumulate) {
  constexpr std::int32_t kSteps = kSub / 4;
  static_assert(kSteps % kWiden == 0);
  const std::int32_t subs = in / kSub;
  const TileRows<R> rows(p, row, in, kSub);
  __m256 total[R];
  for (std::int32_t r = 0; r < R; ++r) total[r] = _mm256_setzero_ps();
  const auto* quants = reinterpret_cast<const __m256i*>(g.quants);
  const auto x_at = [&](std::int32_t r, std::int32_t s, std::int32_t t) PAGEDATTN_INT8_TARGET {
    std::int32_t four;
    std::memcpy(&four, rows.x8[r] + s * kSub + 4 * t, sizeof four);
    return _mm256_set1_epi32(four);
  };
  for (std::int32_t s = 0; s < subs; ++s) {
    __m256i sum[R];
    for (std::int32_t r = 0; r < R; ++r) sum[r] = _mm256_set1_epi32(rows.zsums[r][s]);
#if PAGEDATTN_INT8_VNNI
    static_assert(!kSigned && kWiden == 1, "vpdpbusd takes Q8_0's quants xor 0x80");
    for (std::int32_t t = 0; t < kSteps; ++t) {
      const __m256i w = _mm256_load_si256(quants + s * kSteps + t);
      for (std::int32_t r = 0; r < R; ++r)
        sum[r] = _mm256_dpbusd_avx_epi32(sum[r], w, x_at(r, s, t));
    }
#else
    for (std::int32_t t0 = 0; t0 < kSteps; t0 += kWiden) {
      __m256i pairs[R];
      for (std::int32_t t = t0; t < t0 + kWiden; ++t) {
        const __m256i w = _mm256_load_si256(quants + s * kSteps + t);
        const __m256i magnitude = kSigned ? _mm256_abs_epi8(w) : w;
        for (std::int32_t r = 0; r < R; ++r) {
          const __m256i step = PairSums<kSigned>(w, magnitude, x_at(r, s, t));
          pairs[r] = t == t0 ? step : _mm256_add_epi16(pairs[r], step);
        }
      }
      for (std::int32_t r = 0; r < R; ++r)
        sum[r] = _mm256_add_epi32(sum[r], _mm256_madd_epi16(pairs[r], _mm256_set1_epi16(1)));
    }
#endif
    const __m256 scale = _mm256_load_ps(g.scales + std::size_t(s) * kGroupColumns);
    const std::int32_t block = s * kSub / 32;
    for (std::int32_t r = 0; r < R; ++r)
      total[r] = _mm256_fmadd_ps(
          _mm256_mul_ps(_mm256_cvtepi32_ps(sum[r]), _mm256_set1_ps(rows.dx[r][block])), scale,
          total[r]);
    if constexpr (kMins) {
      const __m256 min = _mm256_load_ps(g.mins + std::size_t(s) * kGroupColumns);
      for (std::int32_t r = 0; r < R; ++r)
        total[r] = _mm256_fmadd_ps(min, _mm256_set1_ps(rows.xsums[r][s]), total[r]);
    }
  }
  const __m256i mask =
      _mm256_cmpgt_epi32(_mm256_set1_epi32(cols), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (std::int32_t r = 0; r < R; ++r) {
    float* out = y + std::size_t(r) * ldy;
    __m256 v = total[r];
    if (accumulate) v = _mm256_add_ps(_mm256_maskload_ps(out, mask), v);
    _mm256_maskstore_ps(out, mask, v);
  }
}

template <std::int32_t kSub, bool kMins, bool kSigned, std::int32_t kWiden>
PAGEDATTN_INT8_TARGET void RowsTimesGroup(const DotTilesArgs& a, const PassRows& p,
                                          std::int32_t rows, const Group& g, std::int32_t cols,
                                          float* y) {
  Int8RowTiles::VisitAll(0, rows, [&](auto tile, std::int32_t row) PAGEDATTN_INT8_TARGET {
    Tile<decltype(tile)::value, kSub, kMins, kSigned, kWiden>(
        p, row, g, a.in, cols, y + std::size_t(row) * a.ldy, a.ldy, a.accumulate);
  });
}

template <std::int32_t kSub, bool kMins, bool kSigned>
PAGEDATTN_INT8_TARGET void GroupTimesPass(const DotTilesArgs& a, const Int8Layout& layout,
                                          const PassRows& p, std::int32_t rows, const Group& g,
                                          std::int32_t cols, float* y) {
#if PAGEDATTN_INT8_VNNI
  (void)layout;
  RowsTimesGroup<kSub, kMins, kSigned, 1>(a, p, rows, g, cols, y);
#else
  constexpr std::int32_t kSteps = kSub / 4;
  const std::int32_t widen = std::min(kSteps, WidenSteps(layout.bits, layout.signed_quants));
  if (widen >= 4)
    RowsTimesGroup<kSub, kMins, kSigned, 4>(a, p, rows, g, cols, y);
  else if (widen >= 2)
    RowsTimesGroup<kSub, kMins, kSigned, 2>(a, p, rows, g, cols, y);
  else
    RowsTimesGroup<kSub, kMins, kSigned, 1>(a, p, rows, g, cols, y);
#endif
}

#include "engine/int8_unpack-inl.h"
