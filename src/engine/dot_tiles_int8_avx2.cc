// dot_tiles on int8 products (DotTilesArgs::int8, dot_tiles.h) on 256-bit
// vectors, for CPUs without AVX512-VNNI: AVX-VNNI's vpdpbusd where present
// (Int8Tiles::kAvxVnni: Intel's Alder Lake and later client cores, Sierra
// Forest), else AVX2's vpmaddubsw + vpmaddwd (Int8Tiles::kAvx2: Haswell on,
// AMD's Zen 1-3).
// Same layouts and the same f32 operations per output as the AVX-512 tiles
// (int8_tiles_common.h): the same bits on every width.
#include <algorithm>
#include <cstring>

#include "engine/dot_tiles.h"
#include "engine/int8_tiles_common.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/errors.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define PAGEDATTN_INT8_TILES_256 1
#else
#define PAGEDATTN_INT8_TILES_256 0
#endif

namespace pagedattn::engine {

#if PAGEDATTN_INT8_TILES_256
namespace {

using namespace int8_tile_parts;  // NOLINT(google-build-using-namespace): this unit's own types

namespace avx2 {
#define PAGEDATTN_INT8_TARGET __attribute__((target("avx2,fma,f16c")))
#define PAGEDATTN_INT8_VNNI 0
#include "engine/int8_tiles_256-inl.h"
#undef PAGEDATTN_INT8_VNNI
#undef PAGEDATTN_INT8_TARGET
}  // namespace avx2

namespace avx_vnni {
#define PAGEDATTN_INT8_TARGET __attribute__((target("avx2,fma,f16c,avxvnni")))
#define PAGEDATTN_INT8_VNNI 1
#include "engine/int8_tiles_256-inl.h"
#undef PAGEDATTN_INT8_VNNI
#undef PAGEDATTN_INT8_TARGET
}  // namespace avx_vnni

}  // namespace

void dot_tiles_int8_256(const DotTilesArgs& a, std::int32_t out_begin, std::int32_t out_end,
                        core::CacheLineVector<float>& scratch, bool vnni) {
  if (vnni) return avx_vnni::DotTilesInt8(a, out_begin, out_end, scratch);
  avx2::DotTilesInt8(a, out_begin, out_end, scratch);
}

// Every kind of tile rounds a row with the same operations (AVX2 ones):
// this is each kind's QuantizeRow.
void quantize_int8_rows(const float* x, std::int32_t begin, std::int32_t end, Int8Rows& out) {
  require(dot_tiles_int8_available(), "quantize_int8_rows: no int8 tiles on this CPU");
  const std::int32_t in = out.in, blocks = in / 32;
  for (std::int32_t r = begin; r < end; ++r)
    avx2::QuantizeRow(x + std::size_t(r) * in, in, true, out.x8.data() + std::size_t(r) * in,
                      out.dx.data() + std::size_t(r) * blocks,
                      out.xsums.data() + std::size_t(r) * blocks,
                      out.sums16.data() + std::size_t(r) * (in / 16));
}

#else

void dot_tiles_int8_256(const DotTilesArgs&, std::int32_t, std::int32_t,
                        core::CacheLineVector<float>&, bool) {
  throw InvalidArgument("dot_tiles_int8: no int8 tiles on this architecture");
}

void quantize_int8_rows(const float*, std::int32_t, std::int32_t, Int8Rows&) {
  throw InvalidArgument("quantize_int8_rows: no int8 tiles on this architecture");
}

#endif

void Int8Rows::resize(std::int32_t count, std::int32_t width) {
  require(count >= 0 && width >= 0 && width % 32 == 0, "Int8Rows::resize: ", count, " rows of ",
          width, " (a multiple of 32)");
  rows = count;
  in = width;
  const auto n = std::size_t(count) * std::size_t(width);
  x8.resize(n);
  dx.resize(n / 32);
  xsums.resize(n / 32);
  sums16.resize(n / 16);
}

}  // namespace pagedattn::engine
