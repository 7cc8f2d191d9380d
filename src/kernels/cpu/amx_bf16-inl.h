// The prefill products on AMX tiles (tdpbf16ps: a 16 x 16 f32 tile += a
// 16-row x 32 bf16 tile times a 32 x 16 bf16 tile in word pairs), per target
// (Highway -inl.h pattern). Highway 1.0.3 has no AMX ops: raw intrinsics,
// compiled on the AVX-512 targets with the bf16 kernels
// (PAGEDATTN_BF16_DOT_TARGET) and run only when the CPU reports amx_bf16
// (KernelContext::amx_bf16) - the tile state is then permitted and enabled.
//
// The operands are the bf16 path's packed layouts (bf16_dot-inl.h), which
// are already what the tiles want:
//   A = queries  [rows][dq] bf16: 16 rows x 32 dims per tile (head dims
//                are multiples of 32 on this path);
//   B = keys     [dq / 2][kKeyBlock] words: 16 word rows (32 dims) x 16 keys;
//   C = scores   [rows][kKeyBlock] f32: 16 rows x 16 keys;
//   A = weights  [rows][kKeyBlock] bf16 in the first half of each score row:
//                16 rows x 32 keys;
//   B = values   [kKeyBlock / 2][dv] words: 16 key pairs x 16 dims;
//   C = outputs  [rows][dv] f32: 16 rows x 16 dims, loaded once per step
//                of kTileBlocks blocks, accumulated over the step's blocks
//                and stored back (the online softmax rescales them between
//                steps: SoftmaxStep).
// Rows come in groups of 32 (two A tiles share each B tile) or 16; fewer
// than 16 left over run on vdpbf16ps (bf16_dot-inl.h). Products and sums are
// f32 as on vdpbf16ps; the weights are rounded to bf16 against the step's
// running maximum.
#ifndef PAGEDATTN_KERNELS_CPU_AMX_BF16_MACROS_
#define PAGEDATTN_KERNELS_CPU_AMX_BF16_MACROS_
// The bf16 kernels' target plus the tile instructions (called, never
// inlined, from code without them).
#define PAGEDATTN_AMX_ATTR __attribute__((target(HWY_TARGET_STR ",avx512bf16,amx-tile,amx-bf16")))
#endif

#if defined(PAGEDATTN_KERNELS_CPU_AMX_BF16_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_AMX_BF16_INL_H_
#undef PAGEDATTN_KERNELS_CPU_AMX_BF16_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_AMX_BF16_INL_H_
#endif

#include <hwy/highway.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "kernels/attention_traits.h"
#include "kernels/cpu/amx_tile_config.h"
#include "kernels/cpu/attention_cpu.h"
#include "kernels/cpu/bf16_dot-inl.h"
#include "kernels/cpu/online_softmax-inl.h"
#include "kernels/cpu/reduce16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if PAGEDATTN_BF16_DOT_TARGET

namespace amx {

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
constexpr std::int32_t kTileRows = 16;     // rows of every tile
constexpr std::int32_t kTileBytes = 64;    // bytes of a tile row: 16 f32 or 32 bf16
constexpr std::int32_t kDimsPerStep = 32;  // head dims one A tile of queries covers
static_assert(kKB == 2 * kTileRows,
              "a block's keys are two C tiles of scores, one A tile of weights");
static_assert(kDimsPerStep == kAmxHeadDimMultiple, "amx_head_dims admits whole query tiles");

// Palette 1 with all 8 tiles at 16 rows x 64 bytes: tiles 0-1 hold A,
// 2-3 B, 4-7 C.
inline constexpr TileConfig kTileConfig = uniform_tile_config(8, kTileRows, kTileBytes);

// Loads the configuration on the calling thread; ReleaseTiles gives the
// state back. Kernels configure at the start of each work item: other code
// on the thread may have configured tiles its own way.
PAGEDATTN_AMX_ATTR inline void ConfigureTiles() {
  use_tile_config(kTileConfig);
}

PAGEDATTN_AMX_ATTR inline void ReleaseTiles() {
  _tile_release();
}

// Runs tiles(std::integral_constant<int, 2>, r) for each 32 rows from row0
// (two 16-row tiles), then tiles(std::integral_constant<int, 1>, r) for 16
// more if they fit; returns the first row left over (fewer than 16).
template <class Tiles>
HWY_INLINE std::int32_t ForEachTile(std::int32_t row0, std::int32_t row_end, const Tiles& tiles) {
  std::int32_t r = row0;
  for (; r + 2 * kTileRows <= row_end; r += 2 * kTileRows)
    tiles(std::integral_constant<int, 2>{}, r);
  for (; r + kTileRows <= row_end; r += kTileRows) tiles(std::integral_constant<int, 1>{}, r);
  return r;
}

// Scores of 32 (kGroups = 2) or 16 rows x kKB keys into s, the queries from
// q (row stride dq bf16), the keys packed (bf16dot::PackKeys).
template <int kGroups>
PAGEDATTN_AMX_ATTR inline void ScoreTiles(const std::uint16_t* q, std::size_t dq,
                                          const std::uint32_t* kt, std::size_t dim, float* s) {
  const std::size_t q_stride = dq * sizeof(std::uint16_t);
  constexpr std::size_t kKeyStride = kKB * sizeof(std::uint32_t),
                        kScoreStride = kKB * sizeof(float);
  _tile_zero(4);
  _tile_zero(5);
  if constexpr (kGroups == 2) {
    _tile_zero(6);
    _tile_zero(7);
  }
  for (std::size_t d = 0; d < dim; d += kDimsPerStep) {
    const std::uint32_t* k = kt + d / 2 * kKB;  // word row d / 2
    _tile_loadd(2, k, kKeyStride);
    _tile_loadd(3, k + kTileRows, kKeyStride);
    _tile_loadd(0, q + d, q_stride);
    _tile_dpbf16ps(4, 0, 2);
    _tile_dpbf16ps(5, 0, 3);
    if constexpr (kGroups == 2) {
      _tile_loadd(1, q + kTileRows * dq + d, q_stride);
      _tile_dpbf16ps(6, 1, 2);
      _tile_dpbf16ps(7, 1, 3);
    }
  }
  _tile_stored(4, s, kScoreStride);
  _tile_stored(5, s + kTileRows, kScoreStride);
  if constexpr (kGroups == 2) {
    _tile_stored(6, s + kTileRows * kKB, kScoreStride);
    _tile_stored(7, s + kTileRows * kKB + kTileRows, kScoreStride);
  }
}

// Blocks a scoring pass covers: each 32-row group scores the pass's blocks
// one after the other, so its query tiles come from L2 once a pass (the
// item's queries, 64 KiB at 256 rows x head dim 128, do not fit L1) and from
// L1 for the other blocks, while the pass's packed keys (8 KiB a block at
// head dim 128) stay in L1 from group to group.
constexpr int kPassBlocks = 2;

// A step's keys, scored: block b's packed keys (bf16dot::PackKeys) at
// kt + b * k_block words, its scores at s + b * s_block floats, x
// k_scales[b] when given.
struct StepScores {
  const std::uint32_t* kt;
  std::size_t k_block;
  float* s;
  std::size_t s_block;
  const float* const* k_scales;
  int blocks;  // 1 to kTileBlocks
};

// Scores rows [row0, row_end) of the bf16 queries (row stride dq) against
// a step's keys (head dim `dim`, a multiple of 32), in passes of
// kPassBlocks blocks; rows past the last whole tile run on vdpbf16ps.
PAGEDATTN_AMX_ATTR inline void ScoreStep(const std::uint16_t* q, std::size_t dq, std::size_t dim,
                                         const StepScores& ss, std::int32_t row0,
                                         std::int32_t row_end) {
  for (int first = 0; first < ss.blocks; first += kPassBlocks) {
    const int last = std::min(ss.blocks, first + kPassBlocks);
    const std::int32_t r = ForEachTile(row0, row_end, [&](auto groups, std::int32_t t) {
      for (int b = first; b < last; ++b)
        ScoreTiles<decltype(groups)::value>(q + std::size_t(t) * dq, dq, ss.kt + b * ss.k_block,
                                            dim, ss.s + b * ss.s_block + std::size_t(t) * kKB);
    });
    for (int b = first; b < last; ++b) {
      const float* k_scale = ss.k_scales ? ss.k_scales[b] : nullptr;
      float* s = ss.s + b * ss.s_block;
      if (k_scale != nullptr) {
        const __m512 k0 = _mm512_loadu_ps(k_scale), k1 = _mm512_loadu_ps(k_scale + 16);
        for (std::int32_t t = row0; t < r; ++t) {
          float* x = s + std::size_t(t) * kKB;
          _mm512_store_ps(x, _mm512_mul_ps(_mm512_load_ps(x), k0));
          _mm512_store_ps(x + 16, _mm512_mul_ps(_mm512_load_ps(x + 16), k1));
        }
      }
      if (r < row_end)
        bf16dot::ScoreBlock<0>(q, dq, ss.kt + b * ss.k_block, dim, k_scale, s, r, row_end);
    }
  }
}

// Stores a row's 32 weights rounded to bf16 in the first half of its score
// row (what bf16dot::RoundWeights leaves), from the softmax's registers; the
// weights' exp to degree 3 (7.5e-5 relative) with the fused shift, as the
// rounding (2^-9) swamps the rest.
struct StoreWeightsBf16 {
  static constexpr int kExpDegree = 3;
  static constexpr bool kFusedShift = true;
  PAGEDATTN_AMX_ATTR void operator()(float* x, __m512 w0, __m512 w1) const {
    _mm512_store_si512(x, (__m512i)_mm512_cvtne2ps_pbh(w1, w0));
  }
};

// The online-softmax update of a step's rows [row0, row_end) over its
// `blocks` score arrays (s, block_stride floats apart; m, l, o of the item),
// leaving bf16 weights for the tiles: softmax16::UpdateBlocks, 16 rows at a
// time. v_scales: per block, the V scales (quantised KV) or null.
PAGEDATTN_AMX_ATTR inline void SoftmaxStep(float* s, std::size_t block_stride, int blocks, float* m,
                                           float* l, float* o, std::size_t dv, std::size_t v_dim,
                                           const float* const* v_scales, std::int32_t row0,
                                           std::int32_t row_end) {
  for (std::int32_t r = row0; r < row_end; r += softmax16::kMaxRows)
    softmax16::UpdateBlocks(s + std::size_t(r) * kKB, block_stride, blocks, m + r, l + r,
                            o + std::size_t(r) * dv, dv, v_dim, v_scales,
                            std::min<std::int32_t>(softmax16::kMaxRows, row_end - r),
                            StoreWeightsBf16{});
}

// A step's blocks, laid out side by side: block b's scores (then weights)
// at s + b * s_block floats ([rows][kKB] each), its packed values at
// vp + b * v_block words.
struct StepBlocks {
  const float* s;
  std::size_t s_block;
  const std::uint32_t* vp;
  std::size_t v_block;
  int blocks;  // 1 to kTileBlocks
};

// o[32 (kGroups = 2) or 16 rows] += weights x values for the 16 x kDimTiles
// dims from column d over all of a step's blocks (the weights from row t):
// C tiles loaded from o once, accumulated over every block's 16 key pairs
// (A tiles 0, 1: the block's weights of rows 0-15, 16-31; B tiles 2, 3: its
// values of the two dim tiles) and stored back. Tile numbers are assembler
// literals: C tiles 4, 5 (rows 0-15) and 6, 7 (rows 16-31) for two dim
// tiles; 4 and 6 for one.
template <int kGroups, int kDimTiles>
PAGEDATTN_AMX_ATTR inline void AccumulateTiles(const StepBlocks& sb, std::int32_t t, std::size_t d,
                                               std::size_t dv, float* o) {
  static_assert(kGroups >= 1 && kGroups <= 2 && kDimTiles >= 1 && kDimTiles <= 2, "C tiles 4-7");
  constexpr std::size_t kWeightStride = kKB * sizeof(float);
  const std::size_t ob = dv * sizeof(float), vb = dv * sizeof(std::uint32_t);
  float* o1 = o + kTileRows * dv;  // rows 16-31
  _tile_loadd(4, o, ob);
  if constexpr (kDimTiles == 2) _tile_loadd(5, o + 16, ob);
  if constexpr (kGroups == 2) {
    _tile_loadd(6, o1, ob);
    if constexpr (kDimTiles == 2) _tile_loadd(7, o1 + 16, ob);
  }
  for (int b = 0; b < sb.blocks; ++b) {
    const float* w = sb.s + std::size_t(b) * sb.s_block + std::size_t(t) * kKB;
    const std::uint32_t* vp = sb.vp + std::size_t(b) * sb.v_block + d;
    _tile_loadd(0, w, kWeightStride);
    _tile_loadd(2, vp, vb);
    _tile_dpbf16ps(4, 0, 2);
    if constexpr (kGroups == 2) {
      _tile_loadd(1, w + kTileRows * kKB, kWeightStride);
      _tile_dpbf16ps(6, 1, 2);
    }
    if constexpr (kDimTiles == 2) {
      _tile_loadd(3, vp + 16, vb);
      _tile_dpbf16ps(5, 0, 3);
      if constexpr (kGroups == 2) _tile_dpbf16ps(7, 1, 3);
    }
  }
  _tile_stored(4, o, ob);
  if constexpr (kDimTiles == 2) _tile_stored(5, o + 16, ob);
  if constexpr (kGroups == 2) {
    _tile_stored(6, o1, ob);
    if constexpr (kDimTiles == 2) _tile_stored(7, o1 + 16, ob);
  }
}

// o[row] += weights (bf16 in the first half of each score row, as
// SoftmaxStep leaves them) x packed values (bf16dot::PackValues: keys past a
// block's count are zero rows, whose weights are zero) over a step's blocks,
// for rows [row0, row_end); o rows and value rows share the stride dv
// (padded to 16), every one of its dims accumulated. counts[b]: block b's
// keys. Rows past the last whole tile run on vdpbf16ps, block by block.
PAGEDATTN_AMX_ATTR inline void AccumulateStep(const StepBlocks& sb, const std::int32_t* counts,
                                              std::size_t dv, float* o, std::int32_t row0,
                                              std::int32_t row_end) {
  const std::int32_t r = ForEachTile(row0, row_end, [&](auto groups, std::int32_t t) {
    constexpr int kGroups = decltype(groups)::value;
    float* ot = o + std::size_t(t) * dv;
    std::size_t d = 0;
    for (; d + 32 <= dv; d += 32) AccumulateTiles<kGroups, 2>(sb, t, d, dv, ot + d);
    if (d < dv) AccumulateTiles<kGroups, 1>(sb, t, d, dv, ot + d);
  });
  if (r < row_end)
    for (int b = 0; b < sb.blocks; ++b)
      bf16dot::AccumulateBlock<0>(sb.s + std::size_t(b) * sb.s_block,
                                  sb.vp + std::size_t(b) * sb.v_block, dv, counts[b], o, r,
                                  row_end);
}

}  // namespace amx

#endif  // PAGEDATTN_BF16_DOT_TARGET

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_AMX_BF16_INL_H_
