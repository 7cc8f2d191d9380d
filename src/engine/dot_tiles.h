// Register-tiled products for batches of rows against quantised (or f32)
// weights: the kernel under linear()'s batches of 2-64 rows (a decode step
// of several sequences; 16-bit weights from 3 rows, f32 2-32), of every
// quantised batch in deterministic mode and, on bf16 (--bf16-products), of
// the batches of more than 8 below oneDNN's. Up to kRegisterRows rows
// decode each tile's weights in registers; larger batches dequantise them a
// few columns at a time into a buffer that stays in L1 and multiply them
// there by every row of x, read in place: nothing is packed. Through BLAS
// each call packed x again for every 128-column block and copied the
// dequantised block into BLAS's own layout, about a third of such a step
// (docs/benchmarks.md, "Batched products").
#pragma once

#include <cstdint>
#include <vector>

#include "core/cache_line_vector.h"
#include "engine/quant_kernels.h"
#include "kernels/cpu/prefetch.h"

namespace pagedattn::engine {

// Columns dequantised per group: a multiple of the tile's 4 columns.
inline constexpr std::int32_t kDotTileGroup = 8;
// f32 rows multiplied per pass over the weights (twice as many on bf16):
// they stay in L2 while a group's columns pass over them, and each group is
// dequantised once per pass. linear() sends f32 batches of at most this
// many rows; beyond it BLAS (which dequantises each block once) measured
// the same.
inline constexpr std::int32_t kDotTileRows = 64;

// Batches of at most this many rows of quantised or 16-bit weights decode
// them in registers instead of through L1 (same bits).
inline constexpr std::int32_t kRegisterRows = 4;

// Rows of x rounded to int8 once for all the threads of the products that
// read them (DotTilesArgs::x_rows, LinearArgs::x_int8): what each thread of
// the int8 tiles would otherwise round again for itself, every row of the
// batch per thread. A step's norm rounds each row right after norming it,
// on the thread that normed it.
struct Int8Rows {
  std::int32_t rows = 0, in = 0;
  core::CacheLineVector<std::int8_t> x8;       // [rows][in]: quantize_activations_q8's
  core::CacheLineVector<float> dx;             // [rows][in / 32]: its scales
  core::CacheLineVector<float> xsums;          // [rows][in / 32]: exact f32 sums of x
  core::CacheLineVector<std::int32_t> sums16;  // [rows][in / 16]: sums of x8
  // Room for `rows` of `in` (a multiple of 32). Not inside a team.
  void resize(std::int32_t rows, std::int32_t in);
};

// Rounds rows [begin, end) of x ([out.rows][out.in]) into `out`, as the
// int8 tiles round them (the same bytes and sums). Threads may round
// disjoint ranges of one Int8Rows at once. Only where
// dot_tiles_int8_available(); InvalidArgument elsewhere.
void quantize_int8_rows(const float* x, std::int32_t begin, std::int32_t end, Int8Rows& out);

struct DotTilesArgs {
  const float* x = nullptr;  // [rows][in]
  std::int32_t rows = 0;
  std::int32_t in = 0;      // a multiple of kQuantBlock
  const void* w = nullptr;  // [out] rows of `in` weights in `format`
  WeightFormat format = WeightFormat::kF32;
  float* y = nullptr;  // [rows][ldy]
  std::int32_t ldy = 0;
  bool accumulate = false;  // y += x w^T instead of y = x w^T
  // Round x and the (dequantised) weights to bf16, nearest even, and
  // multiply them on AVX512-BF16 dot products (twice an FMA's multiply-adds
  // per instruction; products exact, sums f32), or on AMX tiles where
  // dot_tiles_amx_bf16(), where dot_tiles_bf16_available(); f32 elsewhere.
  bool bf16 = false;
  // Quantised weights (has_int8_products): round x to int8 per 32 values
  // (quantize_activations_q8, as the in-place kernels' int8_x) and multiply
  // the quants on integer dot products (int8_tiles(): AVX512-VNNI,
  // AVX-VNNI or AVX2; exact int32 sums per 32 weights, Q6_K 16, each scaled
  // by d (* sc) * dx; the mins of Q4_1 / Q5_1 / Q4_K / Q5_K times exact sums
  // of x), where dot_tiles_int8_available();
  // ignored elsewhere and for float weights. Takes precedence over bf16.
  bool int8 = false;
  // With int8: x's rows already rounded (quantize_int8_rows, at least
  // `rows` of `in`), read instead of rounding them again; x itself is then
  // not read.
  const Int8Rows* x_rows = nullptr;
  // The row of x_rows that is row 0 of these rows (a thread's range of a
  // batch rounded once for all).
  std::int32_t x_rows_first = 0;
  // Weight rows [next_first, next_first + next_count) (at most a group's)
  // asked for while the range's last group computes: the start of the
  // range the calling thread runs next. A team's threads run a product in
  // chunks of one or two groups on 16 cores, so without it each chunk's
  // first group, and so nearly every group, waited on memory.
  std::int32_t next_first = 0, next_count = 0;
};

// Whether dot_tiles honours DotTilesArgs::bf16 here: an AVX-512 target was
// dispatched and the CPU has AVX512-BF16, not switched off
// (dispatched_features(); fixed at the first call).
bool dot_tiles_bf16_available();
// Whether those bf16 products run on AMX tiles (tdpbf16ps) here, where
// dot_tiles_bf16_available() and the CPU has AMX-BF16, not switched off
// (amx_bf16; fixed at the first call); else on vdpbf16ps. The two sum in
// different orders: other bits, the same bound.
bool dot_tiles_amx_bf16();
// The instructions of the int8 tiles (DotTilesArgs::int8), widest first:
// AMX-INT8 tiles (tdpbsud: the sums of 16 rows x 16 columns over a scale's
// inputs in one instruction), 16 columns a tile, packed and scaled as on
// AVX512-VNNI; 16 columns a tile on AVX512-VNNI; 8 on AVX-VNNI's vpdpbusd
// (VEX); 8 on AVX2's vpmaddubsw + vpmaddwd (three instructions where VNNI
// takes one). Every kind gives the same bits.
enum class Int8Tiles : std::uint8_t { kNone, kAvx2, kAvxVnni, kAvx512Vnni, kAmxInt8 };

// The int8 tiles dot_tiles runs here: the widest the dispatched target and
// the CPU allow, less the extensions switched off (dispatched_features():
// amx_int8, avx512_vnni, avx_vnni); kNone off x86 or below AVX2. Fixed at
// the first call.
Int8Tiles int8_tiles();
// Whether this CPU runs `kind` (whatever the dispatch cap): tests and
// benchmarks run every kind the machine has.
bool int8_tiles_runnable(Int8Tiles kind);
// "amx_int8", "avx512_vnni", "avx_vnni", "avx2" or "none".
const char* int8_tiles_name(Int8Tiles kind);
// The columns `kind`'s tiles take at a time (16 on AVX512-VNNI and AMX, 8 on the
// 256-bit tiles, 1 for kNone): a range's last partial group costs a whole
// one.
std::int32_t int8_tile_group_columns(Int8Tiles kind);
// Whether dot_tiles honours DotTilesArgs::int8 here: int8_tiles() != kNone.
bool dot_tiles_int8_available();

// y[r][o] (+)= sum_i x[r][i] w[o][i] for o in [out_begin, out_end) and
// every row r, on one thread. Each output is one f32 multiply-add chain per
// vector lane over i in order (bf16: pairs of products per lane), then a
// fixed tree over the lanes (int8: per weight row one f32 multiply-add
// chain over the blocks in order, in its own lane): it does not
// depend on the other rows, their count, the column range or the tile it
// falls in (the tests check this). `scratch` holds the dequantised group,
// from a cache line on (no vector load from it splits over two lines).
// InvalidArgument when `in` is not a positive multiple of kQuantBlock.
void dot_tiles(const DotTilesArgs& args, std::int32_t out_begin, std::int32_t out_end,
               core::CacheLineVector<float>& scratch);

// Asks for weight rows [first, first + count) of args.w while the tiles of
// the rows before them compute: both tile kernels read a group of weight
// rows in a burst between long runs of arithmetic, which the hardware
// prefetchers do not run ahead of, so without this each group's unpacking
// waited on memory. Into L2, as every prefetch of the attention kernels
// (kernels/cpu/prefetch.h): a burst of a group's lines into L1 held its few
// miss buffers, and a few-row product streaming a large matrix (the LM
// head) waited on them (docs/benchmarks.md, "Weight prefetch").
inline void prefetch_weight_rows(const DotTilesArgs& args, std::int32_t first, std::int32_t count) {
  const std::int64_t row_bytes = weight_row_bytes(args.format, args.in);
  const auto* begin = static_cast<const std::uint8_t*>(args.w) + first * row_bytes;
  for (std::int64_t at = 0; at < count * row_bytes; at += std::int64_t{core::kCacheLineBytes})
    kernels::PrefetchToL2(begin + at);
}

// Where int8_tiles() is AMX-INT8, the batches it takes; the others run the
// AVX512-VNNI tiles (the same bits). An AMX tile's products and the store
// of their sums cost about the same at 2 rows as at 16, and each scale's
// inputs take one of them: below 12 rows, and on Q6_K's scales of 16
// inputs at any row count, they measured slower than the VNNI tiles' dot
// products (docs/benchmarks.md, "AMX-INT8 tiles").
inline constexpr std::int32_t kAmxInt8MinRows = 12;
constexpr bool amx_int8_takes(std::int32_t rows, WeightFormat format) {
  return rows >= kAmxInt8MinRows && format != WeightFormat::kQ6_K;
}

// dot_tiles' int8 products on int8_tiles() (dot_tiles with args.int8 where
// dot_tiles_int8_available(); AVX512-VNNI in place of AMX where
// !amx_int8_takes), or on a given kind the CPU runs (int8_tiles_runnable;
// InvalidArgument otherwise).
void dot_tiles_int8(const DotTilesArgs& args, std::int32_t out_begin, std::int32_t out_end,
                    core::CacheLineVector<float>& scratch);
void dot_tiles_int8(const DotTilesArgs& args, std::int32_t out_begin, std::int32_t out_end,
                    core::CacheLineVector<float>& scratch, Int8Tiles kind);

}  // namespace pagedattn::engine
