// The decode micro-kernels on AVX512-BF16 dot products (vdpbf16ps), per
// target (Highway -inl.h pattern, raw intrinsics like bf16_dot-inl.h, whose
// macros this file uses): a KV head's few rows (a GQA group x 1 token, at
// most 8) against a block of kKB keys whose K/V rows are read straight from
// the pages and converted to bf16 in registers (bf16: none; fp8: exactly,
// fp8 e4m3 as value x 2^-8 like LoadConvert, two rows at a time through
// 128-entry byte tables; f16: widened, then rounded to bf16).
//
//   QK: per 32-dim chunk, the halves of two keys (key pairs: fp8, f16 in
//       groups of fewer than 8 rows) or of two query rows (row pairs: bf16
//       in groups of 4, f16 in groups of 8) side by side in a vector, against
//       the other side's halves broadcast; 16 accumulators are reduced
//       together into two vectors of 32 scores. bf16 in groups of 8: four
//       rows' 8-dim blocks against a key's block (row quads, 64 scores a
//       reduction); 1 or 2 bf16 rows: one accumulator per (row, key), 16
//       scores a reduction.
//   PV: the softmax weights rounded to bf16 (RoundWeights: word p of a row
//       holds keys 2p, 2p + 1); the V rows of keys 2p, 2p + 1 interleaved
//       into words in dim order (a two-source word permute; fp8: the byte
//       tables' order), each row's weight word broadcast against them, so a
//       32-dim chunk's f32 outputs are two plain vectors, dims 0-15 and 16-31.
// Head dims that are not multiples of 32 end in a masked chunk (AVX-512 masked
// loads and stores touch no memory outside the mask).
#if defined(PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#undef PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_traits.h"
#include "kernels/cpu/bf16_dot-inl.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/reduce16-inl.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/dtype.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_BF16_DOT_TARGET

namespace bf16dec {

// The path's functions may use AVX512-BF16 and AVX512-VBMI (the fp8 byte
// tables): they run only where both are present (bf16_decode_kernel, and
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
  if (e4m3 && code == 0x7F) return 0x7FC0;                     // NaN
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

// Elements [d, d + 32) of a row as bf16, zero from `left` on (`left`: the
// elements from d to the row's end).
HWY_INLINE __mmask32 ChunkMask(std::size_t left) {
  return left >= kChunk ? ~__mmask32{0} : static_cast<__mmask32>((1u << left) - 1u);
}

// The real elements of half h (16 elements from d + 16 h) of a chunk.
HWY_INLINE __mmask16 HalfMask(std::size_t left, std::size_t half) {
  const std::size_t n = left > 16 * half ? left - 16 * half : 0;
  return n >= 16 ? __mmask16(0xFFFF) : static_cast<__mmask16>((1u << n) - 1u);
}

// Codes [d, d + 32) of an fp8 row, zero from `left` on.
HWY_INLINE __m256i LoadFp8Bytes(const void* row, std::size_t d, std::size_t left) {
  const auto* p = static_cast<const std::uint8_t*>(row) + d;
  return left >= kChunk ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))
                        : _mm256_maskz_loadu_epi8(ChunkMask(left), p);
}

// fp8 -> bf16 two rows at a time, through byte tables (AVX512-VBMI:
// vpermi2b looks up 128 entries, the 7 magnitude bits): the low and the high
// byte of each code's bf16 bits, and for V the byte order that interleaves
// the two rows' 64 codes for the byte unpacks, in dim order. 6 instructions per 2 x 32
// codes for V and 5 for K (in load order), where converting each row through
// a word table (sign-extend, two vpermi2w, test, blend, sign) took 12, and
// PV's interleave 2 more.
template <DType kT>
struct Fp8ByteTables {
  alignas(64) std::uint8_t lo[128];
  alignas(64) std::uint8_t hi[128];
  alignas(64) std::uint8_t value_order[64];  // Fp8PairOrder::kValues
  constexpr Fp8ByteTables() : lo(), hi(), value_order() {
    for (int c = 0; c < 128; ++c) {
      const std::uint16_t b = Fp8MagnitudeToBf16(kT == DType::kFP8E4M3, c);
      lo[c] = static_cast<std::uint8_t>(b & 0xFF);
      hi[c] = static_cast<std::uint8_t>(b >> 8);
    }
    // Source bytes: row a's 32 codes, then row b's; the unpacks make words of
    // bytes 0-7 (lo) and 8-15 (hi) of each 128-bit block k, which hold dims
    // 4k..4k + 3 (lo) and 16 + 4k.. (hi) of a and b in turn.
    for (int k = 0; k < 4; ++k)
      for (int j = 0; j < 4; ++j)
        for (int h = 0; h < 2; ++h) {
          const int dim = 16 * h + 4 * k + j;
          value_order[16 * k + 8 * h + 2 * j] = static_cast<std::uint8_t>(dim);
          value_order[16 * k + 8 * h + 2 * j + 1] = static_cast<std::uint8_t>(32 + dim);
        }
  }
};
template <DType kT>
inline constexpr Fp8ByteTables<kT> kFp8ByteTables{};

struct Fp8PairLut {
  __m512i lo0, lo1, hi0, hi1;  // the low and high bytes' tables, 64 entries each
  __m512i order;               // kValues' byte order (zero for kKeys, which keeps the loaded order)
  __m512i sign;
};

template <DType kT, Fp8PairOrder kOrder>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR Fp8PairLut LoadFp8PairLut() {
  const auto& t = kFp8ByteTables<kT>;
  const __m512i order =
      kOrder == Fp8PairOrder::kValues ? _mm512_load_si512(t.value_order) : _mm512_setzero_si512();
  return {_mm512_load_si512(t.lo),
          _mm512_load_si512(t.lo + 64),
          _mm512_load_si512(t.hi),
          _mm512_load_si512(t.hi + 64),
          order,
          _mm512_set1_epi8(static_cast<char>(0x80))};
}

// Rows a, b at [d, d + 32) (left: the real elements, zero from there) as
// bf16 words in kOrder (in 8-element blocks A0..A3 of a, B0..B3 of b).
// kValues: pairs (a[i], b[i]) in 32-bit lanes, lo = dims 0-15, hi = 16-31;
// kKeys: lo = [A0 A2 | B0 B2], hi = [A1 A3 | B1 B3] (the loaded order, no
// byte permute).
template <Fp8PairOrder kOrder>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void Fp8PairToBf16(const void* a, const void* b, std::size_t d,
                                                     std::size_t left, const Fp8PairLut& l,
                                                     __m512i& out_lo, __m512i& out_hi) {
  const __m512i ab = _mm512_inserti64x4(_mm512_castsi256_si512(LoadFp8Bytes(a, d, left)),
                                        LoadFp8Bytes(b, d, left), 1);
  const __m512i x = kOrder == Fp8PairOrder::kValues ? _mm512_permutexvar_epi8(l.order, ab) : ab;
  const __m512i lo = _mm512_permutex2var_epi8(l.lo0, x, l.lo1);
  const __m512i hi =
      _mm512_ternarylogic_epi32(_mm512_permutex2var_epi8(l.hi0, x, l.hi1), x, l.sign, 0xF8);
  out_lo = _mm512_unpacklo_epi8(lo, hi);
  out_hi = _mm512_unpackhi_epi8(lo, hi);
}

// The tables of a pass over K or V, loaded once per block: the pair tables
// for fp8, none for the 16-bit types.
struct NoLut {};
template <DType kT>
using LutOf = std::conditional_t<is_fp8(kT), Fp8PairLut, NoLut>;
template <DType kT, Fp8PairOrder kOrder>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR LutOf<kT> LoadLut() {
  if constexpr (is_fp8(kT))
    return LoadFp8PairLut<kT, kOrder>();
  else
    return {};
}

// Half h of an f16 chunk at p (`left`: its real elements from p on) widened
// exactly to f32 (F16C). Each half is loaded on its own, so the widening reads
// it from memory: one load of the chunk would cost an extract per chunk,
// which measured slower at every GQA (docs/benchmarks.md, Attention kernels).
HWY_INLINE PAGEDATTN_BF16DEC_ATTR __m512 WidenF16Half(const std::uint16_t* p, std::size_t left,
                                                      std::size_t h) {
  const auto* ph = reinterpret_cast<const __m256i*>(p + 16 * h);
  return _mm512_cvtph_ps(left >= kChunk ? _mm256_loadu_si256(ph)
                                        : _mm256_maskz_loadu_epi16(HalfMask(left, h), ph));
}

// Elements [d, d + 32) of a 16-bit row as bf16, zero from `left` on.
template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR __m512i LoadChunk(const void* row, std::size_t d,
                                                    std::size_t left) {
  static_assert(kT == DType::kBF16 || kT == DType::kF16, "16-bit rows");
  const auto* p = static_cast<const std::uint16_t*>(row) + d;
  if constexpr (kT == DType::kBF16)
    return left >= kChunk ? _mm512_loadu_si512(p) : _mm512_maskz_loadu_epi16(ChunkMask(left), p);
  else  // f16: rounded to bf16 (11 -> 8 significant bits)
    return (__m512i)_mm512_cvtne2ps_pbh(WidenF16Half(p, left, 1), WidenF16Half(p, left, 0));
}

// The pair conversion, for the exhaustive test: rows a, b of n codes (a
// multiple of 8) to out[i] = bf16(a[i]) | bf16(b[i]) << 16, through kOrder.
template <DType kT, Fp8PairOrder kOrder>
PAGEDATTN_BF16DEC_ATTR inline void Fp8RowsToBf16Pairs(const std::uint8_t* a, const std::uint8_t* b,
                                                      std::size_t n, std::uint32_t* out) {
  const Fp8PairLut lut = LoadFp8PairLut<kT, kOrder>();
  for (std::size_t d = 0; d < n; d += kChunk) {
    __m512i lo, hi;
    Fp8PairToBf16<kOrder>(a, b, d, n - d, lut, lo, hi);
    alignas(64) std::uint16_t words[2][32];
    _mm512_store_si512(words[0], lo);
    _mm512_store_si512(words[1], hi);
    for (std::size_t i = 0; i < kChunk && d + i < n; ++i) {
      std::uint32_t wa, wb;  // the words of a[d + i] and b[d + i]
      if constexpr (kOrder == Fp8PairOrder::kValues) {
        wa = words[i / 16][2 * (i % 16)];
        wb = words[i / 16][2 * (i % 16) + 1];
      } else {  // block A(i / 8) of a at word 8 (i / 16) of half (i / 8) % 2
        const std::size_t word = 8 * (i / 16) + i % 8;
        wa = words[(i / 8) % 2][word];
        wb = words[(i / 8) % 2][16 + word];
      }
      out[d + i] = wa | wb << 16;
    }
  }
}

// --- QK ---------------------------------------------------------------------------------

// The lines at dim d of kKeys rows from prefetch[jj] (or none: null), kT
// rows of `dim` elements, fetched while a tile reads its keys' (the next
// head's K rows).
template <DType kT, int kKeys>
HWY_INLINE void PrefetchKeys(const void* const* prefetch, std::int32_t jj, std::size_t d,
                             std::size_t dim) {
  if (prefetch != nullptr)
    for (int e = 0; e < kKeys; ++e) PrefetchLine<kT>(prefetch[jj + e], d, dim);
}

// Paired tiles: each accumulator holds two halves of 8 lanes, dims [d, d +
// 16) and [d + 16, d + 32) of a chunk in turn, so a tile's 16 accumulators
// reduce to 32 scores, one level of the tree fewer than 16 whole-vector sums.
//   Key pairs: one row against two keys, the keys' halves side by side
//     (converted two rows at a time: fp8 on the byte tables), the row's
//     query halves broadcast to both 256-bit halves. Faster than single
//     tiles for fp8 and f16 K.
//   Row pairs: two rows against one key, the rows' halves side by side
//     (PrepareRowGroups, once per item), the key's halves broadcast: bf16
//     straight from its row, where key pairs cost two shuffles per pair and
//     chunk; f16 rounded into both halves at once (vcvtne2ps2bf16 of a half
//     with itself), one instruction more per key and chunk than key pairs,
//     but no query broadcasts. Faster than key pairs for bf16, and for f16
//     at GQA 8 only (TileKind's thresholds below).
// Row quads (bf16 K, groups of 8 rows): four rows' 8-dim blocks side by side
// against a key's block broadcast to the four 128-bit blocks, so a row's
// sum sits in 4 lanes: two levels of the tree for 64 scores, where row pairs
// take three for 32.
// Groups of 1 or 2 bf16 rows keep one key per accumulator (single tiles):
// row pairs of 2 rows broadcast twice the loads per key, a net loss.
enum class TileKind { kKeyPairs, kRowPairs, kRowQuads, kSingle };

// The fewest rows of a group that take row-pair tiles (0: none).
template <DType kT>
constexpr int kRowPairMinRows = kT == DType::kBF16  ? 4
                                : kT == DType::kF16 ? 8
                                                    : 0;

// bf16 groups of 8 rows take row quads.
template <DType kT>
constexpr int kRowQuadRows = kT == DType::kBF16 ? 8 : 0;

template <DType kT, int kRows>
constexpr TileKind kTileKind =
    kRowQuadRows<kT> > 0 && kRows == kRowQuadRows<kT>         ? TileKind::kRowQuads
    : kRowPairMinRows<kT> > 0 && kRows >= kRowPairMinRows<kT> ? TileKind::kRowPairs
    : kT == DType::kBF16                                      ? TileKind::kSingle
                                                              : TileKind::kKeyPairs;

// fp8 keys come out of the byte tables in load order: in 8-dim blocks of a
// chunk, lo = [A0 A2 | B0 B2], hi = [A1 A3 | B1 B3]. Their queries are stored
// to match once per item (PrepareQueries: each whole chunk's blocks as Q0 Q2
// Q1 Q3), which saves the byte permute of every key pair.
template <DType kT>
constexpr bool kQueriesInBlockOrder = is_fp8(kT);

// Row-pair and row-quad tiles read their queries stored so (PrepareRowGroups).
template <DType kT>
constexpr bool kQueriesInRowGroups = kRowPairMinRows<kT> > 0;

// Keys a, b at [d, d + 32) (`left`: the real dims from d, zero from there)
// as bf16: lo = [a d..d+15 | b d..d+15], hi = [a d+16..d+31 | b d+16..d+31]
// (fp8: in block order, above).
template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void LoadKeyPair(const void* a, const void* b, std::size_t d,
                                                   std::size_t left, const LutOf<kT>& lut,
                                                   __m512i& lo, __m512i& hi) {
  if constexpr (is_fp8(kT)) {
    Fp8PairToBf16<Fp8PairOrder::kKeys>(a, b, d, left, lut, lo, hi);
  } else {
    static_assert(kT == DType::kF16, "16-bit rows");
    // f16: rounded to bf16 (11 -> 8 significant bits), a's half and b's in one vector.
    const auto* pa = static_cast<const std::uint16_t*>(a) + d;
    const auto* pb = static_cast<const std::uint16_t*>(b) + d;
    lo = (__m512i)_mm512_cvtne2ps_pbh(WidenF16Half(pb, left, 0), WidenF16Half(pa, left, 0));
    hi = (__m512i)_mm512_cvtne2ps_pbh(WidenF16Half(pb, left, 1), WidenF16Half(pa, left, 1));
  }
}

// The item's bf16 query rows ([rows][dq], `dim` dims) as the path reads them
// where kQueriesInBlockOrder: each whole 32-dim chunk's 8-dim blocks
// reordered Q0 Q2 Q1 Q3 (a masked last chunk stays in order: LoadQueryHalves
// reorders it in registers).
PAGEDATTN_BF16DEC_ATTR inline void PrepareQueries(std::uint16_t* q, std::int32_t rows,
                                                  std::size_t dim, std::size_t dq) {
  for (std::int32_t r = 0; r < rows; ++r)
    for (std::size_t d = 0; d + kChunk <= dim; d += kChunk) {
      std::uint16_t* p = q + std::size_t(r) * dq + d;
      const __m512i x = _mm512_loadu_si512(p);
      _mm512_storeu_si512(p, _mm512_shuffle_i64x2(x, x, 0xD8));
    }
}

// The rows of a head that take row-pair or row-quad tiles: ScoreBlock
// groups rows by 8 first (ScoreRowGroups), so the first per_head rounded down to a
// multiple of kRowPairMinRows (of them, rows in groups of kRowQuadRows take
// quads).
template <DType kT>
constexpr std::int32_t RowPairedRows(std::int32_t per_head) {
  return per_head / kRowPairMinRows<kT> * kRowPairMinRows<kT>;
}

// Four rows' chunks (x[r] = blocks [R0 R1 R2 R3] of 8 dims) as their blocks
// side by side: out[b] = [A_b B_b C_b D_b] (a 4 x 4 transpose of blocks).
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void TransposeBlocks(const __m512i* x, __m512i* out) {
  const __m512i t0 = _mm512_shuffle_i64x2(x[0], x[1], 0x44),
                t1 = _mm512_shuffle_i64x2(x[0], x[1], 0xEE);
  const __m512i t2 = _mm512_shuffle_i64x2(x[2], x[3], 0x44),
                t3 = _mm512_shuffle_i64x2(x[2], x[3], 0xEE);
  out[0] = _mm512_shuffle_i64x2(t0, t2, 0x88);  // t0 = [A0 A1 B0 B1], t2 = [C0 C1 D0 D1]
  out[1] = _mm512_shuffle_i64x2(t0, t2, 0xDD);
  out[2] = _mm512_shuffle_i64x2(t1, t3, 0x88);
  out[3] = _mm512_shuffle_i64x2(t1, t3, 0xDD);
}

// The item's bf16 query rows ([heads x per_head][dq], `dim` dims) as the
// row-quad and row-pair tiles read them where kQueriesInRowGroups, per whole
// 32-dim chunk at d of each head's RowPairedRows<kT>. Quads (rows 4i .. 4i
// + 3 of a group of kRowQuadRows): row 4i + b's chunk holds block b (dims d
// + 8b ..) of the four rows in turn. Pairs (rows 2i, 2i + 1): row 2i's chunk
// holds both rows' dims [d, d + 16) (row 2i's in the low 256 bits), row 2i
// + 1's both rows' [d + 16, d + 32). The other rows and a masked last chunk
// stay in order (the tiles group that chunk in registers).
template <DType kT>
PAGEDATTN_BF16DEC_ATTR void PrepareRowGroups(std::uint16_t* q, std::int32_t heads,
                                             std::int32_t per_head, std::size_t dim,
                                             std::size_t dq) {
  const std::int32_t quad_rows =
      kRowQuadRows<kT> > 0 ? per_head / kRowQuadRows<kT> * kRowQuadRows<kT> : 0;
  for (std::int32_t h = 0; h < heads; ++h) {
    for (std::int32_t i = 0; i < quad_rows; i += 4) {
      std::uint16_t* a = q + std::size_t(h * per_head + i) * dq;
      for (std::size_t d = 0; d + kChunk <= dim; d += kChunk) {
        __m512i x[4], blocks[4];
        for (int r = 0; r < 4; ++r) x[r] = _mm512_loadu_si512(a + std::size_t(r) * dq + d);
        TransposeBlocks(x, blocks);
        for (int b = 0; b < 4; ++b) _mm512_storeu_si512(a + std::size_t(b) * dq + d, blocks[b]);
      }
    }
    for (std::int32_t i = quad_rows; i < RowPairedRows<kT>(per_head); i += 2) {
      std::uint16_t* a = q + std::size_t(h * per_head + i) * dq;
      std::uint16_t* b = a + dq;
      for (std::size_t d = 0; d + kChunk <= dim; d += kChunk) {
        const __m512i x = _mm512_loadu_si512(a + d), y = _mm512_loadu_si512(b + d);
        _mm512_storeu_si512(a + d, _mm512_shuffle_i64x2(x, y, 0x44));
        _mm512_storeu_si512(b + d, _mm512_shuffle_i64x2(x, y, 0xEE));
      }
    }
  }
}

// The chunk at d of rows a and a + dq (prepared by PrepareRowGroups; `left`:
// the real dims from d, zero past them): lo = [a d..d+15 | b d..d+15], hi =
// [a d+16..d+31 | b d+16..d+31].
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void LoadRowPairHalves(const std::uint16_t* a, std::size_t dq,
                                                         std::size_t left, __m512bh& lo,
                                                         __m512bh& hi) {
  if (left >= kChunk) {
    lo = (__m512bh)_mm512_loadu_si512(a);
    hi = (__m512bh)_mm512_loadu_si512(a + dq);
  } else {
    const __m512i x = _mm512_maskz_loadu_epi16(ChunkMask(left), a);
    const __m512i y = _mm512_maskz_loadu_epi16(ChunkMask(left), a + dq);
    lo = (__m512bh)_mm512_shuffle_i64x2(x, y, 0x44);
    hi = (__m512bh)_mm512_shuffle_i64x2(x, y, 0xEE);
  }
}

// A 16-bit key's chunk at d (`left` as above) as bf16, each half in both
// 256-bit halves: lo = dims [d, d + 16), hi = [d + 16, d + 32).
template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void LoadKeyHalves(const void* k, std::size_t d, std::size_t left,
                                                     __m512i& lo, __m512i& hi) {
  const auto* p = static_cast<const std::uint16_t*>(k) + d;
  if constexpr (kT == DType::kF16) {  // rounded to bf16, into both halves at once
    const __m512 a = WidenF16Half(p, left, 0), b = WidenF16Half(p, left, 1);
    lo = (__m512i)_mm512_cvtne2ps_pbh(a, a);
    hi = (__m512i)_mm512_cvtne2ps_pbh(b, b);
  } else if (left >= kChunk) {
    lo = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    hi = _mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 16)));
  } else {
    const __m512i x = _mm512_maskz_loadu_epi16(ChunkMask(left), p);
    lo = _mm512_shuffle_i64x2(x, x, 0x44);
    hi = _mm512_shuffle_i64x2(x, x, 0xEE);
  }
}

// A query row's chunk at q (`left`: the real dims from there, zero past
// them) as the key pairs' halves want it, each half in both 256-bit halves:
// lo = dims [0, 16), hi = [16, 32) (block order: lo = Q0 Q2, hi = Q1 Q3).
template <DType kT>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void LoadQueryHalves(const std::uint16_t* q, std::size_t left,
                                                       __m512bh& lo, __m512bh& hi) {
  if (left >= kChunk) {  // in the order PrepareQueries left
    lo = (__m512bh)_mm512_broadcast_i64x4(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q)));
    hi = (__m512bh)_mm512_broadcast_i64x4(
        _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 16)));
  } else {
    const __m512i x = _mm512_maskz_loadu_epi16(ChunkMask(left), q);
    constexpr int kLo = kQueriesInBlockOrder<kT> ? 0x88 : 0x44,
                  kHi = kQueriesInBlockOrder<kT> ? 0xDD : 0xEE;
    lo = (__m512bh)_mm512_shuffle_i64x2(x, x, kLo);
    hi = (__m512bh)_mm512_shuffle_i64x2(x, x, kHi);
  }
}

// acc + a row's query halves . a key pair's halves (one chunk).
HWY_INLINE PAGEDATTN_BF16DEC_ATTR __m512 DotPair(__m512 acc, __m512bh q_lo, __m512bh q_hi,
                                                 __m512i k_lo, __m512i k_hi) {
  return _mm512_dpbf16_ps(_mm512_dpbf16_ps(acc, q_lo, (__m512bh)k_lo), q_hi, (__m512bh)k_hi);
}

// Lanes of v as the first kRows of its 16 / kLen rows of kLen scores: lanes
// [kLen i, kLen (i + 1)) to row i at `row` + i kKB. Whole stores of 16, 8 or
// 4 lanes: masked stores of a row's part of a vector are slow on Zen 4 and
// showed in GQA 8 decode.
template <int kLen, int kRows = 16 / kLen>
HWY_INLINE void StoreRowSegments(__m512 v, float* row) {
  static_assert(kLen == 4 || kLen == 8 || kLen == 16, "whole 128-bit blocks");
  static_assert(kRows >= 1 && kRows <= 16 / kLen, "rows of this vector");
  if constexpr (kLen == 16) {
    _mm512_storeu_ps(row, v);
  } else if constexpr (kLen == 8) {
    _mm256_storeu_ps(row, _mm512_castps512_ps256(v));
    if constexpr (kRows > 1) _mm256_storeu_ps(row + kKB, _mm512_extractf32x8_ps(v, 1));
  } else {
    _mm_storeu_ps(row, _mm512_castps512_ps128(v));
    if constexpr (kRows > 1) _mm_storeu_ps(row + kKB, _mm512_extractf32x4_ps(v, 1));
    if constexpr (kRows > 2) _mm_storeu_ps(row + 2 * kKB, _mm512_extractf32x4_ps(v, 2));
    if constexpr (kRows > 3) _mm_storeu_ps(row + 3 * kKB, _mm512_extractf32x4_ps(v, 3));
  }
}

// The 32 sums of 16 paired accumulators (acc[i]: halves A, B in its low and
// high 8 lanes). The tree's first two levels as ReduceN's (every sum takes
// the same order whatever the tile), then halves summed across blocks: lane
// 8g + 4kb + l holds accumulator 8h + 4g + l, half kb; out[h] lane m = that
// vector's lane order[m] (one permute into the tile's order).
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ReducePairs(const __m512* a, __m512i order, __m512* out) {
  __m512 u[4];
  ReduceWithinBlocks<16>(a, AddLanes(), u);
  for (int h = 0; h < 2; ++h) {
    const __m512 x = u[2 * h], y = u[2 * h + 1];
    const __m512 halves =
        _mm512_add_ps(_mm512_shuffle_f32x4(x, y, 0x88), _mm512_shuffle_f32x4(x, y, 0xDD));
    out[h] = _mm512_permutexvar_ps(order, halves);
  }
}

// The key pairs of a key-pair tile of kRows rows: as many as 16 accumulators
// hold, in a power of two that divides kKB's keys (3 rows: 4 pairs, 12
// accumulators; 5-7 rows: 2 pairs).
template <int kRows>
constexpr int kKeyPairsFor = PowerOfTwoTileWidth(kRows, 16);

// Scores kRows rows x 2 kPairs keys from key jj (row r, keys jj + 2p, jj +
// 2p + 1 in accumulator r kPairs + p; the rest of the 16 stay zero, so that
// one reduction serves every tile and a row's sums take the same order in
// any). Few rows keep their query halves in registers and stream the key
// pairs; more rows keep the pairs and stream the queries. `prefetch` (or
// null): rows of the same length whose lines are fetched meanwhile (the next
// head's K rows).
template <DType kT, int kDim, int kRows, int kPairs>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreTile(const std::uint16_t* q, std::size_t dq,
                                                 const void* const* k, const void* const* prefetch,
                                                 std::size_t dim, std::int32_t jj, float* s,
                                                 const LutOf<kT>& lut) {
  static_assert(kRows * kPairs <= 16, "one reduction of 16 accumulators");
  constexpr int kKeys = 2 * kPairs;
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    const std::size_t left = dim - d;
    PrefetchKeys<kT, kKeys>(prefetch, jj, d, dim);
    if constexpr (kRows <= 2) {
      __m512bh q_lo[kRows], q_hi[kRows];
      for (int r = 0; r < kRows; ++r)
        LoadQueryHalves<kT>(q + std::size_t(r) * dq + d, left, q_lo[r], q_hi[r]);
      for (int p = 0; p < kPairs; ++p) {
        __m512i k_lo, k_hi;
        LoadKeyPair<kT>(k[jj + 2 * p], k[jj + 2 * p + 1], d, left, lut, k_lo, k_hi);
        for (int r = 0; r < kRows; ++r)
          acc[r * kPairs + p] = DotPair(acc[r * kPairs + p], q_lo[r], q_hi[r], k_lo, k_hi);
      }
    } else {
      __m512i k_lo[kPairs], k_hi[kPairs];
      for (int p = 0; p < kPairs; ++p) {
        LoadKeyPair<kT>(k[jj + 2 * p], k[jj + 2 * p + 1], d, left, lut, k_lo[p], k_hi[p]);
        k_lo[p] = bf16dot::Pinned(k_lo[p]);
        k_hi[p] = bf16dot::Pinned(k_hi[p]);
      }
      for (int r = 0; r < kRows; ++r) {
        __m512bh q_lo, q_hi;
        LoadQueryHalves<kT>(q + std::size_t(r) * dq + d, left, q_lo, q_hi);
        for (int p = 0; p < kPairs; ++p)
          acc[r * kPairs + p] = DotPair(acc[r * kPairs + p], q_lo, q_hi, k_lo[p], k_hi[p]);
      }
    }
  }
  __m512 sums[2];  // tile index r kKeys + key: row-major
  ReducePairs(acc, _mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), sums);
  if constexpr (kKeys >= 16) {
    for (int r = 0; r < kRows; ++r)
      for (int h = 0; h < kKeys / 16; ++h)
        StoreRowSegments<16>(sums[r * kKeys / 16 + h],
                             s + std::size_t(r) * kKB + std::size_t(jj + 16 * h));
  } else {
    constexpr int kRowsPerSum = 16 / kKeys;
    StoreRowSegments<kKeys, std::min(kRows, kRowsPerSum)>(sums[0], s + std::size_t(jj));
    if constexpr (kRows > kRowsPerSum)
      StoreRowSegments<kKeys, kRows - kRowsPerSum>(
          sums[1], s + std::size_t(kRowsPerSum) * kKB + std::size_t(jj));
  }
}

// Row-pair tiles (16-bit K): scores 2 kRowPairs rows x kKeys keys from key jj
// (16 accumulators: row pair p, key e in accumulator p kKeys + e), the rows'
// halves in registers, each key's halves broadcast from its row. `prefetch`
// as ScoreTile's.
template <DType kT, int kRowPairs, int kKeys>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreRowPairTile(const std::uint16_t* q, std::size_t dq,
                                                        const void* const* k,
                                                        const void* const* prefetch,
                                                        std::size_t dim, std::int32_t jj,
                                                        float* s) {
  static_assert(kRowPairs * kKeys == 16, "one reduction of 16 accumulators");
  static_assert(kKeys == 4 || kKeys == 8, "the stores below");
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    const std::size_t left = dim - d;
    PrefetchKeys<kT, kKeys>(prefetch, jj, d, dim);
    __m512bh q_lo[kRowPairs], q_hi[kRowPairs];
    for (int p = 0; p < kRowPairs; ++p)
      LoadRowPairHalves(q + std::size_t(2 * p) * dq + d, dq, left, q_lo[p], q_hi[p]);
    for (int e = 0; e < kKeys; ++e) {
      __m512i k_lo, k_hi;
      LoadKeyHalves<kT>(k[jj + e], d, left, k_lo, k_hi);
      for (int p = 0; p < kRowPairs; ++p)
        acc[p * kKeys + e] = DotPair(acc[p * kKeys + e], q_lo[p], q_hi[p], k_lo, k_hi);
    }
  }
  // Accumulators 8h .. 8h + 7 hold row pairs 8h / kKeys .. with keys e; the
  // order leaves each out[h] in rows of kKeys keys: 4 x 4 (rows 4h ..), or
  // 2 x 8 (rows 2h, 2h + 1).
  const __m512i order =
      kKeys == 4 ? _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                 : _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 4, 5, 6, 7, 12, 13, 14, 15);
  __m512 sums[2];
  ReducePairs(acc, order, sums);
  for (int h = 0; h < 2; ++h)
    StoreRowSegments<kKeys>(sums[h], s + std::size_t(h * 16 / kKeys) * kKB + std::size_t(jj));
}

// Row-quad tiles (bf16 K, 8 rows): each accumulator holds four rows' 8-dim
// blocks against one key's block broadcast to the four 128-bit blocks, so a
// row's sum sits in 4 lanes: two levels of the tree for 64 scores.
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreRowQuadTile(const std::uint16_t* q, std::size_t dq,
                                                        const void* const* k,
                                                        const void* const* prefetch,
                                                        std::size_t dim, std::int32_t jj,
                                                        float* s) {
  constexpr int kKeys = 8;
  __m512 acc[16];  // quad g, key e in acc[g kKeys + e]
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    const std::size_t left = dim - d;
    PrefetchKeys<DType::kBF16, kKeys>(prefetch, jj, d, dim);
    __m512bh qb[2][4];  // quad g, block b: [A_b B_b C_b D_b]
    for (int g = 0; g < 2; ++g) {
      const std::uint16_t* a = q + std::size_t(4 * g) * dq + d;
      if (left >= kChunk) {
        for (int b = 0; b < 4; ++b)
          qb[g][b] = (__m512bh)_mm512_loadu_si512(a + std::size_t(b) * dq);
      } else {
        __m512i x[4], blocks[4];
        for (int r = 0; r < 4; ++r)
          x[r] = _mm512_maskz_loadu_epi16(ChunkMask(left), a + std::size_t(r) * dq);
        TransposeBlocks(x, blocks);
        for (int b = 0; b < 4; ++b) qb[g][b] = (__m512bh)blocks[b];
      }
    }
    for (int e = 0; e < kKeys; ++e) {
      const auto* p = static_cast<const std::uint16_t*>(k[jj + e]) + d;
      __m512i kb[4];
      if (left >= kChunk) {
        for (int b = 0; b < 4; ++b)
          kb[b] =
              _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 8 * b)));
      } else {
        const __m512i x = _mm512_maskz_loadu_epi16(ChunkMask(left), p);
        kb[0] = _mm512_shuffle_i64x2(x, x, 0x00);
        kb[1] = _mm512_shuffle_i64x2(x, x, 0x55);
        kb[2] = _mm512_shuffle_i64x2(x, x, 0xAA);
        kb[3] = _mm512_shuffle_i64x2(x, x, 0xFF);
      }
      for (int g = 0; g < 2; ++g) {
        __m512 a = acc[g * kKeys + e];
        for (int b = 0; b < 4; ++b) a = _mm512_dpbf16_ps(a, qb[g][b], (__m512bh)kb[b]);
        acc[g * kKeys + e] = a;
      }
    }
  }
  // The tree's first two levels: u[i] lane 4r + l = acc[4i + l]'s block r,
  // i.e. quad i / 2's row r, key 4 (i % 2) + l.
  __m512 u[4];
  ReduceWithinBlocks<16>(acc, AddLanes(), u);
  // Rows of 8 keys, two to a vector, stored whole (masked stores of 4 keys
  // a row are slow on Zen 4; see StoreRowSegments).
  const __m512i rows01 = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i rows23 =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  for (int g = 0; g < 2; ++g)
    for (int h = 0; h < 2; ++h) {
      const __m512 two = _mm512_permutex2var_ps(u[2 * g], h == 0 ? rows01 : rows23, u[2 * g + 1]);
      StoreRowSegments<8>(two, s + std::size_t(4 * g + 2 * h) * kKB + std::size_t(jj));
    }
}

// Single tiles (a lone bf16 row): scores kRows rows x kKeys keys from key jj, one
// accumulator per (row, key), per 32-dim chunk each key's chunk loaded once
// and each row's query chunk loaded once.
template <int kDim, int kRows, int kKeys>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreSingleTile(const std::uint16_t* q, std::size_t dq,
                                                       const void* const* k,
                                                       const void* const* prefetch, std::size_t dim,
                                                       std::int32_t jj, float* s) {
  static_assert(kRows * kKeys == 16, "one reduction of 16 accumulators");
  __m512 acc[16];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (std::size_t d = 0; d < dim; d += kChunk) {
    const std::size_t left = dim - d;
    __m512i kc[kKeys];
    for (int e = 0; e < kKeys; ++e)
      kc[e] = bf16dot::Pinned(LoadChunk<DType::kBF16>(k[jj + e], d, left));
    PrefetchKeys<DType::kBF16, kKeys>(prefetch, jj, d, dim);
    for (int r = 0; r < kRows; ++r) {
      const __m512bh qc =
          (__m512bh)bf16dot::Pinned(LoadChunk<DType::kBF16>(q + std::size_t(r) * dq, d, left));
      for (int e = 0; e < kKeys; ++e)
        acc[r * kKeys + e] = _mm512_dpbf16_ps(acc[r * kKeys + e], qc, (__m512bh)kc[e]);
    }
  }
  StoreRowSegments<kKeys>(Reduce16(acc),
                          s + std::size_t(jj));  // lanes r kKeys .. to row r's keys jj ..
}

template <DType kT, int kDim, int kRows>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void ScoreRows(const std::uint16_t* q, std::size_t dq,
                                                 const void* const* k, const void* const* prefetch,
                                                 std::size_t dim, float* s, const LutOf<kT>& lut) {
  if constexpr (kTileKind<kT, kRows> == TileKind::kKeyPairs) {
    constexpr int kPairs = kKeyPairsFor<kRows>;
    for (std::int32_t jj = 0; jj < kKB; jj += 2 * kPairs)
      ScoreTile<kT, kDim, kRows, kPairs>(q, dq, k, prefetch, dim, jj, s, lut);
  } else if constexpr (kTileKind<kT, kRows> == TileKind::kRowQuads) {
    for (std::int32_t jj = 0; jj < kKB; jj += 8) ScoreRowQuadTile(q, dq, k, prefetch, dim, jj, s);
  } else if constexpr (kTileKind<kT, kRows> == TileKind::kRowPairs) {
    constexpr int kRowPairs = kRows / 2, kKeys = 16 / kRowPairs;
    for (std::int32_t jj = 0; jj < kKB; jj += kKeys)
      ScoreRowPairTile<kT, kRowPairs, kKeys>(q, dq, k, prefetch, dim, jj, s);
  } else {
    constexpr int kKeys = 16 / kRows;
    for (std::int32_t jj = 0; jj < kKB; jj += kKeys)
      ScoreSingleTile<kDim, kRows, kKeys>(q, dq, k, prefetch, dim, jj, s);
  }
}

// The row groups of QK: key-pair tiles (f16 and fp8 K) take any group of
// 1-8 rows, so a GQA group of 3, 5, 6 or 7 converts each key once; bf16 K's
// tiles (single, row pairs, row quads) are built for 1, 2, 4 and 8 rows.
template <DType kT>
using ScoreRowGroups = std::conditional_t<kT == DType::kBF16, RowGroups<8, 4, 2, 1>, EveryRowGroup>;

// Scores of `rows` (at most 8) bf16 query rows (stride dq elements) against
// the kKB keys `k` (rows of `dim` kT elements) into s ([rows][kKB]), times
// k_scale when given. The first group of rows prefetches `prefetch` (the
// next head's K rows) a line per line of K read.
template <DType kT, int kDim>
PAGEDATTN_BF16DEC_ATTR void ScoreBlock(const std::uint16_t* q, std::size_t dq, const void* const* k,
                                       const void* const* prefetch, std::size_t dim,
                                       const float* k_scale, float* s, std::int32_t rows) {
  const LutOf<kT> lut = LoadLut<kT, Fp8PairOrder::kKeys>();
  const std::size_t n = kDim > 0 ? std::size_t(kDim) : dim;
  ScoreRowGroups<kT>::VisitAll(0, rows, [&](auto group, std::int32_t r) PAGEDATTN_BF16DEC_ATTR {
    ScoreRows<kT, kDim, group()>(q + std::size_t(r) * dq, dq, k, r == 0 ? prefetch : nullptr, n,
                                 s + std::size_t(r) * kKB, lut);
  });
  if (k_scale == nullptr) return;
  const __m512 ks0 = _mm512_loadu_ps(k_scale), ks1 = _mm512_loadu_ps(k_scale + 16);
  for (std::int32_t i = 0; i < rows; ++i) {
    float* x = s + std::size_t(i) * kKB;
    _mm512_store_ps(x, _mm512_mul_ps(_mm512_load_ps(x), ks0));
    _mm512_store_ps(x + 16, _mm512_mul_ps(_mm512_load_ps(x + 16), ks1));
  }
}

// --- PV ---------------------------------------------------------------------------------

// f32 output dims [d, d + 32) of a row (`left` of them real): lo = dims
// 0-15, hi = 16-31, as the V pairs leave them.
struct OutChunk {
  __m512 lo, hi;
};

HWY_INLINE OutChunk LoadOut(const float* o, std::size_t left) {
  if (left >= kChunk) return {_mm512_load_ps(o), _mm512_load_ps(o + 16)};
  return {_mm512_maskz_loadu_ps(HalfMask(left, 0), o),
          _mm512_maskz_loadu_ps(HalfMask(left, 1), o + 16)};
}

HWY_INLINE void StoreOut(const OutChunk& c, float* o, std::size_t left) {
  if (left >= kChunk) {
    _mm512_store_ps(o, c.lo);
    _mm512_store_ps(o + 16, c.hi);
  } else {
    _mm512_mask_storeu_ps(o, HalfMask(left, 0), c.lo);
    _mm512_mask_storeu_ps(o + 16, HalfMask(left, 1), c.hi);
  }
}

// 16-bit V rows a, b (32 words each) as pairs (a[i], b[i]) in 32-bit lanes:
// lo = dims 0-15, hi = 16-31.
HWY_INLINE PAGEDATTN_BF16DEC_ATTR OutChunk InterleaveValues(__m512i a, __m512i b) {
  alignas(64) static constexpr std::uint16_t kLo[32] = {0,  32, 1,  33, 2,  34, 3,  35, 4,  36, 5,
                                                        37, 6,  38, 7,  39, 8,  40, 9,  41, 10, 42,
                                                        11, 43, 12, 44, 13, 45, 14, 46, 15, 47};
  alignas(64) static constexpr std::uint16_t kHi[32] = {16, 48, 17, 49, 18, 50, 19, 51, 20, 52, 21,
                                                        53, 22, 54, 23, 55, 24, 56, 25, 57, 26, 58,
                                                        27, 59, 28, 60, 29, 61, 30, 62, 31, 63};
  return {_mm512_castsi512_ps(_mm512_permutex2var_epi16(a, _mm512_load_si512(kLo), b)),
          _mm512_castsi512_ps(_mm512_permutex2var_epi16(a, _mm512_load_si512(kHi), b))};
}

// o[kRows rows] += weights x V over `pairs` key pairs for the kChunks x 32
// dims from d (`left`: the real dims from d; only a lone last chunk may hold
// fewer than 32): kRows x kChunks x 2 accumulators (at most 16). `prefetch`
// (or null): rows whose lines at these dims are fetched meanwhile (the next
// head's V rows).
template <DType kT, int kRows, int kChunks>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void AccumulateTile(const float* s, const void* const* v,
                                                      const void* const* prefetch,
                                                      std::int32_t pairs, std::size_t d,
                                                      std::size_t left, float* o,
                                                      std::size_t o_stride, const LutOf<kT>& lut) {
  static_assert(kRows * kChunks <= 8, "at most 16 accumulators");
  const auto* w = reinterpret_cast<const std::uint32_t*>(s);
  OutChunk acc[kRows][kChunks];
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunks; ++c)
      acc[r][c] = LoadOut(o + std::size_t(r) * o_stride + d + kChunk * c, left - kChunk * c);
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
        Fp8PairToBf16<Fp8PairOrder::kValues>(v[2 * p], v[2 * p + 1], dc, lc, lut, xl, xh);
        x[c] = {_mm512_castsi512_ps(xl), _mm512_castsi512_ps(xh)};
      } else {
        x[c] =
            InterleaveValues(LoadChunk<kT>(v[2 * p], dc, lc), LoadChunk<kT>(v[2 * p + 1], dc, lc));
      }
    }
    for (int r = 0; r < kRows; ++r) {
      const __m512bh wr =
          (__m512bh)_mm512_set1_epi32(static_cast<int>(w[std::size_t(r) * kKB + std::size_t(p)]));
      for (int c = 0; c < kChunks; ++c) {
        acc[r][c].lo = _mm512_dpbf16_ps(acc[r][c].lo, wr, (__m512bh)_mm512_castps_si512(x[c].lo));
        acc[r][c].hi = _mm512_dpbf16_ps(acc[r][c].hi, wr, (__m512bh)_mm512_castps_si512(x[c].hi));
      }
    }
  }
  for (int r = 0; r < kRows; ++r)
    for (int c = 0; c < kChunks; ++c)
      StoreOut(acc[r][c], o + std::size_t(r) * o_stride + d + kChunk * c, left - kChunk * c);
}

// Dims [d, dim) in tiles of kChunks chunks while whole ones fit, then of
// half as many, down to one chunk (the last one masked): a row alone over
// 128 dims takes one tile of 4 chunks (8 accumulators), not 4 tiles of 2
// accumulators whose dot products would wait on each other.
template <DType kT, int kRows, int kChunks>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void AccumulateChunks(
    const float* s, const void* const* v, const void* const* prefetch, std::int32_t pairs,
    std::size_t d, std::size_t dim, float* o, std::size_t o_stride, const LutOf<kT>& lut) {
  for (; d + kChunks * kChunk <= dim; d += kChunks * kChunk)
    AccumulateTile<kT, kRows, kChunks>(s, v, prefetch, pairs, d, dim - d, o, o_stride, lut);
  if constexpr (kChunks > 1) {
    AccumulateChunks<kT, kRows, kChunks / 2>(s, v, prefetch, pairs, d, dim, o, o_stride, lut);
  } else if (d < dim) {
    AccumulateTile<kT, kRows, 1>(s, v, prefetch, pairs, d, dim - d, o, o_stride, lut);
  }
}

template <DType kT, int kRows>
HWY_INLINE PAGEDATTN_BF16DEC_ATTR void AccumulateRows(const float* s, const void* const* v,
                                                      const void* const* prefetch,
                                                      std::int32_t pairs, std::size_t dim, float* o,
                                                      std::size_t o_stride, const LutOf<kT>& lut) {
  AccumulateChunks<kT, kRows, 8 / kRows>(s, v, prefetch, pairs, 0, dim, o, o_stride, lut);
}

// o ([rows][o_stride] f32) += weights x V for `rows` (at most 8) rows: the
// weights rounded to bf16 in place (bf16dot::RoundWeights), the kKB values
// `v` rows of `dim` kT elements (keys from `count` on: zero rows, zero
// weights). The first group of rows prefetches `prefetch` (the next head's
// V rows) a line per line of V read.
template <DType kT, int kDim>
PAGEDATTN_BF16DEC_ATTR void AccumulateBlock(const float* s, const void* const* v,
                                            const void* const* prefetch, std::int32_t count,
                                            std::size_t dim, float* o, std::size_t o_stride,
                                            std::int32_t rows) {
  const LutOf<kT> lut = LoadLut<kT, Fp8PairOrder::kValues>();
  const std::size_t n = kDim > 0 ? std::size_t(kDim) : dim;
  const std::int32_t pairs = (count + 1) / 2;  // a lone last key pairs with a zero row
  EveryRowGroup::VisitAll(0, rows, [&](auto group, std::int32_t r) PAGEDATTN_BF16DEC_ATTR {
    AccumulateRows<kT, group()>(s + std::size_t(r) * kKB, v, r == 0 ? prefetch : nullptr, pairs, n,
                                o + std::size_t(r) * o_stride, o_stride, lut);
  });
}

}  // namespace bf16dec

#endif  // PAGEDATTN_BF16_DOT_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_BF16_DECODE_INL_H_
