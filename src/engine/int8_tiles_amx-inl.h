// The int8 tiles' products on AMX-INT8 (Int8Tiles::kAmxInt8): the group
// packing of the AVX512-VNNI tiles (int8_unpack-inl.h, the same layouts),
// with each S inputs' integer sums of up to 16 rows x the group's 16
// columns taken by one tdpbsud where the VNNI tile takes S / 4 vpdpbusd a
// row. Included by dot_tiles_int8.cc inside a namespace of its own, after
// the 512-bit packing steps, with PAGEDATTN_INT8_TARGET its target (the
// VNNI one plus the tile instructions).
//
// A group's quants ([in / 4][16] dwords, int8_tiles_common.h) are already
// B tiles: the S / 4 dword rows of one scale's inputs, 64 bytes each. An A
// tile is M rows of x8's S bytes at the row stride `in`. The sums are the
// same exact int32s as vpdpbusd's (x signed, quants unsigned), and the f32
// operations after them the VNNI tile's, in the same order: every output
// has the VNNI tiles' bits.
// No include guard: included once, inside a namespace.

// Tiles 0-3 hold sums (C) in two sets of kSetTiles, one stored and scaled
// while the other's products run; 4-5 rows of x (A) and 6-7 the group's
// quants (B) alternate, so that a tile's load does not wait on the product
// before it.
inline constexpr std::int32_t kTileRows = 16;
inline constexpr std::int32_t kSetTiles = 2;

// M = `rows` rows a tile (1-16) and S = `sub` inputs a scale (16 or 32).
constexpr kernels::TileConfig TileConfigFor(std::int32_t rows, std::int32_t sub) {
  kernels::TileConfig c;
  for (int t = 0; t < 8; ++t) {
    const bool a = t == 4 || t == 5, b = t >= 6;
    c.bytes_per_row[t] = static_cast<std::uint16_t>(a ? sub : 4 * kGroupColumns);
    c.rows[t] = static_cast<std::uint8_t>(b ? sub / 4 : rows);
  }
  return c;
}

// [S == 16][M - 1]
inline constexpr auto kTileConfigs = [] {
  std::array<std::array<kernels::TileConfig, kTileRows>, 2> table{};
  for (std::int32_t m = 1; m <= kTileRows; ++m) {
    table[0][std::size_t(m - 1)] = TileConfigFor(m, 32);
    table[1][std::size_t(m - 1)] = TileConfigFor(m, 16);
  }
  return table;
}();

// The tile configuration of a pass (kernels::use_tile_config: loaded where
// the thread's tiles are not configured so already). Left loaded after the
// pass: the next pass of a decode step has the same rows and takes it as it
// is. Other code that uses the tiles on the thread (the AMX-BF16 attention,
// dot_tiles' bf16 tiles) configures them itself.
class PassTiles {
 public:
  PassTiles(const Int8Layout& layout, std::int32_t rows) {
    kernels::use_tile_config(
        kTileConfigs[layout.sub == 16 ? 1 : 0][std::size_t(std::min(rows, kTileRows) - 1)]);
  }
};

// Issues the products of scales [s0, s0 + n) (1 <= n <= kSetTiles) into
// set `set`'s C tiles: C tile j of the set = rows of x8 (M a tile, row
// stride `in`) times the group's quants over scale s0 + j's inputs. (The
// tile intrinsics take their tiles' numbers as literals.)
template <std::int32_t kSub>
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void IssueSums(std::int32_t set, const std::int8_t* x8,
                                                           std::int32_t in,
                                                           const std::uint8_t* quants,
                                                           std::int32_t s0, std::int32_t n) {
  constexpr std::size_t kStep = std::size_t(kSub) * kGroupColumns;  // a scale's quants, bytes
  constexpr int kRowBytes = 4 * kGroupColumns;
  const std::int8_t* x = x8 + std::size_t(s0) * kSub;
  const std::uint8_t* q = quants + std::size_t(s0) * kStep;
#define PAGEDATTN_SUM_TILE(c, j, a, b)      \
  _tile_loadd(a, x + (j)*kSub, in);         \
  _tile_loadd(b, q + (j)*kStep, kRowBytes); \
  _tile_zero(c);                            \
  _tile_dpbsud(c, a, b)
  if (set == 0) {
    PAGEDATTN_SUM_TILE(0, 0, 4, 6);
    if (n > 1) {
      PAGEDATTN_SUM_TILE(1, 1, 5, 7);
    }
  } else {
    PAGEDATTN_SUM_TILE(2, 0, 4, 6);
    if (n > 1) {
      PAGEDATTN_SUM_TILE(3, 1, 5, 7);
    }
  }
#undef PAGEDATTN_SUM_TILE
}

// Stores set `set`'s first n sums into sums[0 .. n).
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void StoreSums(std::int32_t set, std::int32_t n,
                                                           std::int32_t (*sums)[kTileRows * 16]) {
  constexpr int kRowBytes = 4 * kGroupColumns;
  if (set == 0) {
    _tile_stored(0, sums[0], kRowBytes);
    if (n > 1) _tile_stored(1, sums[1], kRowBytes);
  } else {
    _tile_stored(2, sums[0], kRowBytes);
    if (n > 1) _tile_stored(3, sums[1], kRowBytes);
  }
}

// totals[r] (rows [from, m) of the tile from pass row `row`) += the sums
// of scales [s0, s0 + n), each as the VNNI tile adds it: (sum - zero x the
// sum of x8) * dx * scale, then min * the sum of x. The formats with mins
// have no zero (int8_tiles_common.h): their zsums are 0, not added.
template <std::int32_t kSub, bool kMins>
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void AddSums(const PassRows& p, std::int32_t in,
                                                         const Group& g, std::int32_t row,
                                                         std::int32_t from, std::int32_t m,
                                                         std::int32_t s0, std::int32_t n,
                                                         const std::int32_t (*sums)[kTileRows * 16],
                                                         float* totals) {
  const std::int32_t blocks = in / 32, subs = in / kSub;
  for (std::int32_t r = from; r < m; ++r) {
    const std::size_t at = std::size_t(row + r);
    const float* dx = p.dx + at * blocks;
    const float* xsums = p.xsums + at * blocks;
    [[maybe_unused]] const std::int32_t* zsums = p.zsums + at * subs;
    __m512 total = _mm512_load_ps(totals + 16 * r);
    for (std::int32_t j = 0; j < n; ++j) {
      const std::int32_t s = s0 + j;
      __m512i sum = _mm512_load_si512(sums[j] + 16 * r);
      if constexpr (!kMins) sum = _mm512_add_epi32(sum, _mm512_set1_epi32(zsums[s]));
      const __m512 scale = _mm512_load_ps(g.scales + std::size_t(s) * kGroupColumns);
      total = _mm512_fmadd_ps(
          _mm512_mul_ps(_mm512_cvtepi32_ps(sum), _mm512_set1_ps(dx[s * kSub / 32])), scale, total);
      if constexpr (kMins)
        total = _mm512_fmadd_ps(_mm512_load_ps(g.mins + std::size_t(s) * kGroupColumns),
                                _mm512_set1_ps(xsums[s]), total);
    }
    _mm512_store_ps(totals + 16 * r, total);
  }
}

// y[r][0..cols) (+)= the pass's `rows` rows times the group's columns, in
// tiles of M = min(rows, 16) rows (the configuration PassTiles loaded); the
// last tile starts M rows before the end, and stores only its rows the
// tile before it did not. Per tile the scales go kSetTiles at a time, the
// next ones' products issued before this ones' sums are scaled.
template <std::int32_t kSub, bool kMins, bool kSigned>
PAGEDATTN_INT8_TARGET void GroupTimesPass(const DotTilesArgs& a, const Int8Layout&,
                                          const PassRows& p, std::int32_t rows, const Group& g,
                                          std::int32_t cols, float* y) {
  static_assert(!kSigned, "tdpbsud takes Q8_0's quants xor 0x80");
  // The group was packed by plain stores, which the tile loads (asm that
  // names no memory) must come after.
  asm volatile("" : : : "memory");
  const std::int32_t m = std::min(rows, kTileRows), subs = a.in / kSub;
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1u);
  alignas(64) std::int32_t sums[2][kSetTiles][kTileRows * 16];  // per set
  alignas(64) float totals[kTileRows * 16];
  for (std::int32_t done = 0; done < rows;) {
    const std::int32_t row = std::min(done, rows - m), from = done - row;
    for (std::int32_t r = from; r < m; ++r) _mm512_store_ps(totals + 16 * r, _mm512_setzero_ps());
    const std::int8_t* x8 = p.x8 + std::size_t(row) * a.in;
    // Stage by stage: the products of scales s0 + kSetTiles issued, s0's
    // stored, s0 - kSetTiles's (stored a stage before: a tile's stores
    // reach the loads after them late) scaled.
    IssueSums<kSub>(0, x8, a.in, g.quants, 0, std::min(kSetTiles, subs));
    const std::int32_t stages = (subs + kSetTiles - 1) / kSetTiles;
    for (std::int32_t stage = 0; stage <= stages; ++stage) {
      const std::int32_t s0 = stage * kSetTiles, set = stage & 1;
      if (stage < stages) {
        StoreSums(set, std::min(kSetTiles, subs - s0), sums[set]);
        if (s0 + kSetTiles < subs)
          IssueSums<kSub>(set ^ 1, x8, a.in, g.quants, s0 + kSetTiles,
                          std::min(kSetTiles, subs - s0 - kSetTiles));
      }
      const std::int32_t before = s0 - kSetTiles;
      if (stage > 0)
        AddSums<kSub, kMins>(p, a.in, g, row, from, m, before, std::min(kSetTiles, subs - before),
                             sums[set ^ 1], totals);
    }
    for (std::int32_t r = from; r < m; ++r) {
      float* out = y + std::size_t(row + r) * a.ldy;
      __m512 v = _mm512_load_ps(totals + 16 * r);
      if (a.accumulate) v = _mm512_add_ps(_mm512_maskz_loadu_ps(mask, out), v);
      _mm512_mask_storeu_ps(out, mask, v);
    }
    done = row + m;
  }
}
