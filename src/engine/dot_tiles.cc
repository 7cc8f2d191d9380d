// dot_tiles (dot_tiles.h): R rows x 4 weight columns per tile, one f32
// accumulator vector per (row, column) pair, so each step loads R + 4
// vectors for 4R multiply-adds; R is as large as the vector registers
// allow. The four columns of a row are summed across lanes together.
#include "engine/dot_tiles.h"

#include <algorithm>
#include <cstring>

#include "kernels/cpu/prefetch.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/dot_tiles.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h: PAGEDATTN_BF16_DOT_TARGET and _ATTR.
#include "kernels/cpu/bf16_dot-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::CappedTag<float, 16>;
using VF = hn::Vec<DF>;
using D4 = hn::CappedTag<float, 4>;

constexpr std::int32_t kTileColumns = 4;
// Rows per tile: R * 4 accumulators + R rows of x + one weight vector fit
// in 16 registers (x86 before AVX-512) for R = 3, in 32 for R = 4.
#if HWY_ARCH_X86 && HWY_TARGET > HWY_AVX3
constexpr std::int32_t kTileRows = 3;
#else
constexpr std::int32_t kTileRows = 4;
#endif

// out[c] (+)= the lane sum of the c-th of a, b, c, d for c < cols: the
// same tree for each sum whatever its place.
#if HWY_TARGET == HWY_SCALAR
HWY_INLINE void StoreSums(VF a, VF b, VF c, VF d, std::int32_t cols, float* out, bool accumulate) {
  const float sums[kTileColumns] = {hn::GetLane(a), hn::GetLane(b), hn::GetLane(c), hn::GetLane(d)};
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
  if (cols == kTileColumns) {
    if (accumulate) sums = hn::Add(hn::LoadU(d4, out), sums);
    return hn::StoreU(sums, d4, out);
  }
  alignas(16) float lanes[kTileColumns];
  hn::Store(sums, d4, lanes);
  for (std::int32_t i = 0; i < cols; ++i) out[i] = accumulate ? out[i] + lanes[i] : lanes[i];
}
#endif

// y[r][c] (+)= x[r] . w[c] for R rows of x and `cols` (1-4) weight rows;
// w[c] for c >= cols repeat a valid row and are not stored.
template <std::int32_t R>
HWY_INLINE void Tile(const float* x, std::int32_t in, const float* const* w, std::int32_t cols,
                     float* y, std::int32_t ldy, bool accumulate) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  VF acc[R][kTileColumns];
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < kTileColumns; ++c) acc[r][c] = hn::Zero(df);
  for (std::size_t i = 0; i < std::size_t(in); i += n) {
    VF xv[R];
    for (std::int32_t r = 0; r < R; ++r) xv[r] = hn::LoadU(df, x + std::size_t(r) * in + i);
    for (std::int32_t c = 0; c < kTileColumns; ++c) {
      const VF wv = hn::LoadU(df, w[c] + i);
      for (std::int32_t r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(wv, xv[r], acc[r][c]);
    }
  }
  for (std::int32_t r = 0; r < R; ++r)
    StoreSums(acc[r][0], acc[r][1], acc[r][2], acc[r][3], cols, y + std::size_t(r) * ldy,
              accumulate);
}

// run(rows, r) for the tiles of R = rows::value rows starting at r that
// cover `count` rows: kTileRows at a time, then the rest in one tile.
template <class Run>
HWY_INLINE void ForRowTiles(std::int32_t count, const Run& run) {
  std::int32_t r = 0;
  for (; r + kTileRows <= count; r += kTileRows)
    run(std::integral_constant<std::int32_t, kTileRows>(), r);
  switch (count - r) {
    case 1:
      return run(std::integral_constant<std::int32_t, 1>(), r);
    case 2:
      return run(std::integral_constant<std::int32_t, 2>(), r);
    case 3:
      if constexpr (kTileRows > 3) return run(std::integral_constant<std::int32_t, 3>(), r);
      break;
    default:
      break;
  }
}

// The weight rows of tile c0 of a group of `count` as pointers (rows past
// the group's end repeat its last row) and how many are real.
template <typename T>
HWY_INLINE std::int32_t TileColumns(const T* group, std::size_t stride, std::int32_t count,
                                    std::int32_t c0, const T** w) {
  const std::int32_t cols = std::min(kTileColumns, count - c0);
  for (std::int32_t c = 0; c < kTileColumns; ++c)
    w[c] = group + std::size_t(c0 + std::min(c, cols - 1)) * stride;
  return cols;
}

// Asks for the next group's quantised weights (from row o) while this
// group's tiles compute: the groups are read in bursts between long runs of
// arithmetic, which the hardware prefetchers do not run ahead of, so
// without this each dequantisation waited on memory.
HWY_INLINE void PrefetchGroup(const DotTilesArgs& a, std::int32_t o, std::int32_t out_end) {
  if (a.format == WeightFormat::kF32 || o >= out_end) return;
  const std::int64_t row_bytes = weight_row_bytes(a.format, a.in);
  const auto* begin = static_cast<const std::uint8_t*>(a.w) + o * row_bytes;
  const std::int64_t bytes = std::min(kDotTileGroup, out_end - o) * row_bytes;
  constexpr auto kLine = static_cast<std::int64_t>(kernels::kLineBytes);
  for (std::int64_t at = 0; at < bytes; at += kLine) hwy::Prefetch(begin + at);
}

// The group of `count` weight rows from row o, as f32 rows of a.in: the
// weights themselves (f32) or dequantised into `buffer`.
HWY_INLINE const float* GroupRows(const DotTilesArgs& a, std::int32_t o, std::int32_t count,
                                  float* buffer) {
  if (a.format == WeightFormat::kF32) return static_cast<const float*>(a.w) + std::size_t(o) * a.in;
  dequantize_weight_rows(a.w, a.format, a.in, o, count, buffer);
  return buffer;
}

// The loops both element types share: rows in passes of `pass_rows`
// (pass(first, rows) returns the pass's x rows of T), weight rows in groups
// of kDotTileGroup (group(o, count) returns them as T rows of a.in, and the
// next group is prefetched meanwhile), each group in tiles of
// kTileColumns weight rows by up to kTileRows x rows:
// tile(R, x, w, cols, y) for the R rows at x and the tile's y.
template <typename T, class Pass, class Group, class RunTile>
HWY_INLINE void ForEachTile(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                            std::int32_t pass_rows, const Pass& pass, const Group& group,
                            const RunTile& tile) {
  const std::size_t in = std::size_t(a.in);
  for (std::int32_t first = 0; first < a.rows; first += pass_rows) {
    const std::int32_t rows = std::min(pass_rows, a.rows - first);
    const T* x = pass(first, rows);
    float* y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; o += kDotTileGroup) {
      const std::int32_t count = std::min(kDotTileGroup, out_end - o);
      const T* rows_of_group = group(o, count);
      PrefetchGroup(a, o + count, out_end);
      for (std::int32_t c0 = 0; c0 < count; c0 += kTileColumns) {
        const T* w[kTileColumns];
        const std::int32_t cols = TileColumns(rows_of_group, in, count, c0, w);
        ForRowTiles(rows, [&](auto tile_rows, std::int32_t r) {
          tile(tile_rows, x + std::size_t(r) * in, w, cols, y + std::size_t(r) * a.ldy + o + c0);
        });
      }
    }
  }
}

void DotTilesF32(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                 core::CacheLineVector<float>& scratch) {
  if (a.format != WeightFormat::kF32) scratch.resize(std::size_t(kDotTileGroup) * a.in);
  float* group = scratch.data();
  ForEachTile<float>(
      a, out_begin, out_end, kDotTileRows,
      [&](std::int32_t first, std::int32_t) { return a.x + std::size_t(first) * a.in; },
      [&](std::int32_t o, std::int32_t count) { return GroupRows(a, o, count, group); },
      [&](auto rows, const float* x, const float* const* w, std::int32_t cols, float* y) {
        Tile<decltype(rows)::value>(x, a.in, w, cols, y, a.ldy, a.accumulate);
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
template <std::int32_t R>
PAGEDATTN_BF16_ATTR void TileBf16(const std::uint16_t* x, std::int32_t in,
                                  const std::uint16_t* const* w, std::int32_t cols, float* y,
                                  std::int32_t ldy, bool accumulate) {
  __m512 acc[R][kTileColumns];
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < kTileColumns; ++c) acc[r][c] = _mm512_setzero_ps();
  for (std::size_t i = 0; i < std::size_t(in); i += 32) {
    __m512bh xv[R];
    for (std::int32_t r = 0; r < R; ++r)
      xv[r] = (__m512bh)_mm512_loadu_si512(x + std::size_t(r) * in + i);
    for (std::int32_t c = 0; c < kTileColumns; ++c) {
      const auto wv = (__m512bh)_mm512_loadu_si512(w[c] + i);
      for (std::int32_t r = 0; r < R; ++r) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], wv, xv[r]);
    }
  }
  for (std::int32_t r = 0; r < R; ++r)
    StoreSums(VF{acc[r][0]}, VF{acc[r][1]}, VF{acc[r][2]}, VF{acc[r][3]}, cols,
              y + std::size_t(r) * ldy, accumulate);
}

// scratch: the f32 group, then (as bf16) the group and kBf16Pass rows of x.
void DotTilesBf16(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                  core::CacheLineVector<float>& scratch) {
  const std::size_t in = std::size_t(a.in), group_floats = std::size_t(kDotTileGroup) * in;
  scratch.resize(group_floats + group_floats / 2 + std::size_t(kBf16Pass) * in / 2);
  float* group = scratch.data();  // in: a multiple of 32, so all three start on a line
  auto* group16 = reinterpret_cast<std::uint16_t*>(group + group_floats);
  std::uint16_t* x16 = group16 + group_floats;
  ForEachTile<std::uint16_t>(
      a, out_begin, out_end, kBf16Pass,
      [&](std::int32_t first, std::int32_t rows) {
        ToBf16(a.x + std::size_t(first) * in, std::size_t(rows) * in, x16);
        return static_cast<const std::uint16_t*>(x16);
      },
      [&](std::int32_t o, std::int32_t count) {
        GroupToBf16(a, o, count, group, group16);
        return static_cast<const std::uint16_t*>(group16);
      },
      [&](auto rows, const std::uint16_t* x, const std::uint16_t* const* w, std::int32_t cols,
          float* y) { TileBf16<decltype(rows)::value>(x, a.in, w, cols, y, a.ldy, a.accumulate); });
}
#endif

void DotTiles(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
              core::CacheLineVector<float>& scratch) {
#if PAGEDATTN_BF16_DOT_TARGET
  if (a.bf16) return DotTilesBf16(a, out_begin, out_end, scratch);
#endif
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

void dot_tiles(const DotTilesArgs& args, std::int32_t out_begin, std::int32_t out_end,
               core::CacheLineVector<float>& scratch) {
  require(args.in > 0 && args.in % kQuantBlock == 0, "dot_tiles: in = ", args.in,
          " is not a positive multiple of ", kQuantBlock);
  DotTilesArgs a = args;
  a.bf16 = a.bf16 && dot_tiles_bf16_available();
  HWY_DYNAMIC_DISPATCH(DotTiles)(a, out_begin, out_end, scratch);
}

}  // namespace pagedattn::engine
#endif
