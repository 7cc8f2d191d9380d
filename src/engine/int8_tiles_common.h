// What the int8 tiles of every width share (dot_tiles_int8.cc on
// AVX512-VNNI, dot_tiles_int8_avx2.cc on AVX2 and AVX-VNNI): how a weight
// format's quants enter the integer sums, and the scratch they work in.
//
// A group of `columns` weight rows ("columns" of y) is laid out as
//   quants  [in / 4][columns] dwords: dword t of column c holds the quants
//           of inputs 4t .. 4t + 3 of weight row c as bytes, so one dot
//           instruction multiplies them by a dword of a row of x broadcast
//           to every lane (an outer product: one column per lane, no
//           reduction);
//   scales  [in / S][columns] f32: S inputs per scale (32; Q6_K 16);
//   mins    [in / 32][columns] f32 (Q4_1, Q5_1, Q4_K, Q5_K): the term added
//           per 32 inputs times the exact f32 sum of x over them.
// A weight is scale * (q - zero) (+ min): zero is 8 (Q4_0), 16 (Q5_0), 32
// (Q6_K), 128 (Q8_0, whose signed quants are stored xor 0x80) or 0. Per
// row of x and S inputs, the int32 lanes start at -zero * (the sum of x's
// int8 values over them), which makes the integer sum that of (q - zero) *
// x8, exactly. AVX2's vpmaddubsw saturates its pairs of u8 x s8 products at
// 16 bits, which Q8_0's 255 x 127 x 2 would pass: there Q8_0 keeps its
// signed quants (zero 0) and the tile moves their signs onto x.
#pragma once

#include <cstddef>
#include <cstdint>

#include "core/cache_line_vector.h"
#include "engine/dot_tiles.h"
#include "engine/quant_kernels.h"

// The units' packing steps, inlined into the loops that call them with
// constants (of which they build their shuffle controls and masks).
#define PAGEDATTN_INT8_INLINE inline __attribute__((always_inline))

namespace pagedattn::engine::int8_tile_parts {

struct Int8Layout {
  std::int32_t sub = 32;       // inputs per scale (S)
  std::int32_t zero = 0;       // subtracted from each quant
  bool mins = false;           // a min per 32 inputs
  std::int32_t bits = 8;       // the unsigned quants are below 2^bits
  bool signed_quants = false;  // Q8_0's int8 quants as they are (saturating dots)
};

// `saturating`: the tile's dot products saturate at 16 bits (AVX2).
constexpr Int8Layout layout_of(WeightFormat f, bool saturating = false) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return {32, saturating ? 0 : 128, false, 8, saturating};
    case WeightFormat::kQ4_0:
      return {32, 8, false, 4};
    case WeightFormat::kQ5_0:
      return {32, 16, false, 5};
    case WeightFormat::kQ6_K:
      return {16, 32, false, 6};
    case WeightFormat::kQ4_1:
    case WeightFormat::kQ4_K:
      return {32, 0, true, 4};
    case WeightFormat::kQ5_1:
    case WeightFormat::kQ5_K:
      return {32, 0, true, 5};
    default:
      return {};
  }
}

// Rows of x quantised per pass: their int8 bytes stay in L2 while every
// group of the call's columns passes over them; each group is packed once
// per pass.
inline constexpr std::int32_t kPassRows = 128;

// A pass of rows of x: int8 values, their scale per 32, the exact sum of x
// per 32 (for the mins) and -zero x the sum of the int8 values per S (from
// their sums per 16).
struct PassRows {
  const std::int8_t* x8;  // [rows][in]
  const float* dx;        // [rows][in / 32]
  const float* xsums;     // [rows][in / 32]
  std::int32_t* zsums;    // [rows][in / S]
};

// Where R rows of a pass from `row` start: what one register tile reads.
template <std::int32_t R>
struct TileRows {
  const std::int8_t* x8[R];
  const float* dx[R];
  const float* xsums[R];
  const std::int32_t* zsums[R];
  TileRows(const PassRows& p, std::int32_t row, std::int32_t in, std::int32_t sub) {
    const std::int32_t blocks = in / 32, subs = in / sub;
    for (std::int32_t r = 0; r < R; ++r) {
      x8[r] = p.x8 + std::size_t(row + r) * in;
      dx[r] = p.dx + std::size_t(row + r) * blocks;
      xsums[r] = p.xsums + std::size_t(row + r) * blocks;
      zsums[r] = p.zsums + std::size_t(row + r) * subs;
    }
  }
};

// A group of weight rows in the layouts above. Columns past the group's end
// repeat its last one: their lanes are never stored.
struct Group {
  std::uint8_t* quants;  // [in / 4][columns] dwords
  float* scales;         // [in / S][columns]
  float* mins;           // [in / 32][columns]
  std::uint8_t* rows;    // [kRingRows][columns] dwords: the rows transposed (PackGroup32)
};

// The transposed rows of a 32-weight format's group live in a ring of two
// 64-byte lines' worth of dword rows (a block of at most 34 bytes spans
// at most two lines, and is packed as soon as its last line is
// transposed): dword x / 4 of the rows at ring row ring_row(x).
inline constexpr std::size_t kRingRows = 32;
constexpr std::size_t ring_row(std::size_t x) {
  return x / 4 % kRingRows;
}

// Floats of scratch for `in` inputs and groups of `columns`: the group (its
// quants, scales and mins; its rows transposed), then a pass of rows. Every
// part a whole number of 64-byte lines.
struct ScratchPlan {
  static constexpr std::size_t lines(std::size_t floats) { return (floats + 15) / 16 * 16; }
  std::size_t quants, scales, mins, rows, x8, blocks, sums, total;  // in floats
  ScratchPlan(std::int32_t in, std::int32_t columns)
      : quants(lines(std::size_t(in) * std::size_t(columns) / sizeof(float))),
        scales(lines(std::size_t(in) * std::size_t(columns) / 16)),  // at most in / 16 a column
        mins(lines(std::size_t(in) * std::size_t(columns) / 32)),
        rows(lines(kRingRows * 4 * std::size_t(columns) / sizeof(float))),
        x8(lines(std::size_t(kPassRows) * in / sizeof(float))),
        blocks(lines(std::size_t(kPassRows) * in / 32)),
        sums(lines(std::size_t(kPassRows) * in / 16)),
        total(quants + scales + mins + rows + x8 + 2 * blocks + 2 * sums) {}
};

// What a pass sets up for its groups' products (PassTiles, one per pass
// of DotTilesInt8): nothing on the vector tiles; the AMX tiles load their
// configuration (int8_tiles_amx-inl.h).
struct NoTileState {
  constexpr NoTileState(const Int8Layout& /*layout*/, std::int32_t /*rows*/) {}
};

// A pass's own buffers, where the pass rounds its rows itself.
struct PassBuffers {
  std::int8_t* x8;       // [kPassRows][in]
  float* dx;             // [kPassRows][in / 32]
  float* xsums;          // [kPassRows][in / 32]
  std::int32_t* sums16;  // [kPassRows][in / 16]
  std::int32_t* zsums;   // [kPassRows][in / S]
};

// Carves `scratch` (at least plan.total floats from a cache line on) into a
// group and a pass's buffers.
inline void carve(const ScratchPlan& plan, float* scratch, Group& g, PassBuffers& b) {
  float* at = scratch;
  const auto take = [&](std::size_t floats) {
    float* part = at;
    at += floats;
    return part;
  };
  g = {reinterpret_cast<std::uint8_t*>(take(plan.quants)), take(plan.scales), take(plan.mins),
       reinterpret_cast<std::uint8_t*>(take(plan.rows))};
  b = {reinterpret_cast<std::int8_t*>(take(plan.x8)), take(plan.blocks), take(plan.blocks),
       reinterpret_cast<std::int32_t*>(take(plan.sums)),
       reinterpret_cast<std::int32_t*>(take(plan.sums))};
}

}  // namespace pagedattn::engine::int8_tile_parts

namespace pagedattn::engine {

// dot_tiles' int8 products on each width, for dot_tiles_int8's dispatch:
// AVX512-VNNI, or AMX-INT8 tiles (`amx`), in dot_tiles_int8.cc; 256-bit
// vectors on AVX-VNNI (`vnni`) or AVX2 (dot_tiles_int8_avx2.cc).
void dot_tiles_int8_avx512(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                           core::CacheLineVector<float>& scratch, bool amx);
void dot_tiles_int8_256(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                        core::CacheLineVector<float>& scratch, bool vnni);

}  // namespace pagedattn::engine
