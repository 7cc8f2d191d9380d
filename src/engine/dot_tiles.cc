// dot_tiles (dot_tiles.h): R rows x 4 weight columns per tile, one f32
// accumulator vector per (row, column) pair, so each step loads R + 4
// vectors for 4R multiply-adds; R is as large as the vector registers
// allow. The four columns of a row are summed across lanes together.
#include "engine/dot_tiles.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <utility>

#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/dot_tiles.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h: PAGEDATTN_BF16_DOT_TARGET and _ATTR; the
// weight decoders.
#include "engine/weight_decode-inl.h"
#include "kernels/cpu/bf16_dot-inl.h"

#ifndef PAGEDATTN_DOT_AMX_ATTR
// The bf16 kernels' target plus the tile instructions.
#define PAGEDATTN_DOT_AMX_ATTR \
  __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))
#endif

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using D4 = hn::CappedTag<float, 4>;

// A tile's shape: the row tiles (kernels::RowGroups: its largest size of x
// rows at a time, then one tile for the rest) by kColumns weight rows (a
// multiple of 4: StoreSums sums four columns at a time).
template <class RowTiles, std::int32_t kColumnsOf>
struct TileShape {
  using Rows = RowTiles;
  static constexpr std::int32_t kColumns = kColumnsOf;
};
using ThreeRows = kernels::RowGroups<3, 2, 1>;
using FourRows = kernels::RowGroups<4, 3, 2, 1>;
// f32: R x C accumulators + R rows of x + one weight vector fit in the
// vector registers: 16 on x86 before AVX-512 (3 x 4), 32 on AVX-512, where
// 3 x 8 reads each x vector (from L2: a pass's rows do not fit in L1) for
// 8 multiply-adds instead of 4 x 4's 4.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
using F32Tile = TileShape<ThreeRows, 4>;
#elif HWY_ARCH_X86
using F32Tile = TileShape<ThreeRows, 8>;
#else
using F32Tile = TileShape<FourRows, 4>;
#endif
// A tile of more than 4 columns passes over its weight rows once per row
// tile, so they have to stay in L1: it takes spans of inputs whose rows fit
// in this many bytes (SmolLM2's 576 inputs in one, its 1,536 in two).
constexpr std::size_t kSpanBytes = std::size_t{24} << 10;
constexpr std::int32_t kSumColumns = 4;

// out[c] (+)= the lane sum of the c-th of a, b, c, d for c < cols: the
// same tree for each sum whatever its place.
#if HWY_TARGET == HWY_SCALAR
HWY_INLINE void StoreSums(VF a, VF b, VF c, VF d, std::int32_t cols, float* out, bool accumulate) {
  const float sums[kSumColumns] = {hn::GetLane(a), hn::GetLane(b), hn::GetLane(c), hn::GetLane(d)};
  for (std::int32_t i = 0; i < cols; ++i) out[i] = accumulate ? out[i] + sums[i] : sums[i];
}
#else
// The sum of v's 128-bit blocks, lane by lane (halving: the same tree for
// every lane).
template <class D>
HWY_INLINE hn::Vec<D4> FoldBlocks(D d, hn::Vec<D> v) {
  if constexpr (hn::MaxLanes(d) <= 4) {
    return v;
  } else {
    const hn::Half<D> dh;
    return FoldBlocks(dh, hn::Add(hn::LowerHalf(dh, v), hn::UpperHalf(dh, v)));
  }
}

HWY_INLINE void StoreSums(VF a, VF b, VF c, VF d, std::int32_t cols, float* out, bool accumulate) {
  const DF df;
  const D4 d4;
  const hn::Repartition<std::uint64_t, DF> d64;
  // Per block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3], likewise c, d.
  const VF ab = hn::Add(hn::InterleaveLower(df, a, b), hn::InterleaveUpper(df, a, b));
  const VF cd = hn::Add(hn::InterleaveLower(df, c, d), hn::InterleaveUpper(df, c, d));
  const auto ab64 = hn::BitCast(d64, ab), cd64 = hn::BitCast(d64, cd);
  const VF abcd = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, ab64, cd64)),
                          hn::BitCast(df, hn::InterleaveUpper(d64, ab64, cd64)));
  auto sums = FoldBlocks(df, abcd);
  if (cols == kSumColumns) {
    if (accumulate) sums = hn::Add(hn::LoadU(d4, out), sums);
    return hn::StoreU(sums, d4, out);
  }
  alignas(16) float lanes[kSumColumns];
  hn::Store(sums, d4, lanes);
  for (std::int32_t i = 0; i < cols; ++i) out[i] = accumulate ? out[i] + lanes[i] : lanes[i];
}
#endif

// Keeps v (a raw vector) in a register: without this GCC folds the weight
// vector's load into each of the tile's R multiply-adds, and a 3 x 8 tile
// then issues 27 loads for 24 multiply-adds, more than the load ports take.
template <class Raw>
HWY_INLINE void KeepInRegister(Raw& v) {
#if HWY_ARCH_X86 && HWY_TARGET != HWY_SCALAR && (defined(__GNUC__) || defined(__clang__))
  asm("" : "+v"(v));
#else
  (void)v;
#endif
}

// y[r][0..cols) (+)= the lane sums of acc[r][0..cols), four at a time.
template <std::int32_t R, std::int32_t C, class V>
HWY_INLINE void StoreTile(const V (&acc)[R][C], std::int32_t cols, float* y, std::int32_t ldy,
                          bool accumulate) {
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < cols; c += kSumColumns)
      StoreSums(VF{acc[r][c]}, VF{acc[r][c + 1]}, VF{acc[r][c + 2]}, VF{acc[r][c + 3]},
                std::min(kSumColumns, cols - c), y + std::size_t(r) * ldy + c, accumulate);
}

// The inputs [begin, end) of one pass of a tile. Where a group's rows do
// not fit in L1 whole, each row tile passes over them in spans, its
// accumulators kept between spans in `partial` (from its first row on, C
// vectors a row): every lane's chain still runs over the inputs in order,
// so a split changes no bits.
struct Span {
  std::size_t begin = 0, end = 0;
  std::size_t in = 0;        // the whole row: the last span ends here
  float* partial = nullptr;  // unused when one span is the whole row
};
constexpr std::size_t kPartialLanes = hn::MaxLanes(DF());

// acc = v, for the f32 tiles' vectors and the bf16 tiles' raw ones.
HWY_INLINE void SetAccumulator(VF& acc, VF v) {
  acc = v;
}
template <class Raw>
HWY_INLINE void SetAccumulator(Raw& acc, VF v) {
  acc = v.raw;
}

// acc[r][c] = 0 at the row's start, else what the previous span left.
template <std::int32_t R, std::int32_t C, class V>
HWY_INLINE void ResumeTile(const Span& s, V (&acc)[R][C]) {
  const DF df;
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < C; ++c) {
      const float* kept = s.partial + (std::size_t(r) * C + c) * kPartialLanes;
      SetAccumulator(acc[r][c], s.begin == 0 ? hn::Zero(df) : hn::LoadU(df, kept));
    }
}

// The row's sums stored (its last span), else acc kept for the next span.
template <std::int32_t R, std::int32_t C, class V>
HWY_INLINE void EndSpan(const Span& s, const V (&acc)[R][C], std::int32_t cols, float* y,
                        std::int32_t ldy, bool accumulate) {
  if (s.end == s.in) return StoreTile(acc, cols, y, ldy, accumulate);
  const DF df;
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < C; ++c)
      hn::StoreU(VF{acc[r][c]}, df, s.partial + (std::size_t(r) * C + c) * kPartialLanes);
}

// y[r][c] (+)= x[r] . w[c] for R rows of x and `cols` (1-C) weight rows,
// over the span's inputs; w[c] for c >= cols repeat a valid row and are not
// stored.
template <std::int32_t R, std::int32_t C>
HWY_INLINE void Tile(const float* x, const float* const* w, const Span& s, std::int32_t cols,
                     float* y, std::int32_t ldy, bool accumulate) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  VF acc[R][C];
  ResumeTile(s, acc);
  for (std::size_t i = s.begin; i < s.end; i += n) {
    VF xv[R];
    for (std::int32_t r = 0; r < R; ++r) xv[r] = hn::LoadU(df, x + std::size_t(r) * s.in + i);
    for (std::int32_t c = 0; c < C; ++c) {
      VF wv = hn::LoadU(df, w[c] + i);
      if constexpr (C > kSumColumns) KeepInRegister(wv.raw);
      for (std::int32_t r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(wv, xv[r], acc[r][c]);
    }
  }
  EndSpan(s, acc, cols, y, ldy, accumulate);
}

// The weight rows of tile c0 of a group of `count` as kColumns pointers
// (rows past the group's end repeat its last row) and how many are real.
template <std::int32_t kColumns, typename T>
HWY_INLINE std::int32_t TileColumns(const T* group, std::size_t stride, std::int32_t count,
                                    std::int32_t c0, const T** w) {
  const std::int32_t cols = std::min(kColumns, count - c0);
  for (std::int32_t c = 0; c < kColumns; ++c)
    w[c] = group + std::size_t(c0 + std::min(c, cols - 1)) * stride;
  return cols;
}

// The group of `count` weight rows from row o, as f32 rows of a.in: the
// weights themselves (f32) or dequantised into `buffer`.
HWY_INLINE const float* GroupRows(const DotTilesArgs& a, std::int32_t o, std::int32_t count,
                                  float* buffer) {
  if (a.format == WeightFormat::kF32) return static_cast<const float*>(a.w) + std::size_t(o) * a.in;
  dequantize_weight_rows(a.w, a.format, a.in, o, count, buffer);
  return buffer;
}

// The inputs a tile of Shape on T covers in one span (Span): all of them
// for 4 columns, which the tiles of 4 x rows pass over in turn; else as
// many as fit in kSpanBytes, a multiple of 32 (a vector of bf16).
template <class Shape, typename T>
std::size_t SpanLength(std::size_t in) {
  if constexpr (Shape::kColumns <= kSumColumns) return in;
  const std::size_t fit = kSpanBytes / (Shape::kColumns * sizeof(T)) / 32 * 32;
  return std::min(in, std::max<std::size_t>(32, fit));
}

// Floats of `partial` a pass of `rows` needs (none when one span covers a
// row).
template <class Shape, typename T>
std::size_t PartialFloats(std::size_t in, std::int32_t rows) {
  if (SpanLength<Shape, T>(in) == in) return 0;
  return std::size_t(rows) * Shape::kColumns * kPartialLanes;
}

// The loops both element types share: rows in passes of `pass_rows`
// (pass(first, rows) returns the pass's x rows of T), weight rows in groups
// of kDotTileGroup (group(o, count) returns them as T rows of a.in, and the
// next group is prefetched meanwhile), each group in tiles of
// Shape::kColumns weight rows by Shape::Rows' tiles of x rows, span by span:
// tile(R, x, w, span, cols, y) for the R rows at x and the tile's y.
// `partial`: PartialFloats(a.in, pass_rows) floats.
template <class Shape, typename T, class Pass, class Group, class RunTile>
HWY_INLINE void ForEachTile(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                            std::int32_t pass_rows, float* partial, const Pass& pass,
                            const Group& group, const RunTile& tile) {
  static_assert(kDotTileGroup % Shape::kColumns == 0 && Shape::kColumns % kSumColumns == 0);
  const std::size_t in = std::size_t(a.in), span = SpanLength<Shape, T>(in);
  for (std::int32_t first = 0; first < a.rows; first += pass_rows) {
    const std::int32_t rows = std::min(pass_rows, a.rows - first);
    const T* x = pass(first, rows);
    float* y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; o += kDotTileGroup) {
      const std::int32_t count = std::min(kDotTileGroup, out_end - o);
      const T* rows_of_group = group(o, count);
      if (a.format != WeightFormat::kF32 && o + count < out_end)
        prefetch_weight_rows(a, o + count, std::min(kDotTileGroup, out_end - o - count));
      else if (a.format != WeightFormat::kF32 && first + rows == a.rows && a.next_count > 0)
        prefetch_weight_rows(a, a.next_first, std::min(kDotTileGroup, a.next_count));
      for (std::int32_t c0 = 0; c0 < count; c0 += Shape::kColumns) {
        const T* w[Shape::kColumns];
        const std::int32_t cols = TileColumns<Shape::kColumns>(rows_of_group, in, count, c0, w);
        for (std::size_t begin = 0; begin < in; begin += span) {
          Shape::Rows::VisitAll(0, rows, [&](auto tile_rows, std::int32_t r) {
            const Span s{begin, std::min(in, begin + span), in,
                         partial + std::size_t(r) * Shape::kColumns * kPartialLanes};
            tile(tile_rows, x + std::size_t(r) * in, w, s, cols,
                 y + std::size_t(r) * a.ldy + o + c0);
          });
        }
      }
    }
  }
}

// scratch: the dequantised group (f32 weights are read in place), then the
// partial sums.
void DotTilesF32(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                 core::CacheLineVector<float>& scratch) {
  const std::size_t group_floats =
      a.format == WeightFormat::kF32 ? 0 : std::size_t(kDotTileGroup) * std::size_t(a.in);
  scratch.resize(group_floats + PartialFloats<F32Tile, float>(a.in, kDotTileRows));
  float* group = scratch.data();
  ForEachTile<F32Tile, float>(
      a, out_begin, out_end, kDotTileRows, group + group_floats,
      [&](std::int32_t first, std::int32_t) { return a.x + std::size_t(first) * a.in; },
      [&](std::int32_t o, std::int32_t count) { return GroupRows(a, o, count, group); },
      [&](auto rows, const float* x, const float* const* w, const Span& s, std::int32_t cols,
          float* y) {
        Tile<decltype(rows)::value, F32Tile::kColumns>(x, w, s, cols, y, a.ldy, a.accumulate);
      });
}

// --------------------------------------------- few rows: weights in registers
//
// Batches of at most kRegisterRows rows (a decode step of a few sequences)
// are too short to pay for a group's trip through L1: each tile decodes its
// weight rows in registers instead, with the decoders that
// dequantize_weight_rows stores through (UnitDecoder), and multiplies them
// in the same order into the same per-lane chains, then StoreSums: the
// group path's bits. f32 weights are read in place by both paths already.
// Tiles: R rows x 4 columns (1-4 rows). 8 columns, which give one row twice
// the independent chains, measured faster on a matrix in L2 but slower in a
// decode step, where the weights stream from memory.
constexpr std::int32_t kRegisterColumns = kSumColumns;
using RegisterRowTiles = kernels::RowGroups<4, 3, 2, 1>;

// The decoders of block `offset` of weight rows w[0 .. C), made once per
// block (the K-quants unpack their scales).
template <class Decoder, int... kColumn>
HWY_INLINE std::array<Decoder, sizeof...(kColumn)> DecodersOf(
    const std::uint8_t* const* w, std::int64_t offset, std::integer_sequence<int, kColumn...>) {
  return {Decoder(w[kColumn] + offset)...};
}

// y[r][0..cols) (+)= x[r] . w[c] for R rows of x and C weight rows (w[c]
// for c >= cols repeat a valid row and are not stored).
template <WeightFormat F, std::int32_t R, std::int32_t C>
HWY_INLINE void RegisterTile(const DotTilesArgs& a, const float* x, const std::uint8_t* const* w,
                             std::int32_t cols, float* y) {
  using Decoder = UnitDecoder<F>;
  const DF df;
  const std::size_t n = hn::Lanes(df), in = std::size_t(a.in);
  constexpr std::int32_t kBlockWeights = weight_format_block(F);
  VF acc[R][C];
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  for (std::int64_t b = 0; b < a.in / kBlockWeights; ++b) {
    const std::int64_t offset = b * BlockTraits<F>::kBytes;
    for (std::int32_t c = 0; c < C; ++c)
      PrefetchPast<PrefetchLevel::kL2>(w[c] + offset, BlockTraits<F>::kBytes);
    const auto decoders = DecodersOf<Decoder>(w, offset, std::make_integer_sequence<int, C>());
    for (std::size_t u = 0; u < Decoder::kUnits; ++u) {
      const std::size_t at = std::size_t(b) * kBlockWeights + u * Decoder::kUnitWeights;
      // Unrolled whole, or acc[r][c] would live in memory.
#pragma GCC unroll 8
      for (std::int32_t c = 0; c < C; ++c) {
        VF wv[ChunkSlots<Decoder::kUnitWeights>()];
        decoders[c].Decode(u, wv);
#pragma GCC unroll 16
        for (std::size_t k = 0; k < Decoder::kUnitWeights / n; ++k)
#pragma GCC unroll 4
          for (std::int32_t r = 0; r < R; ++r)
            acc[r][c] =
                hn::MulAdd(wv[k], hn::LoadU(df, x + std::size_t(r) * in + at + k * n), acc[r][c]);
      }
    }
  }
  StoreTile(acc, cols, y, a.ldy, a.accumulate);
}

template <WeightFormat F>
void RegisterTilesOf(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  const std::int64_t row_bytes = weight_row_bytes(F, a.in);
  const auto* weights = static_cast<const std::uint8_t*>(a.w);
  RegisterRowTiles::VisitAll(0, a.rows, [&](auto rows, std::int32_t row) {
    constexpr std::int32_t R = decltype(rows)::value, C = kRegisterColumns;
    for (std::int32_t o = out_begin; o < out_end; o += C) {
      const std::uint8_t* w[C];
      const std::int32_t cols =
          TileColumns<C>(weights + o * row_bytes, std::size_t(row_bytes), out_end - o, 0, w);
      RegisterTile<F, R, C>(a, a.x + std::size_t(row) * a.in, w, cols,
                            a.y + std::size_t(row) * a.ldy + o);
    }
  });
}

void RegisterTiles(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  visit_weight_format(a.format, [&](auto f) {
    if constexpr (f() != WeightFormat::kF32) RegisterTilesOf<f()>(a, out_begin, out_end);
  });
}

#if PAGEDATTN_BF16_DOT_TARGET
// ------------------------------------------------------------ bf16 products
//
// x and the dequantised weights rounded to bf16 (nearest even), multiplied
// on vdpbf16ps: each f32 lane adds the products of a pair of bf16, 32
// multiply-adds per instruction against an FMA's 16. Products are exact in
// f32; sums are f32. Rows go kBf16Pass at a time: the same bytes as
// kDotTileRows f32 rows. Prefill chunks of 2,048 rows take this path too,
// and dequantise each weight group once per pass: passes of 64 rows made
// a 32-stream run (two such chunks, then 128 decode steps) 1.2x as long
// (docs/benchmarks.md, "Batched products").
constexpr std::int32_t kBf16Pass = 2 * kDotTileRows;
// 4 x 4: 3 x 8 tiles (as f32) measured the same on bf16 (Zen 5 VM).
using Bf16Tile = TileShape<FourRows, 4>;

// dst[i] = src[i] as bf16, rounded to nearest even; n: a multiple of 32.
PAGEDATTN_BF16_ATTR void ToBf16(const float* src, std::size_t n, std::uint16_t* dst) {
  for (std::size_t i = 0; i < n; i += 32) {
    const __m512bh pair =
        _mm512_cvtne2ps_pbh(_mm512_loadu_ps(src + i + 16), _mm512_loadu_ps(src + i));
    _mm512_storeu_si512(dst + i, (__m512i)pair);
  }
}

// Q5_0 blocks (f16 d, u32 qh, u8 qs[16]; quant_kernels.h) straight to bf16,
// 32 weights per block: d * (q - 16) in f32, exactly as the dequantiser
// computes it, then rounded. The f32 round trip through the dequantiser
// cost Q4_K_M files (mostly Q5_0 where rows are 576 long) about 1.2x the
// decode step of a Q8_0 file.
PAGEDATTN_BF16_ATTR void Q5_0ToBf16(const std::uint8_t* blocks, std::int64_t count,
                                    std::uint16_t* dst) {
  constexpr std::int64_t kBytes = BlockTraits<WeightFormat::kQ5_0>::kBytes;
  const __m512i low4 = _mm512_set1_epi32(0x0f), sixteen = _mm512_set1_epi32(16);
  for (std::int64_t b = 0; b < count; ++b) {
    const std::uint8_t* block = blocks + b * kBytes;
    std::uint16_t d_bits;
    std::uint32_t qh;
    std::memcpy(&d_bits, block, sizeof d_bits);
    std::memcpy(&qh, block + BlockTraits<WeightFormat::kQ5_0>::kHighBits, sizeof qh);
    const __m512 d = _mm512_set1_ps(f16_bits_to_float(d_bits));
    const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(block + BlockTraits<WeightFormat::kQ5_0>::kQuants)));
    // Weight j < 16: low nibble of qs[j]; j >= 16: high nibble of qs[j - 16];
    // bit j of qh its fifth bit.
    __m512i lo = _mm512_and_si512(q, low4), hi = _mm512_srli_epi32(q, 4);
    lo = _mm512_mask_or_epi32(lo, static_cast<__mmask16>(qh & 0xffff), lo, sixteen);
    hi = _mm512_mask_or_epi32(hi, static_cast<__mmask16>(qh >> 16), hi, sixteen);
    const __m512 w_lo = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(lo, sixteen)), d);
    const __m512 w_hi = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(hi, sixteen)), d);
    _mm512_storeu_si512(dst + b * kQuantBlock, (__m512i)_mm512_cvtne2ps_pbh(w_hi, w_lo));
  }
}

// The group of `count` weight rows from row o as bf16 rows of a.in into
// group16 (f32 scratch for the formats dequantised first).
void GroupToBf16(const DotTilesArgs& a, std::int32_t o, std::int32_t count, float* scratch,
                 std::uint16_t* group16) {
  if (a.format == WeightFormat::kQ5_0) {
    const std::int64_t blocks = a.in / kQuantBlock;
    return Q5_0ToBf16(static_cast<const std::uint8_t*>(a.w) +
                          o * blocks * BlockTraits<WeightFormat::kQ5_0>::kBytes,
                      count * blocks, group16);
  }
  ToBf16(GroupRows(a, o, count, scratch), std::size_t(count) * std::size_t(a.in), group16);
}

// As Tile on bf16 rows: one vdpbf16ps per 32 inputs of a (row, column) pair.
template <std::int32_t R, std::int32_t C>
PAGEDATTN_BF16_ATTR void TileBf16(const std::uint16_t* x, const std::uint16_t* const* w,
                                  const Span& s, std::int32_t cols, float* y, std::int32_t ldy,
                                  bool accumulate) {
  __m512 acc[R][C];
  ResumeTile(s, acc);
  for (std::size_t i = s.begin; i < s.end; i += 32) {
    __m512bh xv[R];
    for (std::int32_t r = 0; r < R; ++r)
      xv[r] = (__m512bh)_mm512_loadu_si512(x + std::size_t(r) * s.in + i);
    for (std::int32_t c = 0; c < C; ++c) {
      auto wv = (__m512bh)_mm512_loadu_si512(w[c] + i);
      if constexpr (C > kSumColumns) KeepInRegister(wv);
      for (std::int32_t r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[r]);
    }
  }
  EndSpan(s, acc, cols, y, ldy, accumulate);
}

// scratch: the f32 group, then (as bf16) the group and kBf16Pass rows of x,
// then the partial sums.
void DotTilesBf16(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                  core::CacheLineVector<float>& scratch) {
  const std::size_t in = std::size_t(a.in), group_floats = std::size_t(kDotTileGroup) * in;
  const std::size_t x_floats = std::size_t(kBf16Pass) * in / 2;
  scratch.resize(group_floats + group_floats / 2 + x_floats +
                 PartialFloats<Bf16Tile, std::uint16_t>(in, kBf16Pass));
  float* group = scratch.data();  // in: a multiple of 32, so all four start on a line
  auto* group16 = reinterpret_cast<std::uint16_t*>(group + group_floats);
  std::uint16_t* x16 = group16 + group_floats;
  float* partial = group + group_floats + group_floats / 2 + x_floats;
  ForEachTile<Bf16Tile, std::uint16_t>(
      a, out_begin, out_end, kBf16Pass, partial,
      [&](std::int32_t first, std::int32_t rows) {
        ToBf16(a.x + std::size_t(first) * in, std::size_t(rows) * in, x16);
        return static_cast<const std::uint16_t*>(x16);
      },
      [&](std::int32_t o, std::int32_t count) {
        GroupToBf16(a, o, count, group, group16);
        return static_cast<const std::uint16_t*>(group16);
      },
      [&](auto rows, const std::uint16_t* x, const std::uint16_t* const* w, const Span& s,
          std::int32_t cols, float* y) {
        TileBf16<decltype(rows)::value, Bf16Tile::kColumns>(x, w, s, cols, y, a.ldy, a.accumulate);
      });
}

// --------------------------------------------------- bf16 on AMX tiles
//
// Where the CPU has AMX-BF16 (dot_tiles_amx_bf16()), the bf16 products run
// on tiles, every batch: a group of kAmxRows weight rows rounded to bf16 is
// an A tile per 32 inputs as the rows lie (16 rows x 32 bf16 at the row
// stride `in`); x's rows, rounded once per pass, are laid out as B tiles
// (per 32 inputs, 16 pairs x 16 rows of x: each 16 rows' 64 bytes
// transposed as dwords); one tdpbf16ps adds the products of 16 weight rows
// x 16 rows of x over 32 inputs into an f32 C tile, which sums all the
// inputs before it is stored once, transposed back into y's rows.
// Products of bf16 are exact in f32 and sums f32, as on vdpbf16ps (in
// another order): the same bound. An output depends only on its row of x
// and its weight row (its own row and column of C), not on the batch.
constexpr std::int32_t kAmxRows = 16;         // of every tile: 16 rows x 64 bytes
constexpr std::int32_t kAmxPass = 128;        // rows of x laid out at a time
constexpr std::size_t kAmxBlockBytes = 1024;  // a B tile: 32 inputs x 16 rows
constexpr kernels::TileConfig kAmxBf16Tiles = kernels::uniform_tile_config(8, kAmxRows, 64);

#define PAGEDATTN_TRANSPOSE_TARGET PAGEDATTN_BF16_ATTR
#include "engine/transpose_dwords-inl.h"
#undef PAGEDATTN_TRANSPOSE_TARGET

// x's rows [0, rows) (at most kAmxPass) rounded to bf16 into B tiles:
// xb[t][i / 32] for row tile t (rows past the end zero). x16: room for
// kAmxRows rows of bf16.
PAGEDATTN_BF16_ATTR void RowsAsTiles(const float* x, std::int32_t rows, std::int32_t in,
                                     std::uint16_t* x16, std::uint8_t* xb) {
  const std::size_t blocks = std::size_t(in) / 32;
  for (std::int32_t t = 0; t * kAmxRows < rows; ++t) {
    const std::uint8_t* src[kAmxRows];
    for (std::int32_t r = 0; r < kAmxRows; ++r) {
      std::uint16_t* row = x16 + std::size_t(r) * in;
      const std::int32_t at = t * kAmxRows + r;
      if (at < rows)
        ToBf16(x + std::size_t(at) * in, std::size_t(in), row);
      else
        std::memset(row, 0, std::size_t(in) * sizeof(std::uint16_t));
      src[r] = reinterpret_cast<const std::uint8_t*>(row);
    }
    for (std::size_t b = 0; b < blocks; ++b)
      TransposeLine(src, 64 * b, xb + (std::size_t(t) * blocks + b) * kAmxBlockBytes);
  }
}

// y[r][0..cols) (+)= the pass's `rows` rows of x (xb) times the group's
// weight rows (group16: kAmxRows bf16 rows of `in`), two row tiles at a
// time sharing each A tile.
PAGEDATTN_DOT_AMX_ATTR void GroupTimesRowsAmx(const std::uint16_t* group16, const std::uint8_t* xb,
                                              std::int32_t in, std::int32_t rows, std::int32_t cols,
                                              float* y, std::int32_t ldy, bool accumulate) {
  const std::size_t blocks = std::size_t(in) / 32;
  const long stride = long(in) * long(sizeof(std::uint16_t));
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
  alignas(64) float sums[2][kAmxRows * kAmxRows], out[kAmxRows * kAmxRows];
  for (std::int32_t t = 0; t * kAmxRows < rows; t += 2) {
    const bool two = (t + 1) * kAmxRows < rows;
    const std::uint8_t* b0 = xb + std::size_t(t) * blocks * kAmxBlockBytes;
    const std::uint8_t* b1 = b0 + blocks * kAmxBlockBytes;
    _tile_zero(0);
    _tile_zero(1);
    for (std::size_t b = 0; b < blocks; ++b) {
      _tile_loadd(4, group16 + 32 * b, stride);
      _tile_loadd(6, b0 + b * kAmxBlockBytes, 64);
      _tile_dpbf16ps(0, 4, 6);
      if (two) {
        _tile_loadd(7, b1 + b * kAmxBlockBytes, 64);
        _tile_dpbf16ps(1, 4, 7);
      }
    }
    _tile_stored(0, sums[0], 64);
    if (two) _tile_stored(1, sums[1], 64);
    for (std::int32_t k = 0; k < (two ? 2 : 1); ++k) {
      const std::uint8_t* src[kAmxRows];  // C's rows: the weight rows
      for (std::int32_t w = 0; w < kAmxRows; ++w)
        src[w] = reinterpret_cast<const std::uint8_t*>(sums[k] + std::size_t(w) * kAmxRows);
      TransposeLine(src, 0, reinterpret_cast<std::uint8_t*>(out));
      const std::int32_t first = (t + k) * kAmxRows, count = std::min(kAmxRows, rows - first);
      for (std::int32_t r = 0; r < count; ++r) {
        float* row = y + std::size_t(first + r) * ldy;
        __m512 v = _mm512_load_ps(out + std::size_t(r) * kAmxRows);
        if (accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, row), v);
        _mm512_mask_storeu_ps(row, mask, v);
      }
    }
  }
}

// scratch: the f32 group, then as bf16 the group, kAmxRows rows of x, and
// a pass's rows as B tiles.
void DotTilesAmxBf16(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                     core::CacheLineVector<float>& scratch) {
  const std::size_t in = std::size_t(a.in), group_floats = std::size_t(kAmxRows) * in;
  const std::size_t tiles = (std::size_t(std::min(a.rows, kAmxPass)) + kAmxRows - 1) / kAmxRows;
  scratch.resize(group_floats + group_floats / 2 + group_floats / 2 +
                 tiles * (in / 32) * kAmxBlockBytes / sizeof(float));
  float* group = scratch.data();  // in: a multiple of 32, so all four start on a line
  auto* group16 = reinterpret_cast<std::uint16_t*>(group + group_floats);
  std::uint16_t* x16 = group16 + group_floats;
  auto* xb = reinterpret_cast<std::uint8_t*>(x16 + group_floats);
  for (std::int32_t first = 0; first < a.rows; first += kAmxPass) {
    const std::int32_t rows = std::min(kAmxPass, a.rows - first);
    RowsAsTiles(a.x + std::size_t(first) * in, rows, a.in, x16, xb);
    kernels::use_tile_config(kAmxBf16Tiles);
    for (std::int32_t o = out_begin; o < out_end; o += kAmxRows) {
      const std::int32_t count = std::min(kAmxRows, out_end - o);
      GroupToBf16(a, o, count, group, group16);
      if (count < kAmxRows)
        std::memset(group16 + std::size_t(count) * in, 0,
                    std::size_t(kAmxRows - count) * in * sizeof(std::uint16_t));
      if (o + count < out_end)
        prefetch_weight_rows(a, o + count, std::min(kAmxRows, out_end - o - count));
      GroupTimesRowsAmx(group16, xb, a.in, rows, count, a.y + std::size_t(first) * a.ldy + o, a.ldy,
                        a.accumulate);
    }
  }
}
#endif

void DotTiles(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
              core::CacheLineVector<float>& scratch) {
#if PAGEDATTN_BF16_DOT_TARGET
  if (a.bf16 && dot_tiles_amx_bf16()) return DotTilesAmxBf16(a, out_begin, out_end, scratch);
  if (a.bf16) return DotTilesBf16(a, out_begin, out_end, scratch);
#endif
  if (a.rows <= kRegisterRows && a.format != WeightFormat::kF32)
    return RegisterTiles(a, out_begin, out_end);
  DotTilesF32(a, out_begin, out_end, scratch);
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {
HWY_EXPORT(DotTiles);

bool dot_tiles_bf16_available() {
  static const bool available = [] {
    const CpuFeatures used = dispatched_features();
    return used.avx512_bf16;
  }();
  return available;
}

bool dot_tiles_amx_bf16() {
  static const bool amx = dot_tiles_bf16_available() && dispatched_features().amx_bf16;
  return amx;
}

void dot_tiles(const DotTilesArgs& args, std::int32_t out_begin, std::int32_t out_end,
               core::CacheLineVector<float>& scratch) {
  require(args.in > 0 && args.in % kQuantBlock == 0, "dot_tiles: in = ", args.in,
          " is not a positive multiple of ", kQuantBlock);
  if (args.int8 && has_int8_products(args.format) && dot_tiles_int8_available())
    return dot_tiles_int8(args, out_begin, out_end, scratch);
  DotTilesArgs a = args;
  a.bf16 = a.bf16 && dot_tiles_bf16_available();
  HWY_DYNAMIC_DISPATCH(DotTiles)(a, out_begin, out_end, scratch);
}

}  // namespace pagedattn::engine
#endif
