// The int8 tiles' weight unpacking and row quantisation (int8_tiles_common.h
// has the layouts), on 256-bit vectors: included by each tile width's
// translation unit inside a namespace of its own, after defining
//   PAGEDATTN_INT8_TARGET  the function attribute of that unit's target;
//   PAGEDATTN_INT8_MASKS   1 where AVX-512BW's byte masks may be used;
// and the unit's TransposeLine (a 64-byte line of each column of a group,
// transposed), SplitStep (a transposed row of nibbles into two steps) and
// MergeHighBitsStep (Q5_K's and Q6_K's 4 low and 1-2 high bits into a step).
// No include guard: a unit may include it once per namespace.

// 16 bytes of nibbles as 32 quants: the low nibbles, then the high ones.
PAGEDATTN_INT8_TARGET inline __m256i SplitNibbles(const std::uint8_t* qs) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  const __m128i low4 = _mm_set1_epi8(0x0f);
  return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), low4), _mm_and_si128(v, low4));
}

// q + 16 in the bytes whose bit of `bits` is set (the fifth bits).
PAGEDATTN_INT8_TARGET inline __m256i AddFifthBits(std::uint32_t bits, __m256i q) {
#if PAGEDATTN_INT8_MASKS
  return _mm256_mask_add_epi8(q, bits, q, _mm256_set1_epi8(16));
#else
  // Byte i gets byte i / 8 of `bits`, then its bit i % 8.
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ull));
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit);
  return _mm256_add_epi8(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
#endif
}

// F16C's conversion (exact): the portable one costs a branchy call per block.
PAGEDATTN_INT8_TARGET inline float half_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _cvtsh_ss(bits);
}

// Q8_0 / Q5_0 / Q5_1: block b's quants, its scale at scales[b * stride]
// and (Q5_1) its min at mins[b * stride]. Q8_0's quants xor 0x80
// (unsigned, zero 128), or as they are when `layout` keeps them signed.
// (Converting the scales of a block's columns at once measured no faster
// here: the quants' unpack and transpose dominate.)
template <WeightFormat F>
PAGEDATTN_INT8_TARGET void UnpackRow32(const std::uint8_t* row, std::int32_t in,
                                       const Int8Layout& layout, std::uint8_t* quants,
                                       float* scales, float* mins, std::int32_t stride) {
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const std::int32_t blocks = in / kQuantBlock;
  for (std::int32_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = row + b * kBytes;
    scales[std::size_t(b) * stride] = half_at(block);
    if constexpr (F == WeightFormat::kQ5_1) mins[std::size_t(b) * stride] = half_at(block + 2);
    __m256i v;
    if constexpr (F == WeightFormat::kQ8_0) {
      v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kQuants));
      if (!layout.signed_quants) v = _mm256_xor_si256(v, _mm256_set1_epi8(static_cast<char>(0x80)));
    } else {
      v = SplitNibbles(block + BlockTraits<F>::kQuants);
    }
    if constexpr (F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1) {
      std::uint32_t qh;
      std::memcpy(&qh, block + BlockTraits<F>::kHighBits, sizeof qh);
      v = AddFifthBits(qh, v);
    }
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(quants + std::size_t(b) * kQuantBlock), v);
  }
}

// The f16 halves of 8 dwords (low halves: `high` false) as 8 floats.
PAGEDATTN_INT8_TARGET inline __m256 HalvesOf(__m256i dwords, bool high) {
  const __m256i pick =
      high ? _mm256_setr_epi8(2, 3, 6, 7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1, 2, 3, 6,
                              7, 10, 11, 14, 15, -1, -1, -1, -1, -1, -1, -1, -1)
           : _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1, 0, 1, 4, 5,
                              8, 9, 12, 13, -1, -1, -1, -1, -1, -1, -1, -1);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_shuffle_epi8(dwords, pick), 0x08);
  return _mm256_cvtph_ps(_mm256_castsi256_si128(packed));
}

// The group's block headers (each block's first 4 bytes: the f16 scale,
// and Q4_1's f16 min; [blocks][kGroupColumns] dwords in g.scales) as its
// scales, and with `mins` its mins: in place, F16C's exact conversion for
// every column of a block at once.
PAGEDATTN_INT8_TARGET inline void HeadersToScales(const Group& g, std::int32_t blocks, bool mins) {
  static_assert(kGroupColumns % 8 == 0);
  for (std::size_t at = 0; at < std::size_t(blocks) * kGroupColumns; at += 8) {
    const __m256i headers = _mm256_load_si256(reinterpret_cast<const __m256i*>(g.scales + at));
    if (mins) _mm256_store_ps(g.mins + at, HalvesOf(headers, true));
    _mm256_store_ps(g.scales + at, HalvesOf(headers, false));
  }
}

// A group's transposed dword row r of a 64-byte line (kGroupColumns
// dwords), lanes c0 .. c0 + 7.
PAGEDATTN_INT8_TARGET inline __m256i LineRow(const std::uint8_t* line, std::int32_t r,
                                             std::int32_t c0) {
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(line + (std::size_t(r) * kGroupColumns + c0) * 4));
}

// Q4_K / Q5_K: the scales d * sc[j] and mins -dmin * m[j] of super-block
// k's sub-blocks j for the group's columns (the rest zero), from its first
// 64 bytes transposed (`head`: rows 0-3 hold d and dmin, then the 12 bytes
// of 6-bit scales and mins): unpack_k_scales' words in vector lanes, then
// one rounding each, as a column at a time took them.
PAGEDATTN_INT8_TARGET inline void PackKScales(std::int32_t k, const std::uint8_t* head,
                                              const Group& g) {
  const __m256i k6 = _mm256_set1_epi32(0x3f3f3f3f), k4 = _mm256_set1_epi32(0x0f0f0f0f),
                k2 = _mm256_set1_epi32(0x03030303), byte = _mm256_set1_epi32(0xff);
  const __m256 sign = _mm256_set1_ps(-0.0f);
  const auto two_high = [&](__m256i v) PAGEDATTN_INT8_TARGET {
    return _mm256_slli_epi32(_mm256_and_si256(_mm256_srli_epi32(v, 6), k2), 4);
  };
  for (std::int32_t c0 = 0; c0 < kGroupColumns; c0 += 8) {
    const __m256i u[4] = {LineRow(head, 0, c0), LineRow(head, 1, c0), LineRow(head, 2, c0),
                          LineRow(head, 3, c0)};
    const __m256 d = HalvesOf(u[0], false);
    const __m256 minus_dmin = _mm256_xor_ps(HalvesOf(u[0], true), sign);
    const __m256i words[4] = {
        _mm256_and_si256(u[1], k6),                                   // sc[0..3]
        _mm256_or_si256(_mm256_and_si256(u[3], k4), two_high(u[1])),  // sc[4..7]
        _mm256_and_si256(u[2], k6),                                   // m[0..3]
        _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(u[3], 4), k4), two_high(u[2]))};
    for (std::int32_t j = 0; j < 8; ++j) {
      const std::size_t at = std::size_t(8 * k + j) * kGroupColumns + std::size_t(c0);
      const auto value = [&](__m256i word) PAGEDATTN_INT8_TARGET {
        return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(word, 8 * (j % 4)), byte));
      };
      _mm256_storeu_ps(g.scales + at, _mm256_mul_ps(d, value(words[j / 4])));
      _mm256_storeu_ps(g.mins + at, _mm256_mul_ps(minus_dmin, value(words[2 + j / 4])));
    }
  }
}

// Q6_K: the scales d * sc[j] of super-block k's 16 sub-blocks for the
// group's columns (the rest zero), from its last 64 bytes transposed
// (`tail`, a row of kGroupColumns dwords each): rows 11-15 hold bytes 44-63,
// the int8 sc[0..16) at 46-61 (two bytes off the dwords) and the f16 d at
// 62-63.
PAGEDATTN_INT8_TARGET inline void PackQ6KScales(std::int32_t k, const std::uint8_t* tail,
                                                const Group& g) {
  for (std::int32_t c0 = 0; c0 < kGroupColumns; c0 += 8) {
    const __m256 d = HalvesOf(LineRow(tail, 15, c0), true);
    for (std::int32_t i = 0; i < 4; ++i) {  // sc[4i .. 4i + 3]
      const __m256i four = _mm256_or_si256(_mm256_srli_epi32(LineRow(tail, 11 + i, c0), 16),
                                           _mm256_slli_epi32(LineRow(tail, 12 + i, c0), 16));
      for (std::int32_t b = 0; b < 4; ++b) {
        const __m256i sc = _mm256_srai_epi32(_mm256_slli_epi32(four, 24 - 8 * b), 24);
        _mm256_storeu_ps(g.scales + std::size_t(16 * k + 4 * i + b) * kGroupColumns + c0,
                         _mm256_mul_ps(d, _mm256_cvtepi32_ps(sc)));
      }
    }
  }
}

// Weight row `row` of the group's column c (Q8_0, Q5_0, Q5_1): its quants
// unpacked to `q`, its scales (and mins) at the column's lane of g.
PAGEDATTN_INT8_TARGET inline void UnpackColumn(WeightFormat f, const std::uint8_t* row,
                                               std::int32_t in, const Int8Layout& layout,
                                               std::uint8_t* q, const Group& g, std::int32_t c) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return UnpackRow32<WeightFormat::kQ8_0>(row, in, layout, q, g.scales + c, g.mins + c,
                                              kGroupColumns);
    case WeightFormat::kQ5_0:
      return UnpackRow32<WeightFormat::kQ5_0>(row, in, layout, q, g.scales + c, g.mins + c,
                                              kGroupColumns);
    case WeightFormat::kQ5_1:
      return UnpackRow32<WeightFormat::kQ5_1>(row, in, layout, q, g.scales + c, g.mins + c,
                                              kGroupColumns);
    default:  // Q4_0, Q4_1 and the K-quants: their Pack*Group
      return;
  }
}

// The sums of x8[0..16) and x8[16..32): xor 0x80 makes the values
// unsigned (+128 each), vpsadbw adds each 8 of them.
PAGEDATTN_INT8_TARGET inline void SumsOf16(const std::int8_t* x8, std::int32_t* sums) {
  const __m256i u = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8)),
                                     _mm256_set1_epi8(static_cast<char>(0x80)));
  const __m256i eights = _mm256_sad_epu8(u, _mm256_setzero_si256());  // 4 x 64-bit
  const __m128i low = _mm256_castsi256_si128(eights), high = _mm256_extracti128_si256(eights, 1);
  sums[0] =
      static_cast<std::int32_t>(_mm_cvtsi128_si64(low) + _mm_extract_epi64(low, 1)) - 16 * 128;
  sums[1] =
      static_cast<std::int32_t>(_mm_cvtsi128_si64(high) + _mm_extract_epi64(high, 1)) - 16 * 128;
}

// x[0] + ... + x[31] in one fixed order on every target and compiler:
// s_i = x_i + x_(16+i), then halves of s added (8, 4, 2, 1 lanes).
PAGEDATTN_INT8_TARGET inline float SumOf32Floats(const float* x) {
  const __m256 low = _mm256_add_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(x + 16));
  const __m256 high = _mm256_add_ps(_mm256_loadu_ps(x + 8), _mm256_loadu_ps(x + 24));
  const __m256 eight = _mm256_add_ps(low, high);
  const __m128 four = _mm_add_ps(_mm256_castps256_ps128(eight), _mm256_extractf128_ps(eight, 1));
  const __m128 two = _mm_add_ps(four, _mm_movehl_ps(four, four));
  return _mm_cvtss_f32(_mm_add_ss(two, _mm_movehdup_ps(two)));
}

// One row x[in] as the tiles take it: int8 per 32 values and their scales
// (quantize_activations_q8), the exact f32 sums of x per 32 (for the mins;
// only with `sums`) and the sums of the int8 values per 16.
PAGEDATTN_INT8_TARGET inline void QuantizeRow(const float* x, std::int32_t in, bool sums,
                                              std::int8_t* x8, float* dx, float* xsums,
                                              std::int32_t* sums16) {
  quantize_activations_q8(x, in, x8, dx);
  for (std::int32_t b = 0; sums && b < in / 32; ++b) xsums[b] = SumOf32Floats(x + 32 * b);
  for (std::int32_t b = 0; b < in / 32; ++b) SumsOf16(x8 + 32 * b, sums16 + 2 * b);
}

// -zero x the sums of a row's int8 values per S inputs, from their sums per 16.
inline void ZeroSums(const Int8Layout& layout, const std::int32_t* sums16, std::int32_t in,
                     std::int32_t* zsums) {
  const std::int32_t per = layout.sub / 16;  // sums of 16 per S
  for (std::int32_t s = 0; s < in / layout.sub; ++s) {
    std::int32_t sum = 0;
    for (std::int32_t k = 0; k < per; ++k) sum += sums16[per * s + k];
    zsums[s] = -layout.zero * sum;
  }
}

// The pass of rows [first, first + rows) of a's x: rounded here into `b`,
// or read from a.x_rows where the caller rounded them already.
PAGEDATTN_INT8_TARGET inline PassRows PassOf(const DotTilesArgs& a, const Int8Layout& layout,
                                             std::int32_t first, std::int32_t rows,
                                             const PassBuffers& b) {
  const std::int32_t in = a.in, blocks = in / 32, subs = in / layout.sub;
  for (std::int32_t r = 0; r < rows; ++r) {
    const std::int32_t* sums16 = b.sums16 + std::size_t(r) * (in / 16);
    if (a.x_rows != nullptr) {
      sums16 = a.x_rows->sums16.data() + std::size_t(first + r) * (in / 16);
    } else {
      QuantizeRow(a.x + std::size_t(first + r) * in, in, layout.mins, b.x8 + std::size_t(r) * in,
                  b.dx + std::size_t(r) * blocks, b.xsums + std::size_t(r) * blocks,
                  b.sums16 + std::size_t(r) * (in / 16));
    }
    ZeroSums(layout, sums16, in, b.zsums + std::size_t(r) * subs);
  }
  if (a.x_rows == nullptr) return {b.x8, b.dx, b.xsums, b.zsums};
  const Int8Rows& x = *a.x_rows;
  return {x.x8.data() + std::size_t(first) * in, x.dx.data() + std::size_t(first) * blocks,
          x.xsums.data() + std::size_t(first) * blocks, b.zsums};
}

// The 4-bit formats and the K-quants skip unpacking each column on its
// own: their bits go through the unit's TransposeLine as stored, then
// SplitStep splits each transposed dword of nibbles into two of the tiles'
// steps of 4 weights (a dword of Q4_0 / Q4_1 quants holds weights 4k .. 4k
// + 3 of its block in its low nibbles and 16 + 4k .. in its high ones, steps
// k and k + 4; one of Q4_K's, 4k .. of sub-block 2j and of sub-block 2j + 1,
// steps 8 apart), or MergeHighBitsStep merges a dword of low bits with one
// of high bits (Q5_K, Q6_K). Zero columns of a partial group multiply to
// nothing.

// Q4_1 straight from the weight rows: its blocks are 5 dwords (the f16
// scale and min, then 4 of quants), so 64-byte lines of the rows transpose
// the scales and mins too, to [block][column] for HeadersToScales. A
// partial group, and the last part-line of every row, is copied into g.rows
// first.
PAGEDATTN_INT8_TARGET inline void PackQ4_1Group(const DotTilesArgs& a, const Int8Layout& layout,
                                                std::int32_t o, std::int32_t count,
                                                const Group& g) {
  constexpr std::int32_t kBlockDwords = BlockTraits<WeightFormat::kQ4_1>::kBytes / 4;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;  // a transposed dword row
  const std::size_t row_bytes = std::size_t(weight_row_bytes(WeightFormat::kQ4_1, a.in));
  const std::size_t direct = count == kGroupColumns ? row_bytes / 64 * 64 : 0;
  const std::size_t copied = (row_bytes - direct + 63) / 64 * 64;  // g.rows' stride
  const auto* w = static_cast<const std::uint8_t*>(a.w) + std::size_t(o) * row_bytes;
  if (copied != 0) {
    std::memset(g.rows, 0, kGroupColumns * copied);
    for (std::int32_t c = 0; c < count; ++c)
      std::memcpy(g.rows + c * copied, w + c * row_bytes + direct, row_bytes - direct);
  }
  float* headers = g.scales;
  alignas(64) std::uint8_t line[16 * kRowBytes];  // row t: dword t of the line of every column
  std::int32_t block = 0, d = 0;                  // dword d of block `block`
  for (std::size_t at = 0; at < row_bytes; at += 64) {
    if (at < direct)
      TransposeLine(w + at, row_bytes, line);
    else
      TransposeLine(g.rows + (at - direct), copied, line);
    const std::size_t rows = std::min<std::size_t>(16, (row_bytes - at) / 4);
    for (std::size_t t = 0; t < rows; ++t) {
      if (d == 0)
        std::memcpy(headers + std::size_t(block) * kGroupColumns, line + t * kRowBytes, kRowBytes);
      else
        SplitStep(line + t * kRowBytes, g.quants, std::size_t(block) * 8 + std::size_t(d - 1), 4);
      if (++d == kBlockDwords) d = 0, ++block;
    }
  }
  HeadersToScales(g, a.in / kQuantBlock, layout.mins);
}

// Where TransposeLine reads the super-blocks of a group of K-quant weight
// rows: the rows themselves where the group is whole, else whole copies in
// g.rows (zero columns past `count`).
struct KGroupBytes {
  const std::uint8_t* first;                // super-block 0 of the first column
  std::size_t column_stride, block_stride;  // to the next column's, super-block's
  const std::uint8_t* block(std::int32_t k) const { return first + k * block_stride; }
};

template <WeightFormat F>
PAGEDATTN_INT8_TARGET KGroupBytes KGroupBytesOf(const DotTilesArgs& a, std::int32_t o,
                                                std::int32_t count, const Group& g) {
  constexpr std::size_t kBlockBytes = BlockTraits<F>::kBytes;
  const std::size_t row_bytes = std::size_t(weight_row_bytes(F, a.in));
  const auto* w = static_cast<const std::uint8_t*>(a.w) + std::size_t(o) * row_bytes;
  if (count == kGroupColumns) return {w, row_bytes, kBlockBytes};
  std::memcpy(g.rows, w, std::size_t(count) * row_bytes);
  std::memset(g.rows + std::size_t(count) * row_bytes, 0,
              std::size_t(kGroupColumns - count) * row_bytes);
  return {g.rows, row_bytes, kBlockBytes};
}

// Q4_K: each super-block's 144 bytes as three 64-byte lines
// (KGroupBytesOf) at 0, 64 and 80: dwords 0-3 (d, dmin, scales and mins),
// then the 32 dwords of quants 4-15, 16-31 and (of the third) 32-35.
PAGEDATTN_INT8_TARGET inline void PackQ4KGroup(const DotTilesArgs& a, std::int32_t o,
                                               std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ4_K>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  static_assert(T::kQuants == 16 && T::kBytes == 144);
  const std::int32_t blocks = a.in / kQuantKBlock;
  const KGroupBytes src = KGroupBytesOf<WeightFormat::kQ4_K>(a, o, count, g);
  alignas(64) std::uint8_t lines[3][16 * kRowBytes];
  constexpr std::int32_t kLineAt[3] = {0, 64, 80};
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeLine(src.block(k) + kLineAt[l], src.column_stride, lines[l]);
    PackKScales(k, lines[0], g);
    for (std::int32_t q = 0; q < 32; ++q) {  // dword 4 + q of the block: sub-block 2 (q / 8)
      const std::int32_t l = q < 12 ? 0 : q < 28 ? 1 : 2, r = 4 + q - kLineAt[l] / 4;
      SplitStep(lines[l] + std::size_t(r) * kRowBytes, g.quants,
                std::size_t(64 * k + q / 8 * 16 + q % 8), 8);
    }
  }
}

// Q5_K: each super-block's first 64 bytes (d, dmin, scales and mins, 32
// bytes of fifth bits qh, the start of qs) and 128 of nibbles (qs) as three
// 64-byte lines (KGroupBytesOf). Sub-block j's weight l takes nibble j % 2
// of qs[32 (j / 2) + l] and bit j of qh[l]: its step (of 4 l) merges
// transposed dword 8 (j / 2) + l / 4 of qs with dword l / 4 of qh.
PAGEDATTN_INT8_TARGET inline void PackQ5KGroup(const DotTilesArgs& a, std::int32_t o,
                                               std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ5_K>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  static_assert(T::kQuants == T::kHighBits + 32 && T::kBytes == T::kQuants + 128);
  const std::int32_t blocks = a.in / kQuantKBlock;
  const KGroupBytes src = KGroupBytesOf<WeightFormat::kQ5_K>(a, o, count, g);
  // The first 64 bytes (rows 0-3: d, dmin, scales and mins; 4-11: qh), qs 0, qs 1
  alignas(64) std::uint8_t lines[3][16 * kRowBytes];
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeLine(src.block(k) + (l == 0 ? 0 : T::kQuants + 64 * (l - 1)), src.column_stride,
                    lines[l]);
    PackKScales(k, lines[0], g);
    for (std::int32_t j = 0; j < 8; ++j)
      for (std::int32_t m = 0; m < 8; ++m) {     // l / 4
        const std::int32_t q = 8 * (j / 2) + m;  // the dword of qs
        MergeHighBitsStep(lines[1 + q / 16] + std::size_t(q % 16) * kRowBytes, 4 * (j % 2),
                          lines[0] + std::size_t(4 + m) * kRowBytes, j, 0x01, g.quants,
                          std::size_t(64 * k + 8 * j + m));
      }
  }
}

// Q6_K: each super-block's 128 bytes of low bits (ql) and 64 of high bits
// (qh) as three 64-byte lines, its scales in a fourth (KGroupBytesOf).
// Weight 128h + 32g + l (h < 2, g < 4, l < 32) takes bits 4 (g / 2) of
// ql[64h + 32 (g % 2) + l] and bits 2g of qh[32h + l]: its step (of 4 l)
// merges transposed dword 8 (g % 2) + l / 4 of ql line h with dword
// 8h + l / 4 of the qh line.
PAGEDATTN_INT8_TARGET inline void PackQ6KGroup(const DotTilesArgs& a, std::int32_t o,
                                               std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ6_K>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  const std::int32_t blocks = a.in / kQuantKBlock;
  static_assert(T::kScales == T::kBytes - 18 && T::kScale == T::kBytes - 2);
  const KGroupBytes src = KGroupBytesOf<WeightFormat::kQ6_K>(a, o, count, g);
  alignas(64) std::uint8_t lines[4][16 * kRowBytes];  // ql 0, ql 1, qh, the last 64 bytes
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeLine(src.block(k) + 64 * l, src.column_stride, lines[l]);
    TransposeLine(src.block(k) + T::kBytes - 64, src.column_stride, lines[3]);
    PackQ6KScales(k, lines[3], g);
    for (std::int32_t h = 0; h < 2; ++h)
      for (std::int32_t gg = 0; gg < 4; ++gg)
        for (std::int32_t m = 0; m < 8; ++m)  // l / 4
          MergeHighBitsStep(lines[h] + std::size_t(8 * (gg % 2) + m) * kRowBytes, 4 * (gg / 2),
                            lines[2] + std::size_t(8 * h + m) * kRowBytes, 2 * gg, 0x03, g.quants,
                            std::size_t(64 * k + 32 * h + 8 * gg + m));
  }
}

// Q4_0: its blocks of 18 bytes leave the quants off dword bounds, so each
// column's quant bytes are copied into g.rows first.
PAGEDATTN_INT8_TARGET inline void PackQ4_0Group(const DotTilesArgs& a, std::int32_t o,
                                                std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ4_0>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  const std::size_t stored = (std::size_t(a.in) / 2 + 63) / 64 * 64;  // g.rows' bytes a column
  const std::int32_t blocks = a.in / kQuantBlock, dwords = a.in / 8;
  const std::int64_t row_bytes = weight_row_bytes(WeightFormat::kQ4_0, a.in);
  const auto* w = static_cast<const std::uint8_t*>(a.w) + std::size_t(o) * row_bytes;
  float* headers = g.scales;
  if (count < kGroupColumns) {
    std::memset(g.rows, 0, kGroupColumns * stored);
    std::memset(headers, 0, sizeof(float) * kGroupColumns * std::size_t(blocks));
  }
  for (std::int32_t c = 0; c < count; ++c) {
    const std::uint8_t* row = w + c * row_bytes;
    std::uint8_t* quants = g.rows + c * stored;
    for (std::int32_t b = 0; b < blocks; ++b) {
      const std::uint8_t* block = row + b * T::kBytes;
      std::memcpy(quants + std::size_t(b) * 16, block + T::kQuants, 16);
      std::memcpy(headers + std::size_t(b) * kGroupColumns + std::size_t(c), block, 4);
    }
  }
  alignas(64) std::uint8_t line[16 * kRowBytes];
  for (std::size_t at = 0; at < stored; at += 64) {
    TransposeLine(g.rows + at, stored, line);
    const std::int32_t first = static_cast<std::int32_t>(at / 4);
    for (std::int32_t t = 0; t < 16 && first + t < dwords; ++t)
      SplitStep(line + t * kRowBytes, g.quants, std::size_t((first + t) / 4 * 8 + (first + t) % 4),
                4);
  }
  // After the transposes: the last columns' header stores have long left
  // the store buffer (a vector load of fresh scalar stores waits for them).
  HeadersToScales(g, blocks, false);
}

// Weight rows [o, o + count) of `a` into the group `g` of kGroupColumns:
// the 4-bit formats and the K-quants by their own Pack*Group; Q8_0, Q5_0
// and Q5_1 unpacked a column at a time into g.rows (a byte a weight, the
// scales and mins into the column's lane), then transposed a 64-byte line
// of every column at a time.
PAGEDATTN_INT8_TARGET inline void PackGroup(const DotTilesArgs& a, const Int8Layout& layout,
                                            std::int32_t o, std::int32_t count, const Group& g) {
  switch (a.format) {
    case WeightFormat::kQ4_0:
      return PackQ4_0Group(a, o, count, g);
    case WeightFormat::kQ4_1:
      return PackQ4_1Group(a, layout, o, count, g);
    case WeightFormat::kQ4_K:
      return PackQ4KGroup(a, o, count, g);
    case WeightFormat::kQ5_K:
      return PackQ5KGroup(a, o, count, g);
    case WeightFormat::kQ6_K:
      return PackQ6KGroup(a, o, count, g);
    default:
      break;
  }
  const std::size_t padded = padded_in(a.in);
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
    UnpackColumn(a.format, w + (o + c) * row_bytes, a.in, layout, g.rows + c * padded, g, c);
  for (std::size_t at = 0; at < padded; at += 64)
    TransposeLine(g.rows + at, padded, g.quants + at * kGroupColumns);
}

// dot_tiles_int8 on the unit's tiles (GroupTimesPass<S, mins, signed>, which
// may pick a tile by the layout's quant bits too): x quantised (or read
// from a.x_rows) kPassRows rows at a time, each group of the column range
// packed once per pass and multiplied by all of its rows.
PAGEDATTN_INT8_TARGET inline void DotTilesInt8(const DotTilesArgs& a, std::int32_t out_begin,
                                               std::int32_t out_end,
                                               core::CacheLineVector<float>& scratch) {
  const ScratchPlan plan(a.in, kGroupColumns);
  scratch.resize(plan.total);
  Group g;
  PassBuffers buffers;
  carve(plan, scratch.data(), g, buffers);
  const Int8Layout layout = layout_of(a.format, kSaturating);
  for (std::int32_t first = 0; first < a.rows; first += kPassRows) {
    const std::int32_t rows = std::min(kPassRows, a.rows - first);
    const PassRows p = PassOf(a, layout, first, rows, buffers);
    float* y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; o += kGroupColumns) {
      const std::int32_t count = std::min(kGroupColumns, out_end - o);
      PackGroup(a, layout, o, count, g);
      if (o + count < out_end)
        prefetch_weight_rows(a, o + count, std::min(kGroupColumns, out_end - o - count));
      if (layout.sub == 16)
        GroupTimesPass<16, false, false>(a, layout, p, rows, g, count, y + o);
      else if (layout.mins)
        GroupTimesPass<32, true, false>(a, layout, p, rows, g, count, y + o);
      else if (kSaturating && layout.signed_quants)
        GroupTimesPass<32, false, kSaturating>(a, layout, p, rows, g, count, y + o);
      else
        GroupTimesPass<32, false, false>(a, layout, p, rows, g, count, y + o);
    }
  }
}
