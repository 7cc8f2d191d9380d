// dot_tiles on int8 products (DotTilesArgs::int8, dot_tiles.h) on
// AVX512-VNNI (Int8Tiles::kAvx512Vnni) and on AMX-INT8 tiles
// (Int8Tiles::kAmxInt8, int8_tiles_amx-inl.h), which share the 512-bit
// packing. Raw intrinsics in functions with their own target attribute
// (Highway 1.0.3 has no u8 x s8 dot product), run only where
// int8_tiles_runnable() says the kind runs.
//
// The layouts and how each weight format enters the integer sums:
// int8_tiles_common.h; here a group is 16 columns, one int32 lane each.
#include <algorithm>
#include <array>
#include <cstring>

#include "engine/dot_tiles.h"
#include "engine/int8_tiles_common.h"
#include "kernels/cpu/amx_tile_config.h"
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
#define PAGEDATTN_AMX_INT8 \
  __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni,f16c,amx-tile,amx-int8")))

using namespace int8_tile_parts;  // NOLINT(google-build-using-namespace): this unit's own types

constexpr std::int32_t kGroupColumns = 16;  // one int32 lane per weight row
// vpdpbusd's sums do not saturate: Q8_0's quants go xor 0x80.
constexpr bool kSaturating = false;

#define PAGEDATTN_TRANSPOSE_TARGET PAGEDATTN_VNNI
#include "engine/transpose_dwords-inl.h"
#undef PAGEDATTN_TRANSPOSE_TARGET

// One step of 5- or 6-bit quants (Q5_K, Q6_K) from transposed dword rows
// (one dword per column): the low 4 bits from `ql` >> ql_shift, the high
// bits (`high_bits` of each byte) from `qh` >> qh_shift, into the group's
// quants' step `step`.
PAGEDATTN_VNNI void MergeHighBitsStep(const std::uint8_t* ql, std::int32_t ql_shift,
                                      const std::uint8_t* qh, std::int32_t qh_shift,
                                      std::int32_t high_bits, std::uint8_t* quants,
                                      std::size_t step) {
  const __m512i low =
      _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(ql), _mm_cvtsi32_si128(ql_shift)),
                       _mm512_set1_epi8(0x0f));
  const __m512i high =
      _mm512_and_si512(_mm512_srl_epi16(_mm512_loadu_si512(qh), _mm_cvtsi32_si128(qh_shift)),
                       _mm512_set1_epi8(static_cast<char>(high_bits)));
  _mm512_storeu_si512(reinterpret_cast<__m512i*>(quants) + step,
                      _mm512_or_si512(low, _mm512_slli_epi16(high, 4)));
}

// Bytes [x, x + 4) of each column's row, from the ring of rows
// PackGroup32 transposes (ring_row). x is even (the 32-weight formats'
// blocks of 18, 22 and 34 bytes alternate between dword and half-dword
// starts): two dwords' halves where it is not a multiple of 4.
PAGEDATTN_VNNI PAGEDATTN_INT8_INLINE __m512i DwordsAt(const std::uint8_t* t, std::size_t x) {
  const auto* rows = reinterpret_cast<const __m512i*>(t);
  const auto* row = rows + ring_row(x);
  if (x % 4 == 0) return _mm512_loadu_si512(row);
  return _mm512_or_si512(_mm512_srli_epi32(_mm512_loadu_si512(row), 16),
                         _mm512_slli_epi32(_mm512_loadu_si512(rows + ring_row(x + 4)), 16));
}

// Per dword, byte i: bit `first` + i of the dword `qh` (first a multiple
// of 4): the byte that holds the four bits copied to each byte, then
// tested against each byte's bit.
PAGEDATTN_VNNI PAGEDATTN_INT8_INLINE __mmask64 FifthBitMask(__m512i qh, std::int32_t first) {
  const int byte = first / 8, spread = 0x01010101;  // dword j of a 128-bit lane: byte 4j + byte
  const __m512i copies =
      _mm512_shuffle_epi8(qh, _mm512_set4_epi32((12 + byte) * spread, (8 + byte) * spread,
                                                (4 + byte) * spread, byte * spread));
  const auto bits = static_cast<int>((1u << (first % 8)) * 0x08040201u);  // byte i: 1 << i
  return _mm512_test_epi8_mask(copies, _mm512_set1_epi32(bits));
}

// The dword of nibbles at byte x of the transposed rows `t` (DwordsAt)
// split into the tiles' steps `low_step` (low nibbles) and `low_step +
// half` (high nibbles), each + 16 where `qh` (a Q5_0 / Q5_1 block's fifth
// bits; null: none) has the weight's bit: bits 4k .. 4k + 3 for the low
// nibbles, 16 + 4k .. for the high ones.
PAGEDATTN_VNNI PAGEDATTN_INT8_INLINE void NibbleSteps(const std::uint8_t* t, std::size_t x,
                                                      const __m512i* qh, std::int32_t k,
                                                      std::uint8_t* quants, std::size_t low_step,
                                                      std::size_t half) {
  const __m512i low4 = _mm512_set1_epi8(0x0f), sixteen = _mm512_set1_epi8(16);
  const __m512i v = DwordsAt(t, x);
  __m512i low = _mm512_and_si512(v, low4), high = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
  if (qh != nullptr) {
    low = _mm512_mask_add_epi8(low, FifthBitMask(*qh, 4 * k), low, sixteen);
    high = _mm512_mask_add_epi8(high, FifthBitMask(*qh, 16 + 4 * k), high, sixteen);
  }
  auto* out = reinterpret_cast<__m512i*>(quants) + low_step;
  _mm512_storeu_si512(out, low);
  _mm512_storeu_si512(out + half, high);
}

// Step `step` of Q8_0 quants from the dword at byte x of the transposed
// rows `t`: xor 0x80 unless `signed_quants`.
PAGEDATTN_VNNI PAGEDATTN_INT8_INLINE void ByteStep(const std::uint8_t* t, std::size_t x,
                                                   bool signed_quants, std::uint8_t* quants,
                                                   std::size_t step) {
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(signed_quants ? 0 : 0x80));
  _mm512_storeu_si512(reinterpret_cast<__m512i*>(quants) + step,
                      _mm512_xor_si512(DwordsAt(t, x), flip));
}

namespace vnni {

using PassTiles = NoTileState;
// Row tiles: R rows x 16 columns keep 2R accumulators (int32 sums of the
// current S inputs, f32 totals) and three vectors of the group in the 32
// registers.
using Int8RowTiles = kernels::RowGroups<12, 8, 4, 2, 1>;
// y[r][0..cols) (+)= the R rows of the pass from `row` times the group's
// columns. Per row and column: one int32 sum per S inputs (exact), then
// total += (sum * dx) * scale (+ min * xsum per 32 inputs) in f32, in input
// order: the same operations whatever R, the column's lane or the pass.
template <std::int32_t R, std::int32_t kSub, bool kMins>
PAGEDATTN_VNNI void Tile(const PassRows& p, std::int32_t row, const Group& g, std::int32_t in,
                         std::int32_t cols, float* y, std::int32_t ldy, bool accumulate) {
  constexpr std::int32_t kSteps = kSub / 4;
  const std::int32_t subs = in / kSub;
  const TileRows<R> rows(p, row, in, kSub);
  __m512 total[R];
  for (std::int32_t r = 0; r < R; ++r) total[r] = _mm512_setzero_ps();
  const auto* quants = reinterpret_cast<const __m512i*>(g.quants);
  for (std::int32_t s = 0; s < subs; ++s) {
    __m512i sum[R];
    for (std::int32_t r = 0; r < R; ++r) sum[r] = _mm512_set1_epi32(rows.zsums[r][s]);
    for (std::int32_t t = 0; t < kSteps; ++t) {
      const __m512i w = _mm512_load_si512(quants + s * kSteps + t);
      for (std::int32_t r = 0; r < R; ++r) {
        std::int32_t four;
        std::memcpy(&four, rows.x8[r] + s * kSub + 4 * t, sizeof four);
        sum[r] = _mm512_dpbusd_epi32(sum[r], w, _mm512_set1_epi32(four));
      }
    }
    const __m512 scale = _mm512_load_ps(g.scales + std::size_t(s) * kGroupColumns);
    const std::int32_t block = s * kSub / 32;
    for (std::int32_t r = 0; r < R; ++r)
      total[r] = _mm512_fmadd_ps(
          _mm512_mul_ps(_mm512_cvtepi32_ps(sum[r]), _mm512_set1_ps(rows.dx[r][block])), scale,
          total[r]);
    if constexpr (kMins) {
      const __m512 min = _mm512_load_ps(g.mins + std::size_t(s) * kGroupColumns);
      for (std::int32_t r = 0; r < R; ++r)
        total[r] = _mm512_fmadd_ps(min, _mm512_set1_ps(rows.xsums[r][s]), total[r]);
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

template <std::int32_t kSub, bool kMins, bool kSigned>
PAGEDATTN_VNNI void GroupTimesPass(const DotTilesArgs& a, const Int8Layout&, const PassRows& p,
                                   std::int32_t rows, const Group& g, std::int32_t cols, float* y) {
  static_assert(!kSigned, "vpdpbusd takes Q8_0's quants xor 0x80");
  Int8RowTiles::VisitAll(0, rows, [&](auto tile, std::int32_t row) PAGEDATTN_VNNI {
    Tile<decltype(tile)::value, kSub, kMins>(p, row, g, a.in, cols, y + std::size_t(row) * a.ldy,
                                             a.ldy, a.accumulate);
  });
}

#define PAGEDATTN_INT8_TARGET PAGEDATTN_VNNI
#include "engine/int8_unpack-inl.h"
#undef PAGEDATTN_INT8_TARGET

}  // namespace vnni

namespace amx {
#define PAGEDATTN_INT8_TARGET PAGEDATTN_AMX_INT8
#include "engine/int8_tiles_amx-inl.h"
#include "engine/int8_unpack-inl.h"
#undef PAGEDATTN_INT8_TARGET
}  // namespace amx

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

}  // namespace

void dot_tiles_int8_avx512(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                           core::CacheLineVector<float>& scratch, bool amx) {
  if (amx) return amx::DotTilesInt8(a, out_begin, out_end, scratch);
  vnni::DotTilesInt8(a, out_begin, out_end, scratch);
}

#else

void dot_tiles_int8_avx512(const DotTilesArgs&, std::int32_t, std::int32_t,
                           core::CacheLineVector<float>&, bool) {
  throw InvalidArgument("dot_tiles_int8: no int8 tiles on this architecture");
}

#endif

Int8Tiles int8_tiles() {
  static const Int8Tiles kind = [] {
    const CpuFeatures used = dispatched_features();
    if (used.avx512_vnni && used.f16c && used.amx_int8) return Int8Tiles::kAmxInt8;
    if (used.avx512_vnni && used.f16c) return Int8Tiles::kAvx512Vnni;
    if (used.avx_vnni && used.avx2 && used.fma && used.f16c) return Int8Tiles::kAvxVnni;
    if (used.avx2 && used.fma && used.f16c) return Int8Tiles::kAvx2;
    return Int8Tiles::kNone;
  }();
  return kind;
}

bool int8_tiles_runnable(Int8Tiles kind) {
  const CpuFeatures cpu = cpu_features();
  const bool avx2 = PAGEDATTN_INT8_TILES && cpu.avx2 && cpu.fma && cpu.f16c;
  switch (kind) {
    case Int8Tiles::kNone:
      return true;
    case Int8Tiles::kAvx2:
      return avx2;
    case Int8Tiles::kAvxVnni:
      return avx2 && cpu.avx_vnni;
    case Int8Tiles::kAvx512Vnni:
      return avx2 && cpu.avx512f && cpu.avx512bw && cpu.avx512dq && cpu.avx512vl && cpu.avx512_vnni;
    case Int8Tiles::kAmxInt8:
      return int8_tiles_runnable(Int8Tiles::kAvx512Vnni) && cpu.amx_int8;
  }
  return false;
}

const char* int8_tiles_name(Int8Tiles kind) {
  switch (kind) {
    case Int8Tiles::kAvx2:
      return "avx2";
    case Int8Tiles::kAvxVnni:
      return "avx_vnni";
    case Int8Tiles::kAvx512Vnni:
      return "avx512_vnni";
    case Int8Tiles::kAmxInt8:
      return "amx_int8";
    case Int8Tiles::kNone:
      break;
  }
  return "none";
}

std::int32_t int8_tile_group_columns(Int8Tiles kind) {
  switch (kind) {
    case Int8Tiles::kAvx512Vnni:
    case Int8Tiles::kAmxInt8:
      return 16;
    case Int8Tiles::kAvx2:
    case Int8Tiles::kAvxVnni:
      return 8;
    case Int8Tiles::kNone:
      break;
  }
  return 1;
}

bool dot_tiles_int8_available() {
  return int8_tiles() != Int8Tiles::kNone;
}

void dot_tiles_int8(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                    core::CacheLineVector<float>& scratch, Int8Tiles kind) {
  require(kind != Int8Tiles::kNone && int8_tiles_runnable(kind),
          "dot_tiles_int8: kind = ", int8_tiles_name(kind), " does not run on this CPU");
  if (kind == Int8Tiles::kAvx512Vnni || kind == Int8Tiles::kAmxInt8)
    return dot_tiles_int8_avx512(a, out_begin, out_end, scratch, kind == Int8Tiles::kAmxInt8);
  dot_tiles_int8_256(a, out_begin, out_end, scratch, kind == Int8Tiles::kAvxVnni);
}

void dot_tiles_int8(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                    core::CacheLineVector<float>& scratch) {
  const Int8Tiles kind = int8_tiles();
  const bool vnni_instead = kind == Int8Tiles::kAmxInt8 && !amx_int8_takes(a.rows, a.format);
  dot_tiles_int8(a, out_begin, out_end, scratch, vnni_instead ? Int8Tiles::kAvx512Vnni : kind);
}

}  // namespace pagedattn::engine
