// dot_tiles on int8 products (DotTilesArgs::int8, dot_tiles.h) on
// AVX512-VNNI. Raw intrinsics in functions with their own target attribute
// (Highway 1.0.3 has no u8 x s8 dot product), run only where
// dot_tiles_int8_available().
//
// Layouts, per group of kGroupColumns weight rows ("columns" of y):
//   quants  [in / 4][16] dwords: dword t of column c holds the quants of
//           inputs 4t .. 4t + 3 of weight row c as unsigned bytes, so one
//           vpdpbusd multiplies them by a dword of a row of x broadcast to
//           every lane (an outer product: 16 columns, no reduction);
//   scales  [in / S][16] f32: S inputs per scale (32; Q6_K 16);
//   mins    [in / 32][16] f32 (Q4_1, Q5_1, Q4_K, Q5_K): the term added per
//           32 inputs times the exact f32 sum of x over them.
// A weight is scale * (q - zero) (+ min): zero is 8 (Q4_0), 16 (Q5_0), 32
// (Q6_K), 128 (Q8_0, whose signed quants are stored xor 0x80) or 0. Per
// row of x and S inputs, the int32 lanes start at -zero * (the sum of x's
// int8 values over them), which makes the integer sum that of (q - zero) *
// x8, exactly.
#include <algorithm>
#include <cstring>

#include "engine/dot_tiles.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/errors.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PAGEDATTN_INT8_TILES 1
#else
#define PAGEDATTN_INT8_TILES 0
#endif

namespace pagedattn::engine {

#if PAGEDATTN_INT8_TILES
namespace {

// GCC 12 reports the AVX-512 intrinsics' own _mm512_undefined_*() sources
// (the masked-off lanes of an all-ones mask, never read) as uninitialized
// where they are inlined into functions with a target attribute.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

#define PAGEDATTN_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c")))

constexpr std::int32_t kGroupColumns = 16;  // one int32 lane per weight row
// Rows of x quantised per pass: their int8 bytes stay in L2 while every
// group of the call's columns passes over them; each group is packed once
// per pass.
constexpr std::int32_t kPassRows = 128;
// Row tiles: R rows x 16 columns keep 2R accumulators (int32 sums of the
// current S inputs, f32 totals) and three vectors of the group in the 32
// registers.
using Int8RowTiles = kernels::RowGroups<12, 8, 4, 2, 1>;

struct Int8Layout {
  std::int32_t sub = 32;  // inputs per scale (S)
  std::int32_t zero = 0;  // subtracted from each quant
  bool mins = false;      // a min per 32 inputs
};

constexpr Int8Layout layout_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return {32, 128, false};
    case WeightFormat::kQ4_0:
      return {32, 8, false};
    case WeightFormat::kQ5_0:
      return {32, 16, false};
    case WeightFormat::kQ6_K:
      return {16, 32, false};
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ4_K:
    case WeightFormat::kQ5_K:
      return {32, 0, true};
    default:
      return {};
  }
}

// F16C's conversion (exact): the portable one costs a branchy call per block.
PAGEDATTN_VNNI inline float half_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _cvtsh_ss(bits);
}

// Where one weight row's unpacked values go: q[in] bytes, and its scales
// and mins at every kGroupColumns-th float (the group's transposed
// layout).
struct ColumnOut {
  std::uint8_t* q;
  float* scales;
  float* mins;
};

// 16 bytes of nibbles as 32 quants: the low nibbles, then the high ones.
PAGEDATTN_VNNI inline __m256i SplitNibbles(const std::uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low4 = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

// q + 16 in the bytes whose bit of `bits` is set (the fifth bits).
PAGEDATTN_VNNI inline __m256i AddFifthBits(std::uint32_t bits, __m256i q) {
  return _mm256_mask_add_epi8(q, bits, q, _mm256_set1_epi8(16));
}

// The 32-weight formats (quant_kernels.h): block b's quants, scale and min.
template <WeightFormat F>
PAGEDATTN_VNNI void UnpackRow32(const std::uint8_t* row, std::int32_t in, const ColumnOut& out) {
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  for (std::int32_t b = 0; b < in / kQuantBlock; ++b) {
    const std::uint8_t* block = row + b * kBytes;
    std::uint8_t* q = out.q + std::size_t(b) * kQuantBlock;
    out.scales[std::size_t(b) * kGroupColumns] = half_at(block);
    __m256i v;
    if constexpr (F == WeightFormat::kQ8_0) {
      v = _mm256_xor_si256(
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kQuants)),
          _mm256_set1_epi8(static_cast<char>(0x80)));
    } else {
      v = SplitNibbles(block + BlockTraits<F>::kQuants);
    }
    if constexpr (F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1) {
      std::uint32_t qh;
      std::memcpy(&qh, block + BlockTraits<F>::kHighBits, sizeof qh);
      v = AddFifthBits(qh, v);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v);
    if constexpr (F == WeightFormat::kQ4_1 || F == WeightFormat::kQ5_1)
      out.mins[std::size_t(b) * kGroupColumns] = half_at(block + 2);
  }
}

// Q4_K / Q5_K: sub-block j of 32 of each super-block, scale d * sc[j] and
// min -dmin * m[j].
template <WeightFormat F>
PAGEDATTN_VNNI void UnpackRowK45(const std::uint8_t* row, std::int32_t in, const ColumnOut& out) {
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (std::int32_t k = 0; k < in / kQuantKBlock; ++k) {
    const std::uint8_t* block = row + k * kBytes;
    std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    const float d = half_at(block), dmin = half_at(block + 2);
    for (std::int32_t j = 0; j < 8; ++j) {
      out.scales[std::size_t(8 * k + j) * kGroupColumns] = d * float(sc[j]);
      out.mins[std::size_t(8 * k + j) * kGroupColumns] = -dmin * float(m[j]);
    }
    std::uint8_t* q = out.q + std::size_t(k) * kQuantKBlock;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (F == WeightFormat::kQ5_K)  // bit j of qh[l]: bit 4 of sub-block j's weight l
      qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kHighBits));
    for (std::int32_t j = 0; j < 8; ++j) {  // sub-block j: nibble j % 2 of quant bytes 32 (j / 2)
      const __m256i v = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kQuants + 32 * (j / 2)));
      __m256i sub = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), low4);
      if constexpr (F == WeightFormat::kQ5_K)
        sub = AddFifthBits(_mm256_test_epi8_mask(qh, _mm256_set1_epi8(static_cast<char>(1 << j))),
                           sub);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * j), sub);
    }
  }
}

// Q6_K: half h, group g of 32: low 4 bits from ql, 2 high bits from qh;
// scale d * sc[j] per 16 weights.
PAGEDATTN_VNNI void UnpackRowQ6K(const std::uint8_t* row, std::int32_t in, const ColumnOut& out) {
  using T = BlockTraits<WeightFormat::kQ6_K>;
  const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
  for (std::int32_t k = 0; k < in / kQuantKBlock; ++k) {
    const std::uint8_t* block = row + k * T::kBytes;
    const float d = half_at(block + T::kScale);
    for (std::int32_t j = 0; j < 16; ++j)
      out.scales[std::size_t(16 * k + j) * kGroupColumns] =
          d * float(static_cast<std::int8_t>(block[T::kScales + j]));
    std::uint8_t* q = out.q + std::size_t(k) * kQuantKBlock;
    for (std::int32_t h = 0; h < 2; ++h) {
      const __m256i qh =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + T::kHighBits + 32 * h));
      for (std::int32_t g = 0; g < 4; ++g) {
        const __m256i ql =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32 * (g % 2)));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (g / 2)), low4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), low2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 128 * h + 32 * g),
                            _mm256_or_si256(low, _mm256_slli_epi16(high, 4)));
      }
    }
  }
}

PAGEDATTN_VNNI void UnpackRow(WeightFormat f, const std::uint8_t* row, std::int32_t in,
                              const ColumnOut& out) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return UnpackRow32<WeightFormat::kQ8_0>(row, in, out);
    case WeightFormat::kQ4_0:
      return UnpackRow32<WeightFormat::kQ4_0>(row, in, out);
    case WeightFormat::kQ4_1:
      return UnpackRow32<WeightFormat::kQ4_1>(row, in, out);
    case WeightFormat::kQ5_0:
      return UnpackRow32<WeightFormat::kQ5_0>(row, in, out);
    case WeightFormat::kQ5_1:
      return UnpackRow32<WeightFormat::kQ5_1>(row, in, out);
    case WeightFormat::kQ4_K:
      return UnpackRowK45<WeightFormat::kQ4_K>(row, in, out);
    case WeightFormat::kQ5_K:
      return UnpackRowK45<WeightFormat::kQ5_K>(row, in, out);
    case WeightFormat::kQ6_K:
      return UnpackRowQ6K(row, in, out);
    default:
      return;
  }
}

// dst[t][c] = src[c][t] for 16 rows of 16 dwords (src rows `stride` bytes
// apart, dst 64 bytes a row): unpacks of dwords and qwords within 128-bit
// blocks, then two rounds of block shuffles.
PAGEDATTN_VNNI void Transpose16x16(const std::uint8_t* src, std::size_t stride, std::uint8_t* dst) {
  __m512i r[16], t[16];
  for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(src + std::size_t(c) * stride);
  for (int i = 0; i < 8; ++i) {  // block b of t[2i]: r[2i][4b], r[2i+1][4b], r[2i][4b+1], ...
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // block b of r[4i + j]: rows 4i .. 4i + 3 of dword 4b + j
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i even_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);  // blocks 0, 2
    const __m512i odd_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);   // blocks 1, 3
    const __m512i even_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    _mm512_storeu_si512(dst + 64 * j, _mm512_shuffle_i32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_si512(dst + 64 * (8 + j), _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd));
    _mm512_storeu_si512(dst + 64 * (4 + j), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_si512(dst + 64 * (12 + j), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd));
  }
}

// A pass of rows of x: int8 values, their scale per 32, the exact sum of x
// per 32 (for the mins) and -zero x the sum of the int8 values per S.
struct PassRows {
  std::int8_t* x8;      // [rows][in]
  float* dx;            // [rows][in / 32]
  float* xsums;         // [rows][in / 32]
  std::int32_t* zsums;  // [rows][in / S]
};

// A group of kGroupColumns weight rows in the layouts above. Columns past
// the group's end are zero.
struct Group {
  std::uint8_t* quants;  // [padded in / 4][16] dwords
  float* scales;         // [in / S][16]
  float* mins;           // [in / 32][16]
  std::uint8_t* rows;    // [16][padded in]: the unpacked rows before transposing
};

// The padded length of a row of quants: whole 64-byte vectors.
std::size_t PaddedIn(std::int32_t in) {
  return (std::size_t(in) + 63) / 64 * 64;
}

PAGEDATTN_VNNI void PackGroup(const DotTilesArgs& a, std::int32_t o, std::int32_t count,
                              const Group& g) {
  const Int8Layout layout = layout_of(a.format);
  const std::size_t padded = PaddedIn(a.in);
  const std::int64_t row_bytes = weight_row_bytes(a.format, a.in);
  const auto* w = static_cast<const std::uint8_t*>(a.w);
  if (count < kGroupColumns) {  // zero columns (and the padding) multiply to nothing
    std::memset(g.rows, 0, kGroupColumns * padded);
    std::memset(g.scales, 0, sizeof(float) * kGroupColumns * std::size_t(a.in / layout.sub));
    std::memset(g.mins, 0, sizeof(float) * kGroupColumns * std::size_t(a.in / 32));
  } else if (padded != std::size_t(a.in)) {
    for (std::int32_t c = 0; c < kGroupColumns; ++c)
      std::memset(g.rows + c * padded + a.in, 0, padded - std::size_t(a.in));
  }
  for (std::int32_t c = 0; c < count; ++c)
    UnpackRow(a.format, w + (o + c) * row_bytes, a.in,
              {g.rows + c * padded, g.scales + c, g.mins + c});
  for (std::size_t at = 0; at < padded; at += 64)
    Transpose16x16(g.rows + at, padded, g.quants + at * kGroupColumns);
}

// The sum of 32 int8 values: xor 0x80 makes them unsigned (+128 each),
// vpsadbw adds each 8 of them.
PAGEDATTN_VNNI inline std::int32_t SumOf32(const std::int8_t* x8) {
  const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8)),
                                     _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i sums = _mm256_sad_epu8(u, _mm256_setzero_si256());  // 4 x 64-bit
  const __m128i pair =
      _mm_add_epi64(_mm256_castsi256_si128(sums), _mm256_extracti128_si256(sums, 1));
  return static_cast<std::int32_t>(_mm_cvtsi128_si64(pair) + _mm_extract_epi64(pair, 1)) - 32 * 128;
}

PAGEDATTN_VNNI void QuantizePass(const DotTilesArgs& a, std::int32_t first, std::int32_t rows,
                                 const PassRows& p) {
  const Int8Layout layout = layout_of(a.format);
  const std::int32_t in = a.in, blocks = in / 32, subs = in / layout.sub;
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* x = a.x + std::size_t(first + r) * in;
    std::int8_t* x8 = p.x8 + std::size_t(r) * in;
    quantize_activations_q8(x, in, x8, p.dx + std::size_t(r) * blocks);
    if (layout.mins)
      for (std::int32_t b = 0; b < blocks; ++b) {
        __m512 s = _mm512_add_ps(_mm512_loadu_ps(x + 32 * b), _mm512_loadu_ps(x + 32 * b + 16));
        p.xsums[std::size_t(r) * blocks + b] = _mm512_reduce_add_ps(s);
      }
    std::int32_t* zsums = p.zsums + std::size_t(r) * subs;
    if (layout.zero == 0) {
      std::fill_n(zsums, subs, 0);
    } else if (layout.sub == 32) {
      for (std::int32_t s = 0; s < subs; ++s) zsums[s] = -layout.zero * SumOf32(x8 + 32 * s);
    } else {  // 16: the halves of each 32
      for (std::int32_t s = 0; s < subs; ++s) {
        std::int32_t sum = 0;
        for (std::int32_t i = 0; i < 16; ++i) sum += x8[16 * s + i];
        zsums[s] = -layout.zero * sum;
      }
    }
  }
}

// y[r][0..cols) (+)= the R rows of the pass from `row` times the group's
// columns. Per row and column: one int32 sum per S inputs (exact), then
// total += (sum * dx) * scale (+ min * xsum per 32 inputs) in f32, in input
// order: the same operations whatever R, the column's lane or the pass.
template <std::int32_t R, std::int32_t kSub, bool kMins>
PAGEDATTN_VNNI void Tile(const PassRows& p, std::int32_t row, const Group& g, std::int32_t in,
                         std::int32_t cols, float* y, std::int32_t ldy, bool accumulate) {
  constexpr std::int32_t kSteps = kSub / 4;
  const std::int32_t subs = in / kSub, blocks = in / 32;
  const std::int8_t* x8[R];
  const float* dx[R];
  const float* xsums[R];
  const std::int32_t* zsums[R];
  __m512 total[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x8[r] = p.x8 + std::size_t(row + r) * in;
    dx[r] = p.dx + std::size_t(row + r) * blocks;
    xsums[r] = p.xsums + std::size_t(row + r) * blocks;
    zsums[r] = p.zsums + std::size_t(row + r) * subs;
    total[r] = _mm512_setzero_ps();
  }
  const auto* quants = reinterpret_cast<const __m512i*>(g.quants);
  for (std::int32_t s = 0; s < subs; ++s) {
    __m512i sum[R];
    for (std::int32_t r = 0; r < R; ++r) sum[r] = _mm512_set1_epi32(zsums[r][s]);
    for (std::int32_t t = 0; t < kSteps; ++t) {
      const __m512i w = _mm512_load_si512(quants + s * kSteps + t);
      for (std::int32_t r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, x8[r] + s * kSub + 4 * t, sizeof four);
        sum[r] = _mm512_dpbusd_epi32(sum[r], w, _mm512_set1_epi32(four));
      }
    }
    const __m512 scale = _mm512_load_ps(g.scales + std::size_t(s) * kGroupColumns);
    const std::int32_t block = s * kSub / 32;
    for (std::int32_t r = 0; r < R; ++r)
      total[r] = _mm512_fmadd_ps(
          _mm512_mul_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_set1_ps(dx[r][block])), scale, total[r]);
    if constexpr (kMins) {
      const __m512 min = _mm512_load_ps(g.mins + std::size_t(s) * kGroupColumns);
      for (std::int32_t r = 0; r < R; ++r)
        total[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(xsums[r][s]), total[r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
  for (std::int32_t r = 0; r < R; ++r) {
    float* out = y + std::size_t(r) * ldy;
    __m512 v = total[r];
    if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
    _mm512_mask_storeu_ps(out, mask, v);
  }
}

template <std::int32_t kSub, bool kMins>
PAGEDATTN_VNNI void GroupTimesPass(const DotTilesArgs& a, const PassRows& p, std::int32_t rows,
                                   const Group& g, std::int32_t cols, float* y) {
  Int8RowTiles::VisitAll(0, rows, [&](auto tile, std::int32_t row) PAGEDATTN_VNNI {
    Tile<decltype(tile)::value, kSub, kMins>(p, row, g, a.in, cols, y + std::size_t(row) * a.ldy,
                                             a.ldy, a.accumulate);
  });
}

// Floats of scratch for `in`: the group (its quants twice: unpacked and
// transposed; scales; mins), then a pass of rows.
struct ScratchPlan {
  std::size_t quants, scales, mins, x8, blocks, zsums, total;  // in floats
  explicit ScratchPlan(std::int32_t in)
      : quants(PaddedIn(in) * kGroupColumns / sizeof(float)),
        scales(std::size_t(in)),  // at most in / 16 scales per column
        mins(std::size_t(in) / 2),
        x8(std::size_t(kPassRows) * in / sizeof(float)),
        blocks(std::size_t(kPassRows) * in / 32),
        zsums(std::size_t(kPassRows) * in / 16),
        total(2 * quants + scales + mins + x8 + 2 * blocks + zsums) {}
};

PAGEDATTN_VNNI void DotTilesInt8(const DotTilesArgs& a, std::int32_t out_begin,
                                 std::int32_t out_end, core::CacheLineVector<float>& scratch) {
  const ScratchPlan plan(a.in);
  scratch.resize(plan.total);
  float* at = scratch.data();  // every part a whole number of 64-byte lines
  const auto take = [&](std::size_t floats) {
    float* part = at;
    at += floats;
    return part;
  };
  const Group g{reinterpret_cast<std::uint8_t*>(take(plan.quants)), take(plan.scales),
                take(plan.mins), reinterpret_cast<std::uint8_t*>(take(plan.quants))};
  const PassRows p{reinterpret_cast<std::int8_t*>(take(plan.x8)), take(plan.blocks),
                   take(plan.blocks), reinterpret_cast<std::int32_t*>(take(plan.zsums))};
  const Int8Layout layout = layout_of(a.format);
  for (std::int32_t first = 0; first < a.rows; first += kPassRows) {
    const std::int32_t rows = std::min(kPassRows, a.rows - first);
    QuantizePass(a, first, rows, p);
    float* y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; o += kGroupColumns) {
      const std::int32_t count = std::min(kGroupColumns, out_end - o);
      PackGroup(a, o, count, g);
      if (o + count < out_end)
        prefetch_weight_rows(a, o + count, std::min(kGroupColumns, out_end - o - count));
      if (layout.sub == 16)
        GroupTimesPass<16, false>(a, p, rows, g, count, y + o);
      else if (layout.mins)
        GroupTimesPass<32, true>(a, p, rows, g, count, y + o);
      else
        GroupTimesPass<32, false>(a, p, rows, g, count, y + o);
    }
  }
}

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

bool dot_tiles_int8_available() {
  static const bool available = dispatched_features().avx512_vnni;
  return available;
}

void dot_tiles_int8(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                    core::CacheLineVector<float>& scratch) {
  DotTilesInt8(a, out_begin, out_end, scratch);
}

#else

bool dot_tiles_int8_available() {
  return false;
}

void dot_tiles_int8(const DotTilesArgs&, std::int32_t, std::int32_t,
                    core::CacheLineVector<float>&) {
  throw InvalidArgument("dot_tiles_int8: no int8 tiles on this architecture");
}

#endif

}  // namespace pagedattn::engine
