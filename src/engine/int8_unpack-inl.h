// The int8 tiles' weight unpacking and row quantisation (int8_tiles_common.h
// has the layouts), on 256-bit vectors: included by each tile width's
// translation unit inside a namespace of its own, after defining
//   PAGEDATTN_INT8_TARGET  the function attribute of that unit's target;
//   PAGEDATTN_INT8_MASKS   1 where AVX-512BW's byte masks may be used.
// No include guard: a unit may include it once per namespace.

// F16C's conversion (exact): the portable one costs a branchy call per block.
PAGEDATTN_INT8_TARGET inline float half_at(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return _cvtsh_ss(bits);
}

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

// q + 16 in the bytes of `high` whose bit `bit` is set (Q5_K's fifth bits).
PAGEDATTN_INT8_TARGET inline __m256i AddFifthBitsOf(__m256i high, std::int32_t bit, __m256i q) {
  const __m256i mask = _mm256_set1_epi8(static_cast<char>(1 << bit));
#if PAGEDATTN_INT8_MASKS
  return _mm256_mask_add_epi8(q, _mm256_test_epi8_mask(high, mask), q, _mm256_set1_epi8(16));
#else
  const __m256i set = _mm256_cmpeq_epi8(_mm256_and_si256(high, mask), mask);
  return _mm256_add_epi8(q, _mm256_and_si256(set, _mm256_set1_epi8(16)));
#endif
}

// The 32-weight formats (quant_kernels.h): block b's quants, scale and min.
// Q8_0's quants xor 0x80 (unsigned, zero 128), or as they are when `layout`
// keeps them signed.
template <WeightFormat F>
PAGEDATTN_INT8_TARGET void UnpackRow32(const std::uint8_t* row, std::int32_t in,
                                       const Int8Layout& layout, const ColumnOut& out) {
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  for (std::int32_t b = 0; b < in / kQuantBlock; ++b) {
    const std::uint8_t* block = row + b * kBytes;
    std::uint8_t* q = out.q + std::size_t(b) * kQuantBlock;
    out.scales[std::size_t(b) * out.stride] = half_at(block);
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
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), v);
    if constexpr (F == WeightFormat::kQ4_1 || F == WeightFormat::kQ5_1)
      out.mins[std::size_t(b) * out.stride] = half_at(block + 2);
  }
}

// Q4_K / Q5_K: sub-block j of 32 of each super-block, scale d * sc[j] and
// min -dmin * m[j].
template <WeightFormat F>
PAGEDATTN_INT8_TARGET void UnpackRowK45(const std::uint8_t* row, std::int32_t in,
                                        const ColumnOut& out) {
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const __m256i low4 = _mm256_set1_epi8(0x0f);
  for (std::int32_t k = 0; k < in / kQuantKBlock; ++k) {
    const std::uint8_t* block = row + k * kBytes;
    std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    const float d = half_at(block), dmin = half_at(block + 2);
    for (std::int32_t j = 0; j < 8; ++j) {
      out.scales[std::size_t(8 * k + j) * out.stride] = d * float(sc[j]);
      out.mins[std::size_t(8 * k + j) * out.stride] = -dmin * float(m[j]);
    }
    std::uint8_t* q = out.q + std::size_t(k) * kQuantKBlock;
    __m256i qh = _mm256_setzero_si256();
    if constexpr (F == WeightFormat::kQ5_K)  // bit j of qh[l]: bit 4 of sub-block j's weight l
      qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kHighBits));
    for (std::int32_t j = 0; j < 8; ++j) {  // sub-block j: nibble j % 2 of quant bytes 32 (j / 2)
      const __m256i v = _mm256_loadu_si256(
          reinterpret_cast<const __m256i*>(block + BlockTraits<F>::kQuants + 32 * (j / 2)));
      __m256i sub = _mm256_and_si256(j % 2 == 0 ? v : _mm256_srli_epi16(v, 4), low4);
      if constexpr (F == WeightFormat::kQ5_K) sub = AddFifthBitsOf(qh, j, sub);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 32 * j), sub);
    }
  }
}

// Q6_K: half h, group g of 32: low 4 bits from ql, 2 high bits from qh;
// scale d * sc[j] per 16 weights.
PAGEDATTN_INT8_TARGET inline void UnpackRowQ6K(const std::uint8_t* row, std::int32_t in,
                                               const ColumnOut& out) {
  using T = BlockTraits<WeightFormat::kQ6_K>;
  const __m256i low4 = _mm256_set1_epi8(0x0f), low2 = _mm256_set1_epi8(0x03);
  for (std::int32_t k = 0; k < in / kQuantKBlock; ++k) {
    const std::uint8_t* block = row + k * T::kBytes;
    const float d = half_at(block + T::kScale);
    for (std::int32_t j = 0; j < 16; ++j)
      out.scales[std::size_t(16 * k + j) * out.stride] =
          d * float(static_cast<std::int8_t>(block[T::kScales + j]));
    std::uint8_t* q = out.q + std::size_t(k) * kQuantKBlock;
    for (std::int32_t h = 0; h < 2; ++h) {
      const __m256i qh =
          _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + T::kHighBits + 32 * h));
      for (std::int32_t g = 0; g < 4; ++g) {
        const __m256i ql =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(block + 64 * h + 32 * (g % 2)));
        const __m256i low = _mm256_and_si256(_mm256_srli_epi16(ql, 4 * (g / 2)), low4);
        const __m256i high = _mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), low2);
        _mm256_storeu_si256(reinterpret_cast<__m256i*>(q + 128 * h + 32 * g),
                            _mm256_or_si256(low, _mm256_slli_epi16(high, 4)));
      }
    }
  }
}

PAGEDATTN_INT8_TARGET inline void UnpackRow(WeightFormat f, const std::uint8_t* row,
                                            std::int32_t in, const Int8Layout& layout,
                                            const ColumnOut& out) {
  switch (f) {
    case WeightFormat::kQ8_0:
      return UnpackRow32<WeightFormat::kQ8_0>(row, in, layout, out);
    case WeightFormat::kQ4_0:
      return UnpackRow32<WeightFormat::kQ4_0>(row, in, layout, out);
    case WeightFormat::kQ4_1:
      return UnpackRow32<WeightFormat::kQ4_1>(row, in, layout, out);
    case WeightFormat::kQ5_0:
      return UnpackRow32<WeightFormat::kQ5_0>(row, in, layout, out);
    case WeightFormat::kQ5_1:
      return UnpackRow32<WeightFormat::kQ5_1>(row, in, layout, out);
    case WeightFormat::kQ4_K:
      return UnpackRowK45<WeightFormat::kQ4_K>(row, in, out);
    case WeightFormat::kQ5_K:
      return UnpackRowK45<WeightFormat::kQ5_K>(row, in, out);
    case WeightFormat::kQ6_K:
      return UnpackRowQ6K(row, in, out);
    default:
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

// Weight rows [o, o + count) of `a` into the group `g` of kGroupColumns
// (the unit's TransposeLine transposes a 64-byte line of each row).
PAGEDATTN_INT8_TARGET inline void PackGroup(const DotTilesArgs& a, const Int8Layout& layout,
                                            std::int32_t o, std::int32_t count, const Group& g) {
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
    UnpackRow(a.format, w + (o + c) * row_bytes, a.in, layout,
              {g.rows + c * padded, g.scales + c, g.mins + c, kGroupColumns});
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
