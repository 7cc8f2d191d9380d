// The int8 tiles' weight packing and row quantisation (int8_tiles_common.h
// has the layouts), shared by the tile widths: included by each width's
// translation unit inside a namespace of its own, after defining
// PAGEDATTN_INT8_TARGET (the function attribute of that unit's target) and
// the unit's steps at its own width: TransposeLine (a 64-byte line of each
// column of a group, transposed), DwordsAt (4 bytes of each column's row
// from the transposed rows), NibbleSteps (a transposed dword of nibbles into
// two steps, with Q5_0's and Q5_1's fifth bits), ByteStep (Q8_0's quants)
// and MergeHighBitsStep (Q5_K's and Q6_K's 4 low and 1-2 high bits into a
// step). What works a column at a time (scales, mins) runs on 256-bit
// vectors here.
// No include guard: a unit may include it once per namespace.

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

// A group's transposed dword row r of a 64-byte line (kGroupColumns
// dwords), lanes c0 .. c0 + 7.
PAGEDATTN_INT8_TARGET inline __m256i LineRow(const std::uint8_t* line, std::int32_t r,
                                             std::int32_t c0) {
  return _mm256_loadu_si256(
      reinterpret_cast<const __m256i*>(line + (std::size_t(r) * kGroupColumns + c0) * 4));
}

// Q4_K / Q5_K: the scales d * sc[j] and mins -dmin * m[j] of super-block
// k's sub-blocks j for the group's columns, from its first
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
// group's columns, from its last 64 bytes transposed
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
  const std::int32_t at = first + a.x_rows_first;  // the pass's first row in a.x_rows
  for (std::int32_t r = 0; r < rows; ++r) {
    const std::int32_t* sums16 = b.sums16 + std::size_t(r) * (in / 16);
    if (a.x_rows != nullptr) {
      sums16 = a.x_rows->sums16.data() + std::size_t(at + r) * (in / 16);
    } else {
      QuantizeRow(a.x + std::size_t(first + r) * in, in, layout.mins, b.x8 + std::size_t(r) * in,
                  b.dx + std::size_t(r) * blocks, b.xsums + std::size_t(r) * blocks,
                  b.sums16 + std::size_t(r) * (in / 16));
    }
    ZeroSums(layout, sums16, in, b.zsums + std::size_t(r) * subs);
  }
  if (a.x_rows == nullptr) return {b.x8, b.dx, b.xsums, b.zsums};
  const Int8Rows& x = *a.x_rows;
  return {x.x8.data() + std::size_t(at) * in, x.dx.data() + std::size_t(at) * blocks,
          x.xsums.data() + std::size_t(at) * blocks, b.zsums};
}

// Every format's bits go through the unit's TransposeLine as stored (a
// 64-byte line of each column of a group at a time), then into the tiles'
// steps of 4 weights: a transposed dword of nibbles split into two steps
// (NibbleSteps: a dword of Q4_0 / Q4_1 / Q5_0 / Q5_1 quants holds weights
// 4k .. 4k + 3 of its block in its low nibbles and 16 + 4k .. in its high
// ones, steps k and k + 4; one of Q4_K's, 4k .. of sub-block 2j and of
// sub-block 2j + 1, steps 8 apart), a dword of low bits merged with one of
// high bits (MergeHighBitsStep: Q5_K, Q6_K), or Q8_0's dword of quants as
// it is (ByteStep).

// A group's weight rows: column c's row, and past `count` the last one
// again (lanes past `count` are never stored: what they hold does not
// matter, only that it is read from within the weights).
struct GroupRows {
  const std::uint8_t* row[kGroupColumns];
  std::size_t bytes;  // a row's
  GroupRows(const DotTilesArgs& a, std::int32_t o, std::int32_t count)
      : bytes(std::size_t(weight_row_bytes(a.format, a.in))) {
    const auto* w = static_cast<const std::uint8_t*>(a.w) + std::size_t(o) * bytes;
    for (std::int32_t c = 0; c < kGroupColumns; ++c)
      row[c] = w + std::size_t(std::min(c, count - 1)) * bytes;
  }
};

// The 64 bytes at `at` of each of the group's rows, transposed
// (TransposeLine). A line that runs past the rows' end reads the last
// row's tail from a zeroed copy; the rows before it run on into the next
// row, bytes that no field of theirs takes.
PAGEDATTN_INT8_TARGET inline void TransposeGroupLine(const GroupRows& rows, std::size_t at,
                                                     std::uint8_t* dst) {
  if (at + 64 <= rows.bytes) return TransposeLine(rows.row, at, dst);
  const std::uint8_t* const last = rows.row[kGroupColumns - 1];
  alignas(64) std::uint8_t tail[64] = {};
  std::memcpy(tail, last + at, rows.bytes - at);
  const std::uint8_t* src[kGroupColumns];
  for (std::int32_t c = 0; c < kGroupColumns; ++c)
    src[c] = rows.row[c] == last ? tail : rows.row[c] + at;
  TransposeLine(src, 0, dst);
}

// Q8_0, Q4_0, Q4_1, Q5_0, Q5_1: block b of the group from its rows
// transposed (`t`: dword d of column c's row at t + (ring_row(4 d) *
// kGroupColumns + c) * 4): its f16 scale (and min) to g.scales (g.mins),
// F16C's exact conversion for 8 columns at once; its quants as steps of 4
// weights (ByteStep, NibbleSteps).
template <WeightFormat F>
PAGEDATTN_INT8_TARGET PAGEDATTN_INT8_INLINE void PackBlock32(const std::uint8_t* t, std::int32_t b,
                                                             const Int8Layout& layout,
                                                             const Group& g) {
  using T = BlockTraits<F>;
  constexpr bool kMins = F == WeightFormat::kQ4_1 || F == WeightFormat::kQ5_1;
  constexpr bool kFifth = F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1;
  const std::size_t base = std::size_t(b) * T::kBytes, step = 8 * std::size_t(b);
  for (std::int32_t c0 = 0; c0 < kGroupColumns; c0 += 8) {
    // The scale: the low half of the dword at base, or the high half of the
    // one before; the min (base a multiple of 4), the high half.
    const __m256i header = LineRow(t, static_cast<std::int32_t>(ring_row(base)), c0);
    const std::size_t at = std::size_t(b) * kGroupColumns + std::size_t(c0);
    _mm256_storeu_ps(g.scales + at, HalvesOf(header, base % 4 != 0));
    if constexpr (kMins) _mm256_storeu_ps(g.mins + at, HalvesOf(header, true));
  }
  if constexpr (F == WeightFormat::kQ8_0) {
    for (std::size_t k = 0; k < 8; ++k)
      ByteStep(t, base + T::kQuants + 4 * k, layout.signed_quants, g.quants, step + k);
  } else {
    auto qh = DwordsAt(t, base);  // unused without fifth bits
    if constexpr (kFifth) qh = DwordsAt(t, base + T::kHighBits);
    for (std::int32_t k = 0; k < 4; ++k)
      NibbleSteps(t, base + T::kQuants + 4 * std::size_t(k), kFifth ? &qh : nullptr, k, g.quants,
                  step + std::size_t(k), 4);
  }
}

// A group of a 32-weight format: each 64-byte line of its rows transposed
// into g.rows' ring (TransposeGroupLine), then the blocks that line
// completes packed (PackBlock32) while the line and the one before it are
// there.
template <WeightFormat F>
PAGEDATTN_INT8_TARGET void PackGroup32(const DotTilesArgs& a, const Int8Layout& layout,
                                       std::int32_t o, std::int32_t count, const Group& g) {
  constexpr std::size_t kBlockBytes = BlockTraits<F>::kBytes;
  const GroupRows rows(a, o, count);
  const std::int32_t blocks = a.in / kQuantBlock;
  std::int32_t b = 0;
  for (std::size_t at = 0; at < rows.bytes; at += 64) {
    TransposeGroupLine(rows, at, g.rows + ring_row(at) * 4 * kGroupColumns);
    for (const std::size_t end = at + 64; b < blocks && (std::size_t(b) + 1) * kBlockBytes <= end;
         ++b)
      PackBlock32<F>(g.rows, b, layout, g);
  }
}

// Q4_K: each super-block's 144 bytes as three 64-byte lines
// (GroupRows) at 0, 64 and 80: dwords 0-3 (d, dmin, scales and mins),
// then the 32 dwords of quants 4-15, 16-31 and (of the third) 32-35.
PAGEDATTN_INT8_TARGET inline void PackQ4KGroup(const DotTilesArgs& a, std::int32_t o,
                                               std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ4_K>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  static_assert(T::kQuants == 16 && T::kBytes == 144);
  const std::int32_t blocks = a.in / kQuantKBlock;
  const GroupRows src(a, o, count);
  alignas(64) std::uint8_t lines[3][16 * kRowBytes];
  constexpr std::int32_t kLineAt[3] = {0, 64, 80};
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeGroupLine(src, std::size_t(k) * T::kBytes + kLineAt[l], lines[l]);
    PackKScales(k, lines[0], g);
    for (std::int32_t q = 0; q < 32; ++q) {  // dword 4 + q of the block: sub-block 2 (q / 8)
      const std::int32_t l = q < 12 ? 0 : q < 28 ? 1 : 2, r = 4 + q - kLineAt[l] / 4;
      NibbleSteps(lines[l], 4 * std::size_t(r), nullptr, 0, g.quants,
                  std::size_t(64 * k + q / 8 * 16 + q % 8), 8);
    }
  }
}

// Q5_K: each super-block's first 64 bytes (d, dmin, scales and mins, 32
// bytes of fifth bits qh, the start of qs) and 128 of nibbles (qs) as three
// 64-byte lines (GroupRows). Sub-block j's weight l takes nibble j % 2
// of qs[32 (j / 2) + l] and bit j of qh[l]: its step (of 4 l) merges
// transposed dword 8 (j / 2) + l / 4 of qs with dword l / 4 of qh.
PAGEDATTN_INT8_TARGET inline void PackQ5KGroup(const DotTilesArgs& a, std::int32_t o,
                                               std::int32_t count, const Group& g) {
  using T = BlockTraits<WeightFormat::kQ5_K>;
  constexpr std::size_t kRowBytes = 4 * kGroupColumns;
  static_assert(T::kQuants == T::kHighBits + 32 && T::kBytes == T::kQuants + 128);
  const std::int32_t blocks = a.in / kQuantKBlock;
  const GroupRows src(a, o, count);
  // The first 64 bytes (rows 0-3: d, dmin, scales and mins; 4-11: qh), qs 0, qs 1
  alignas(64) std::uint8_t lines[3][16 * kRowBytes];
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeGroupLine(src, std::size_t(k) * T::kBytes + (l == 0 ? 0 : T::kQuants + 64 * (l - 1)),
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
// (qh) as three 64-byte lines, its scales in a fourth (GroupRows).
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
  const GroupRows src(a, o, count);
  alignas(64) std::uint8_t lines[4][16 * kRowBytes];  // ql 0, ql 1, qh, the last 64 bytes
  for (std::int32_t k = 0; k < blocks; ++k) {
    for (std::int32_t l = 0; l < 3; ++l)
      TransposeGroupLine(src, std::size_t(k) * T::kBytes + 64 * l, lines[l]);
    TransposeGroupLine(src, std::size_t(k) * T::kBytes + T::kBytes - 64, lines[3]);
    PackQ6KScales(k, lines[3], g);
    for (std::int32_t h = 0; h < 2; ++h)
      for (std::int32_t gg = 0; gg < 4; ++gg)
        for (std::int32_t m = 0; m < 8; ++m)  // l / 4
          MergeHighBitsStep(lines[h] + std::size_t(8 * (gg % 2) + m) * kRowBytes, 4 * (gg / 2),
                            lines[2] + std::size_t(8 * h + m) * kRowBytes, 2 * gg, 0x03, g.quants,
                            std::size_t(64 * k + 32 * h + 8 * gg + m));
  }
}

// Weight rows [o, o + count) of `a` into the group `g` of kGroupColumns:
// the K-quants by their own Pack*Group, the 32-weight formats by
// PackGroup32.
PAGEDATTN_INT8_TARGET inline void PackGroup(const DotTilesArgs& a, const Int8Layout& layout,
                                            std::int32_t o, std::int32_t count, const Group& g) {
  switch (a.format) {
    case WeightFormat::kQ4_K:
      return PackQ4KGroup(a, o, count, g);
    case WeightFormat::kQ5_K:
      return PackQ5KGroup(a, o, count, g);
    case WeightFormat::kQ6_K:
      return PackQ6KGroup(a, o, count, g);
    case WeightFormat::kQ8_0:
      return PackGroup32<WeightFormat::kQ8_0>(a, layout, o, count, g);
    case WeightFormat::kQ4_0:
      return PackGroup32<WeightFormat::kQ4_0>(a, layout, o, count, g);
    case WeightFormat::kQ4_1:
      return PackGroup32<WeightFormat::kQ4_1>(a, layout, o, count, g);
    case WeightFormat::kQ5_0:
      return PackGroup32<WeightFormat::kQ5_0>(a, layout, o, count, g);
    case WeightFormat::kQ5_1:
      return PackGroup32<WeightFormat::kQ5_1>(a, layout, o, count, g);
    default:
      throw InvalidArgument(std::string("dot_tiles_int8: no int8 tiles for ") +
                            weight_format_name(a.format));
  }
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
    [[maybe_unused]] const PassTiles tiles(layout, rows);
    float* y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; o += kGroupColumns) {
      const std::int32_t count = std::min(kGroupColumns, out_end - o);
      PackGroup(a, layout, o, count, g);
      if (o + count < out_end)
        prefetch_weight_rows(a, o + count, std::min(kGroupColumns, out_end - o - count));
      else if (first + rows == a.rows && a.next_count > 0)
        prefetch_weight_rows(a, a.next_first, std::min(kGroupColumns, a.next_count));
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
