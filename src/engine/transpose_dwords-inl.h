// A 16 x 16 transpose of dwords on 512-bit vectors (AVX-512 F), included
// inside a namespace of its own by each unit that uses it, after defining
// PAGEDATTN_TRANSPOSE_TARGET (the function attribute of the unit's target).
// No include guard.

// dst[t][c] = dword t of src[c] + at for 16 rows of 16 dwords (dst 64
// bytes a row): unpacks of dwords and qwords within 128-bit blocks, then
// two rounds of block shuffles. A 64-byte line of each of 16 rows (the
// int8 tiles' weight rows; the AMX bf16 tiles' rows of x and their sums).
PAGEDATTN_TRANSPOSE_TARGET void TransposeLine(const std::uint8_t* const* src, std::size_t at,
                                              std::uint8_t* dst) {
  __m512i r[16], t[16];
  for (int c = 0; c < 16; ++c) r[c] = _mm512_loadu_si512(src[c] + at);
  for (int i = 0; i < 8; ++i) {  // block b of t[2i]: r[2i][4b], r[2i+1][4b], r[2i][4b+1], ...
    t[2 * i] = _mm512_unpacklo_epi32(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_epi32(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < 4; ++i) {  // block b of r[4i + j]: rows 4i .. 4i + 3 of dword 4b + j
    r[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
    r[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
    r[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
  }
  for (int j = 0; j < 4; ++j) {
    const __m512i even_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0x88);  // blocks 0, 2
    const __m512i odd_lo = _mm512_shuffle_i32x4(r[j], r[4 + j], 0xdd);   // blocks 1, 3
    const __m512i even_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0x88);
    const __m512i odd_hi = _mm512_shuffle_i32x4(r[8 + j], r[12 + j], 0xdd);
    _mm512_storeu_si512(dst + 64 * j, _mm512_shuffle_i32x4(even_lo, even_hi, 0x88));
    _mm512_storeu_si512(dst + 64 * (8 + j), _mm512_shuffle_i32x4(even_lo, even_hi, 0xdd));
    _mm512_storeu_si512(dst + 64 * (4 + j), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0x88));
    _mm512_storeu_si512(dst + 64 * (12 + j), _mm512_shuffle_i32x4(odd_lo, odd_hi, 0xdd));
  }
}
