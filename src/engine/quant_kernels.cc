// Quantised-weight products (see quant_kernels.h). Each block is decoded once
// into f32 vectors and multiplied into up to kRowTile activation rows, so a
// batch of a few rows reads the weights once. The 32-weight formats decode
// the weights themselves (w = d * q + m, one multiply-add); the K-quants
// multiply the integer quants into x, one partial sum per (sub-)block and
// row, and scale the partial sums: 2.5-7 vector operations per 8 weights.
#include "engine/quant_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cpu/prefetch.h"
#include "kernels/cpu/row_groups.h"
#include "pagedattn/dtype.h"
#include "pagedattn/errors.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/quant_kernels.cc"
#include <hwy/cache_control.h>
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h: the weight decoders.
#include "engine/weight_decode-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
constexpr std::int32_t kRowTile = 4;

// The in-place kernels' row tiles: kRowTile rows, then a pair, then one.
// Each weight vector is decoded once per tile, so rows left over from the
// tiles of 4 go in pairs rather than one by one; a row's sums do not depend
// on its tile (each (row, weight row) pair has its own chain).
using InPlaceRowTiles = kernels::RowGroups<kRowTile, 2, 1>;

// Lanes [c * N, c * N + N) of a Q8_0 block's quants, unscaled.
HWY_INLINE hn::Vec<DF> Q8Quants(const std::uint8_t* block, std::size_t c) {
  const DF df;
  const hn::Rebind<std::int8_t, DF> d8;
  const auto* q =
      reinterpret_cast<const std::int8_t*>(block + BlockTraits<WeightFormat::kQ8_0>::kQuants);
  return hn::ConvertTo(
      df, hn::PromoteTo(hn::RebindToSigned<DF>(), hn::LoadU(d8, q + c * hn::Lanes(df))));
}

// y[r][o + c] for rows [row, row + R) and weight rows [o, o + C). Each
// (row, weight row) pair has its own accumulator, summed in the same order
// whatever R and C are, so the tile shape does not change any result. Several
// weight rows per call give a single activation row independent chains of
// multiply-adds instead of one chain bound by their latency. Q8_0 multiplies
// its quants into x and scales each block's partial sum by d once (one
// multiply fewer per vector); the others decode w = d * q (+ m) per vector.
template <WeightFormat F, std::int32_t R, std::int32_t C>
HWY_INLINE void DotTile(const QuantProductArgs& a, std::int32_t row, std::int32_t o) {
  const DF df;
  const std::size_t n = hn::Lanes(df), chunks = kQuantBlock / n;
  const std::int64_t blocks = a.in / kQuantBlock, row_bytes = blocks * BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * row_bytes;
  constexpr bool kScaleBlocks = F == WeightFormat::kQ8_0;
  hn::Vec<DF> acc[R][C];
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < C; ++c) acc[r][c] = hn::Zero(df);
  for (std::int64_t b = 0; b < blocks; ++b) {
    hn::Vec<DF> block_sum[R][C];
    for (std::int32_t r = 0; r < R; ++r)
      for (std::int32_t c = 0; c < C; ++c) block_sum[r][c] = hn::Zero(df);
    auto& sum = kScaleBlocks ? block_sum : acc;
    for (std::size_t chunk = 0; chunk < chunks; ++chunk) {
      const std::size_t at = std::size_t(b) * kQuantBlock + chunk * n;
      hn::Vec<DF> x[R];
      for (std::int32_t r = 0; r < R; ++r)
        x[r] = hn::LoadU(df, a.x + std::size_t(row + r) * a.in + at);
      for (std::int32_t c = 0; c < C; ++c) {
        const std::uint8_t* block = w + c * row_bytes + b * BlockTraits<F>::kBytes;
        if (chunk == 0) PrefetchPast<PrefetchLevel::kL2>(block, BlockTraits<F>::kBytes);
        const auto weights = kScaleBlocks ? Q8Quants(block, chunk) : DecodeChunk<F>(block, chunk);
        for (std::int32_t r = 0; r < R; ++r) sum[r][c] = hn::MulAdd(weights, x[r], sum[r][c]);
      }
    }
    if constexpr (kScaleBlocks)
      for (std::int32_t c = 0; c < C; ++c) {
        const auto d = hn::Set(df, HalfAt(w + c * row_bytes + b * BlockTraits<F>::kBytes));
        for (std::int32_t r = 0; r < R; ++r) acc[r][c] = hn::MulAdd(d, block_sum[r][c], acc[r][c]);
      }
  }
  for (std::int32_t r = 0; r < R; ++r)
    for (std::int32_t c = 0; c < C; ++c) {
      float* y = a.y + std::size_t(row + r) * a.ldy + o + c;
      const float sum = hn::GetLane(hn::SumOfLanes(df, acc[r][c]));
      *y = a.accumulate ? *y + sum : sum;
    }
}

// The last rows % kRowTile rows against weight rows [o, o + C).
template <WeightFormat F, std::int32_t C>
HWY_INLINE void LeftoverRows(const QuantProductArgs& a, std::int32_t row, std::int32_t o) {
  const std::int32_t left = a.rows - row;
  if constexpr (F == WeightFormat::kQ8_0 && C > 2) {  // two sums per (row, weight row)
    for (; row < a.rows; ++row) DotTile<F, 1, C>(a, row, o);
  } else {
    if (left >= 2) DotTile<F, 2, C>(a, row, o);
    if (left % 2 == 1) DotTile<F, 1, C>(a, a.rows - 1, o);
  }
}

constexpr std::int32_t kColumnTile = 4;

// Weight rows in groups of kColumnTile, so that a group's blocks stay in L1
// while every row group of x passes over them.
template <WeightFormat F>
void ProductRange(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  const std::int32_t full = a.rows - a.rows % kRowTile;
  std::int32_t o = out_begin;
  for (; o + kColumnTile <= out_end; o += kColumnTile) {
    for (std::int32_t c = 0; c < kColumnTile; ++c)
      for (std::int32_t row = 0; row < full; row += kRowTile)
        DotTile<F, kRowTile, 1>(a, row, o + c);
    LeftoverRows<F, kColumnTile>(a, full, o);
  }
  for (; o < out_end; ++o) {
    for (std::int32_t row = 0; row < full; row += kRowTile) DotTile<F, kRowTile, 1>(a, row, o);
    LeftoverRows<F, 1>(a, full, o);
  }
}

// ---------------------------------------------------------------- K-quants

// quantize_activations_q8 (quant_kernels.h): max |x| per 32 values, the
// scale max / 127, and x * (1 / scale) rounded to nearest even. Every step is
// exact or rounds once, so every target gives the same bytes.
void QuantizeQ8(const float* x, std::int32_t in, std::int8_t* q, float* scales) {
  const DF df;
  const hn::Rebind<std::int8_t, DF> d8;
  const std::size_t n = hn::Lanes(df);
  for (std::int32_t k = 0; k < in / 32; ++k) {
    const float* v = x + std::size_t(k) * 32;
    auto high = hn::Abs(hn::LoadU(df, v));
    for (std::size_t c = n; c < 32; c += n) high = hn::Max(high, hn::Abs(hn::LoadU(df, v + c)));
    const float scale = hn::GetLane(hn::MaxOfLanes(df, high)) / 127.0f;
    const auto inverse = hn::Set(df, scale > 0.0f ? 1.0f / scale : 0.0f);
    scales[k] = scale;
    for (std::size_t c = 0; c < 32; c += n)  // |x * inverse| <= 127 (+ an ulp)
      hn::StoreU(hn::DemoteTo(d8, hn::NearestInt(hn::Mul(hn::LoadU(df, v + c), inverse))), d8,
                 q + std::size_t(k) * 32 + c);
  }
}

// sums[k] = x[32 k] + ... + x[32 k + 31] for k < in / 32: the Q4_K / Q5_K
// mins multiply these. The same operations for a row whatever the call.
HWY_INLINE void SumsOf32(const float* x, std::int32_t in, float* sums) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  for (std::int32_t k = 0; k < in / 32; ++k) {
    const float* p = x + std::size_t(k) * 32;
    auto s = hn::LoadU(df, p);
    for (std::size_t c = n; c < 32; c += n) s = hn::Add(s, hn::LoadU(df, p + c));
    sums[k] = hn::GetLane(hn::SumOfLanes(df, s));
  }
}

template <std::int32_t R>
HWY_INLINE void StoreSums(const QuantProductArgs& a, std::int32_t row, std::int32_t o,
                          const float* sums) {
  for (std::int32_t r = 0; r < R; ++r) {
    float* y = a.y + std::size_t(row + r) * a.ldy + o;
    *y = a.accumulate ? *y + sums[r] : sums[r];
  }
}

// Q4_K / Q5_K: y[r][o] for rows [row, row + R) and one weight row o.
// Per sub-block pair and row, the quants times x in two partial sums, which
// the pair's scales d * sc (exact in f32) then multiply; the mins'
// contribution dmin * m[j] * sum(x of sub-block j) in a second accumulator.
template <WeightFormat F, std::int32_t R>
HWY_INLINE void DotRowsK45(const QuantProductArgs& a, const float* xsums, std::int32_t row,
                           std::int32_t o) {
  const DF df;
  const hn::CappedTag<float, 8> dm;  // the 8 mins of a super-block
  const std::size_t n = hn::Lanes(df), chunks = 32 / n, nm = hn::Lanes(dm);
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const float* x[R];
  const float* xs[R];
  hn::Vec<DF> acc[R];
  hn::Vec<decltype(dm)> macc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x[r] = a.x + std::size_t(row + r) * a.in;
    xs[r] = xsums + std::size_t(row + r) * (a.in / 32);
    acc[r] = hn::Zero(df);
    macc[r] = hn::Zero(dm);
  }
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    const float d = HalfAt(block), dmin = HalfAt(block + 2);
    alignas(8) std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    // d * sc[j] (exact in f32) into memory, whence each is broadcast.
    alignas(32) float scales[8];
    for (std::size_t k = 0; k < 8; k += nm) {
      hn::Store(ScaledIntegers(dm, sc + k, d), dm, scales + k);
      const auto mins = ScaledIntegers(dm, m + k, dmin);
      for (std::int32_t r = 0; r < R; ++r)
        macc[r] = hn::MulAdd(mins, hn::LoadU(dm, xs[r] + b * 8 + k), macc[r]);
    }
    for (std::size_t i = 0; i < 4; ++i) {
      hn::Vec<DF> lo_sum[R], hi_sum[R];
      for (std::int32_t r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = hn::Zero(df);
      for (std::size_t c = 0; c < chunks; ++c) {
        hn::Vec<DF> lo, hi;
        DecodeKPair<F>(block, i, c, lo, hi);
        const std::size_t at = std::size_t(b) * kQuantKBlock + 64 * i + c * n;
        for (std::int32_t r = 0; r < R; ++r) {
          const auto xlo = hn::LoadU(df, x[r] + at), xhi = hn::LoadU(df, x[r] + at + 32);
          lo_sum[r] = hn::MulAdd(lo, xlo, lo_sum[r]);
          hi_sum[r] = hn::MulAdd(hi, xhi, hi_sum[r]);
        }
      }
      const auto scale_lo = hn::Set(df, scales[2 * i]), scale_hi = hn::Set(df, scales[2 * i + 1]);
      for (std::int32_t r = 0; r < R; ++r)
        acc[r] = hn::Add(acc[r], hn::MulAdd(scale_hi, hi_sum[r], hn::Mul(scale_lo, lo_sum[r])));
    }
  }
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r)
    sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r])) - hn::GetLane(hn::SumOfLanes(dm, macc[r]));
  StoreSums<R>(a, row, o, sums);
}

// Q6_K, one group P of DotRowsQ6K: 16 weights of g = P and of g = P + 2 per
// row, scaled by their 16-weight scales.
template <int P, std::int32_t R>
HWY_INLINE void DotQ6Group(const std::uint8_t* block, float d, std::size_t h, std::size_t half,
                           const float* const* x, std::size_t base, hn::Vec<DF>* acc) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  hn::Vec<DF> a_sum[R], b_sum[R];
  for (std::int32_t r = 0; r < R; ++r) a_sum[r] = b_sum[r] = hn::Zero(df);
  for (std::size_t l = 16 * half; l < 16 * half + 16; l += n) {
    hn::Vec<DF> a, b;
    DecodeQ6<P>(block, h, l, a, b);
    const std::size_t at = base + 128 * h + 32 * P + l;
    for (std::int32_t r = 0; r < R; ++r) {
      const auto xa = hn::LoadU(df, x[r] + at), xb = hn::LoadU(df, x[r] + at + 64);
      a_sum[r] = hn::MulAdd(a, xa, a_sum[r]);
      b_sum[r] = hn::MulAdd(b, xb, b_sum[r]);
    }
  }
  const auto* scales =
      reinterpret_cast<const std::int8_t*>(block + BlockTraits<WeightFormat::kQ6_K>::kScales);
  const std::size_t k = 8 * h + 2 * P + half;  // (128 h + 32 g + l) / 16
  const auto scale_a = hn::Set(df, d * scales[k]), scale_b = hn::Set(df, d * scales[k + 4]);
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(acc[r], hn::MulAdd(scale_b, b_sum[r], hn::Mul(scale_a, a_sum[r])));
}

template <std::int32_t R>
HWY_INLINE void DotRowsQ6K(const QuantProductArgs& a, std::int32_t row, std::int32_t o) {
  const DF df;
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<WeightFormat::kQ6_K>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const float* x[R];
  hn::Vec<DF> acc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x[r] = a.x + std::size_t(row + r) * a.in;
    acc[r] = hn::Zero(df);
  }
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    const float d = HalfAt(block + BlockTraits<WeightFormat::kQ6_K>::kScale);
    const std::size_t base = std::size_t(b) * kQuantKBlock;
    for (std::size_t h = 0; h < 2; ++h)
      for (std::size_t half = 0; half < 2; ++half) {
        DotQ6Group<0, R>(block, d, h, half, x, base, acc);
        DotQ6Group<1, R>(block, d, h, half, x, base, acc);
      }
  }
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r) sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
  StoreSums<R>(a, row, o, sums);
}

// ------------------------------------------ 8-lane K-quant kernels (x86 AVX2+)
//
// The kernels above widen each quant byte to a 32-bit lane (a lane-crossing
// shuffle per 8 weights, the bound of their AVX2 loop by llvm-mca's Zen 3
// model). These read a block's quant bytes as 8 u32 lanes of 4 bytes and
// take the weights of byte position B (0..3) of every lane with masks (and
// shifts): vector B holds the weights 4 l + B, l < 8, of a 32-weight group.
// The activations are permuted to match once per call (xp below), so the
// sums run in another order than above (still fixed per row). Q4_K / Q5_K
// take byte B's field in place, as q * 2^(8B) (exact), and their x is scaled
// by 2^(-8B) in the permutation, so each product is q * x exactly as without
// the scaling - unless |x| < 2^-102, where x * 2^-24 is subnormal and loses
// bits (an error below 2^-125 |q| per term).
#undef PAGEDATTN_WIDE_K
#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2
#define PAGEDATTN_WIDE_K 1
using D8 = hn::CappedTag<float, 8>;
using V8 = hn::Vec<D8>;
using D8U = hn::RebindToUnsigned<D8>;
using V8U = hn::Vec<D8U>;

// 32 quant bytes as 8 u32 lanes.
HWY_INLINE V8U Load32(const std::uint8_t* p) {
  const D8U du;
  const hn::Repartition<std::uint8_t, D8U> d8;
  return hn::BitCast(du, hn::LoadU(d8, p));
}

template <int S>
HWY_INLINE V8U ShiftBy(V8U v) {  // left by S bits, right by -S
  if constexpr (S > 0) return hn::ShiftLeft<S>(v);
  if constexpr (S < 0) return hn::ShiftRight<-S>(v);
  return v;
}

// xp[32 k + 8 b + l] = x[32 k + 4 l + b] (times 2^(-8b) when scaled) for
// k < in / 32: the order in which the 8-lane kernels take the weights of a
// 32-weight group.
HWY_INLINE void PermuteX(const float* x, std::int32_t in, bool scaled, float* xp) {
  constexpr float kScale[2][4] = {{1.0f, 1.0f, 1.0f, 1.0f}, {1.0f, 0x1p-8f, 0x1p-16f, 0x1p-24f}};
  for (std::int32_t k = 0; k < in; k += 32)
    for (std::int32_t b = 0; b < 4; ++b)
      for (std::int32_t l = 0; l < 8; ++l) xp[k + 8 * b + l] = x[k + 4 * l + b] * kScale[scaled][b];
}

// The field `mask` << 8B of every u32 lane, in place: field * 2^(8B) as
// f32 (on 8 or 16 lanes).
template <int B, std::uint32_t kMask, class VU>
HWY_INLINE auto FieldInPlace(VU fields) {
  const hn::DFromV<VU> du;
  const hn::RebindToSigned<decltype(du)> di;
  const auto v = hn::And(fields, hn::Set(du, kMask << (8 * B)));
  return hn::ConvertTo(hn::RebindToFloat<decltype(du)>(), hn::BitCast(di, v));
}

// The 6-bit two's-complement field in bits [8B, 8B + 6) of every lane as f32.
template <int B, class VU>
HWY_INLINE auto SignedSixBits(VU fields) {
  const hn::DFromV<VU> du;
  const hn::RebindToSigned<decltype(du)> di;
  return hn::ConvertTo(hn::RebindToFloat<decltype(du)>(),
                       hn::ShiftRight<26>(hn::ShiftLeft<26 - 8 * B>(hn::BitCast(di, fields))));
}

// The four steps of a pair of field vectors lo and hi of N lanes: for B =
// 0..3, lo_sum[r] += field(B, lo) x the N values of row r's permuted x at
// at + N B, and hi_sum[r] += field(B, hi) x those at at + hi_at + N B.
template <std::int32_t R, class VU, class V, class Field>
HWY_INLINE void FieldSteps(VU lo, VU hi, const Field& field, const float* const* xp, std::size_t at,
                           std::size_t hi_at, V* lo_sum, V* hi_sum) {
  const hn::DFromV<V> df;
  const std::size_t n = hn::Lanes(df);
  const auto step = [&](auto b) {
    const V wlo = field(b, lo), whi = field(b, hi);
    for (std::int32_t r = 0; r < R; ++r) {
      lo_sum[r] = hn::MulAdd(wlo, hn::LoadU(df, xp[r] + at + n * b), lo_sum[r]);
      hi_sum[r] = hn::MulAdd(whi, hn::LoadU(df, xp[r] + at + hi_at + n * b), hi_sum[r]);
    }
  };
  step(std::integral_constant<int, 0>());
  step(std::integral_constant<int, 1>());
  step(std::integral_constant<int, 2>());
  step(std::integral_constant<int, 3>());
}

// FieldSteps' fields: quants of kMask bits in place, Q6_K's signed six bits.
template <std::uint32_t kMask>
constexpr auto kInPlace = [](auto b, auto fields) { return FieldInPlace<b(), kMask>(fields); };
constexpr auto kSixBits = [](auto b, auto fields) { return SignedSixBits<b()>(fields); };

// AVX-512 targets run the in-place kernels on 16 lanes where a layout
// allows: each instruction then does twice an 8-lane one's work
// (docs/benchmarks.md, "One row on 512-bit vectors").
#undef PAGEDATTN_QUADS32
#if HWY_TARGET <= HWY_AVX3
#define PAGEDATTN_QUADS32 1
#else
#define PAGEDATTN_QUADS32 0
#endif
constexpr bool kQuads32 = PAGEDATTN_QUADS32;

#if PAGEDATTN_QUADS32
using D16 = hn::CappedTag<float, 16>;
using V16 = hn::Vec<D16>;
using D16U = hn::RebindToUnsigned<D16>;
using V16U = hn::Vec<D16U>;

#endif

// Q4_K / Q5_K sub-blocks 2I (lo) and 2I + 1 (hi): their quants in bits
// [8B, 8B + 4) (Q4_K) or [8B, 8B + 5) (Q5_K, bit 2I / 2I + 1 of qh as bit 4)
// of every lane, for FieldInPlace.
template <WeightFormat F, int I>
HWY_INLINE void KPairFields(const std::uint8_t* block, V8U& lo, V8U& hi) {
  const D8U du;
  const auto v = Load32(block + BlockTraits<F>::kQuants + 32 * I);
  lo = v;
  hi = hn::ShiftRight<4>(v);
  if constexpr (F == WeightFormat::kQ5_K) {
    const auto nibbles = hn::Set(du, 0x0f0f0f0fu);
    lo = hn::And(lo, nibbles);
    hi = hn::And(hi, nibbles);
    const auto qh = Load32(block + BlockTraits<F>::kHighBits);
    const auto bit4 = hn::Set(du, 0x10101010u);
    lo = hn::Or(lo, hn::And(ShiftBy<4 - 2 * I>(qh), bit4));
    hi = hn::Or(hi, hn::And(ShiftBy<3 - 2 * I>(qh), bit4));
  }
}

template <WeightFormat F, std::int32_t R, int I>
HWY_INLINE void WidePair(const std::uint8_t* block, const float* const* xp, std::size_t base,
                         const float* scales, V8* acc) {
  const D8 df;
  V8U lo, hi;
  KPairFields<F, I>(block, lo, hi);
  V8 lo_sum[R], hi_sum[R];
  for (std::int32_t r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = hn::Zero(df);
  const std::size_t at = base + 64 * I;
  constexpr std::uint32_t kMask = F == WeightFormat::kQ5_K ? 0x1f : 0x0f;
  FieldSteps<R>(lo, hi, kInPlace<kMask>, xp, at, 32, lo_sum, hi_sum);
  const auto scale_lo = hn::Set(df, scales[2 * I]), scale_hi = hn::Set(df, scales[2 * I + 1]);
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(acc[r], hn::MulAdd(scale_hi, hi_sum[r], hn::Mul(scale_lo, lo_sum[r])));
}

#if PAGEDATTN_QUADS32
// Q4_K / Q5_K on 16 lanes: sub-block pairs 2J and 2J + 1 side by side
// (lanes 0-7 and 8-15), x permuted to match (PermuteXK16).
template <WeightFormat F, std::int32_t R, int J>
HWY_INLINE void WidePairs16(const std::uint8_t* block, const float* const* xp, std::size_t base,
                            const float* scales, V16* acc) {
  const D16 df;
  const D16U du;
  const D8 df8;
  V8U lo0, hi0, lo1, hi1;
  KPairFields<F, 2 * J>(block, lo0, hi0);
  KPairFields<F, 2 * J + 1>(block, lo1, hi1);
  const V16U lo = hn::Combine(du, lo1, lo0), hi = hn::Combine(du, hi1, hi0);
  V16 lo_sum[R], hi_sum[R];
  for (std::int32_t r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = hn::Zero(df);
  const std::size_t at = base + 128 * J;
  constexpr std::uint32_t kMask = F == WeightFormat::kQ5_K ? 0x1f : 0x0f;
  FieldSteps<R>(lo, hi, kInPlace<kMask>, xp, at, 64, lo_sum, hi_sum);
  // Pair 2J + p takes sub-blocks 4J + 2p (lo) and 4J + 2p + 1 (hi).
  const V16 scale_lo =
      hn::Combine(df, hn::Set(df8, scales[4 * J + 2]), hn::Set(df8, scales[4 * J]));
  const V16 scale_hi =
      hn::Combine(df, hn::Set(df8, scales[4 * J + 3]), hn::Set(df8, scales[4 * J + 1]));
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(acc[r], hn::MulAdd(scale_hi, hi_sum[r], hn::Mul(scale_lo, lo_sum[r])));
}

#endif

// Q4_K / Q5_K on 8 lanes (16 on AVX-512 targets): as DotRowsK45, x
// permuted (xp).
template <WeightFormat F, std::int32_t R>
HWY_INLINE void WideRowsK45(const QuantProductArgs& a, const float* xp_rows, const float* xsums,
                            std::int32_t row, std::int32_t o) {
  const D8 df;
  const hn::Rebind<std::uint8_t, D8> d8;
  const hn::RebindToSigned<D8> di;
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const float* xp[R];
  const float* xs[R];
  V8 acc[R], macc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    xp[r] = xp_rows + std::size_t(row + r) * a.in;
    xs[r] = xsums + std::size_t(row + r) * (a.in / 32);
    acc[r] = macc[r] = hn::Zero(df);
  }
#if PAGEDATTN_QUADS32
  V16 acc16[R];
  for (std::int32_t r = 0; r < R; ++r) acc16[r] = hn::Zero(D16());
#endif
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    alignas(8) std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    alignas(32) float scales[8];
    hn::Store(ScaledIntegers(df, sc, HalfAt(block)), df, scales);
    // Broadcast each scale from memory (a load) rather than by shuffles.
    asm volatile("" : : "r"(scales) : "memory");
    const auto mins = ScaledIntegers(df, m, HalfAt(block + 2));
    for (std::int32_t r = 0; r < R; ++r)
      macc[r] = hn::MulAdd(mins, hn::LoadU(df, xs[r] + b * 8), macc[r]);
    const std::size_t base = std::size_t(b) * kQuantKBlock;
#if PAGEDATTN_QUADS32
    WidePairs16<F, R, 0>(block, xp, base, scales, acc16);
    WidePairs16<F, R, 1>(block, xp, base, scales, acc16);
#else
    WidePair<F, R, 0>(block, xp, base, scales, acc);
    WidePair<F, R, 1>(block, xp, base, scales, acc);
    WidePair<F, R, 2>(block, xp, base, scales, acc);
    WidePair<F, R, 3>(block, xp, base, scales, acc);
#endif
  }
#if PAGEDATTN_QUADS32
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(hn::LowerHalf(df, acc16[r]), hn::UpperHalf(df, acc16[r]));
#endif
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r)
    sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r])) - hn::GetLane(hn::SumOfLanes(df, macc[r]));
  StoreSums<R>(a, row, o, sums);
}

// Q6_K on 8 lanes (16 on AVX-512 targets, below): group g = P (a) and g =
// P + 2 (b) of half h. The fields
// q | high bits << 4 are xor-ed with 32 per byte, so that each byte's low 6
// bits are q - 32 in two's complement. Lanes 0-3 hold weights l < 16 of the
// group and lanes 4-7 weights l >= 16: their scales differ, so the partial
// sums are scaled per lane.
// The fields of groups P (fa) and P + 2 (fb) of half h, for SignedSixBits.
template <int P>
HWY_INLINE void Q6Fields(const std::uint8_t* block, std::size_t h, V8U qh, V8U& fa, V8U& fb) {
  const D8U du;
  const auto ql = Load32(block + 64 * h + 32 * P);
  const auto nibbles = hn::Set(du, 0x0f0f0f0fu), bits45 = hn::Set(du, 0x30303030u);
  const auto flip = hn::Set(du, 0x20202020u);
  fa = hn::Xor(hn::Or(hn::And(ql, nibbles), hn::And(ShiftBy<4 - 2 * P>(qh), bits45)), flip);
  fb = hn::Xor(
      hn::Or(hn::And(hn::ShiftRight<4>(ql), nibbles), hn::And(ShiftBy<-2 * P>(qh), bits45)), flip);
}

template <std::int32_t R, int P>
HWY_INLINE void WideQ6(const std::uint8_t* block, std::size_t h, V8U qh, const float* const* xp,
                       std::size_t at, V8 scale_a, V8 scale_b, V8* acc) {
  const D8 df;
  V8U fa, fb;
  Q6Fields<P>(block, h, qh, fa, fb);
  V8 a_sum[R], b_sum[R];
  for (std::int32_t r = 0; r < R; ++r) a_sum[r] = b_sum[r] = hn::Zero(df);
  FieldSteps<R>(fa, fb, kSixBits, xp, at, 64, a_sum, b_sum);
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(acc[r], hn::MulAdd(scale_b, b_sum[r], hn::Mul(scale_a, a_sum[r])));
}

#if PAGEDATTN_QUADS32
// Q6_K on 16 lanes: groups P = 0 and 1 of half h side by side (lanes 0-7
// and 8-15), x permuted to match (PermuteXK16).
template <std::int32_t R>
HWY_INLINE void WideQ6Half16(const std::uint8_t* block, std::size_t h, V8U qh,
                             const float* const* xp, std::size_t at, V16 scale_a, V16 scale_b,
                             V16* acc) {
  const D16 df;
  const D16U du;
  V8U fa0, fb0, fa1, fb1;
  Q6Fields<0>(block, h, qh, fa0, fb0);
  Q6Fields<1>(block, h, qh, fa1, fb1);
  const V16U fa = hn::Combine(du, fa1, fa0), fb = hn::Combine(du, fb1, fb0);
  V16 a_sum[R], b_sum[R];
  for (std::int32_t r = 0; r < R; ++r) a_sum[r] = b_sum[r] = hn::Zero(df);
  FieldSteps<R>(fa, fb, kSixBits, xp, at, 64, a_sum, b_sum);
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(acc[r], hn::MulAdd(scale_b, b_sum[r], hn::Mul(scale_a, a_sum[r])));
}

// x permuted for the 16-lane K-quant kernels: xp[256 k + 128 o + 64 m + 16
// B + 8 p + l] = x[256 k + 32 g + 4 l + B] of super-block k, where g is
// Q4_K / Q5_K's sub-block 4 o + 2 p + m (WidePairs16: pair 2o + p, its lo
// (m = 0) or hi (m = 1) sub-block), scaled by 2^(-8 B), or Q6_K's group 4 o
// + p + 2 m (WideQ6Half16: half o, group p (m = 0) or p + 2 (m = 1)).
template <WeightFormat F>
HWY_INLINE void PermuteXK16(const float* x, std::int32_t in, float* xp) {
  constexpr bool kQ6 = F == WeightFormat::kQ6_K;
  constexpr float kScale[4] = {1.0f, kQ6 ? 1.0f : 0x1p-8f, kQ6 ? 1.0f : 0x1p-16f,
                               kQ6 ? 1.0f : 0x1p-24f};
  for (std::int32_t k = 0; k < in; k += kQuantKBlock)
    for (std::int32_t o = 0; o < 2; ++o)
      for (std::int32_t m = 0; m < 2; ++m)
        for (std::int32_t b = 0; b < 4; ++b)
          for (std::int32_t p = 0; p < 2; ++p) {
            const std::int32_t g = kQ6 ? 4 * o + p + 2 * m : 4 * o + 2 * p + m;
            for (std::int32_t l = 0; l < 8; ++l)
              xp[k + 128 * o + 64 * m + 16 * b + 8 * p + l] = x[k + 32 * g + 4 * l + b] * kScale[b];
          }
}
#endif

template <std::int32_t R>
HWY_INLINE void WideRowsQ6K(const QuantProductArgs& a, const float* xp_rows, std::int32_t row,
                            std::int32_t o) {
  const D8 df;
  const hn::Rebind<std::int8_t, D8> d8;
  const hn::RebindToSigned<D8> di;
  // Lanes 0-3 take scale 2g of a half's 8, lanes 4-7 scale 2g + 1.
  alignas(32) static constexpr std::int32_t kLanes[4][8] = {{0, 0, 0, 0, 1, 1, 1, 1},
                                                            {2, 2, 2, 2, 3, 3, 3, 3},
                                                            {4, 4, 4, 4, 5, 5, 5, 5},
                                                            {6, 6, 6, 6, 7, 7, 7, 7}};
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<WeightFormat::kQ6_K>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const float* xp[R];
  V8 acc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    xp[r] = xp_rows + std::size_t(row + r) * a.in;
    acc[r] = hn::Zero(df);
  }
#if PAGEDATTN_QUADS32
  V16 acc16[R];
  for (std::int32_t r = 0; r < R; ++r) acc16[r] = hn::Zero(D16());
#endif
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    const auto d = hn::Set(df, HalfAt(block + BlockTraits<WeightFormat::kQ6_K>::kScale));
    const auto* scales =
        reinterpret_cast<const std::int8_t*>(block + BlockTraits<WeightFormat::kQ6_K>::kScales);
    for (std::size_t h = 0; h < 2; ++h) {
      const auto dsc =
          hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(d8, scales + 8 * h))), d);
      const auto qh = Load32(block + BlockTraits<WeightFormat::kQ6_K>::kHighBits + 32 * h);
      const std::size_t at = std::size_t(b) * kQuantKBlock + 128 * h;
      const auto lanes = [&](int g) {
        return hn::TableLookupLanes(dsc, hn::SetTableIndices(df, kLanes[g]));
      };
#if PAGEDATTN_QUADS32
      const D16 d16;
      WideQ6Half16<R>(block, h, qh, xp, at, hn::Combine(d16, lanes(1), lanes(0)),
                      hn::Combine(d16, lanes(3), lanes(2)), acc16);
#else
      WideQ6<R, 0>(block, h, qh, xp, at, lanes(0), lanes(2), acc);
      WideQ6<R, 1>(block, h, qh, xp, at + 32, lanes(1), lanes(3), acc);
#endif
    }
  }
#if PAGEDATTN_QUADS32
  for (std::int32_t r = 0; r < R; ++r)
    acc[r] = hn::Add(hn::LowerHalf(df, acc16[r]), hn::UpperHalf(df, acc16[r]));
#endif
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r) sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[r]));
  StoreSums<R>(a, row, o, sums);
}

// Rows in groups of at most kWideGroup: prepare(x, xp, extra) writes each
// row's permuted x (in floats) and `extra` more floats into per-thread
// scratch, then columns(g, xp, extras) multiplies the group (g: the group's
// rows and y).
constexpr std::int32_t kWideGroup = 8;

template <typename Prepare, typename Columns>
HWY_INLINE void ForRowGroups(const QuantProductArgs& a, std::size_t extra, Prepare prepare,
                             Columns columns) {
  thread_local std::vector<float> scratch;
  const std::size_t per_row = std::size_t(a.in) + extra;
  if (scratch.size() < kWideGroup * per_row) scratch.resize(kWideGroup * per_row);
  for (std::int32_t first = 0; first < a.rows; first += kWideGroup) {
    const std::int32_t rows = std::min(kWideGroup, a.rows - first);
    float* xp = scratch.data();
    float* extras = xp + std::size_t(rows) * a.in;
    for (std::int32_t r = 0; r < rows; ++r)
      prepare(a.x + std::size_t(first + r) * a.in, xp + std::size_t(r) * a.in,
              extras + std::size_t(r) * extra);
    QuantProductArgs g = a;
    g.rows = rows;
    g.y = a.y + std::size_t(first) * a.ldy;
    columns(g, xp, extras);
  }
}

template <WeightFormat F>
void WideRangeK(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  constexpr bool kSums = F != WeightFormat::kQ6_K;  // Q4_K / Q5_K: sums of 32 for the mins
  const auto prepare = [&](const float* x, float* xp, float* xsums) {
#if PAGEDATTN_QUADS32
    PermuteXK16<F>(x, a.in, xp);
#else
    PermuteX(x, a.in, kSums, xp);
#endif
    if constexpr (kSums) SumsOf32(x, a.in, xsums);
  };
  const auto columns = [&](const QuantProductArgs& g, const float* xp, const float* xsums) {
    for (std::int32_t o = out_begin; o < out_end; ++o)
      InPlaceRowTiles::VisitAll(0, g.rows, [&](auto rows, std::int32_t row) {
        if constexpr (F == WeightFormat::kQ6_K)
          WideRowsQ6K<rows()>(g, xp, row, o);
        else
          WideRowsK45<F, rows()>(g, xp, xsums, row, o);
      });
  };
  ForRowGroups(a, kSums ? std::size_t(a.in / 32) : 0, prepare, columns);
}

// ------------------------------ 32-weight formats on 8 or 16 lanes (f32 x)
//
// Two blocks' 16 quant bytes fill 8 u32 lanes (lanes 0-3 block 2p, 4-7
// block 2p + 1), and every field is taken in place as for the K-quants:
// field f < 4 is the low nibble of byte f of each lane (weight 4l + f of
// its block), f >= 4 the high nibble of byte f - 4 (weight 4l + f - 4 + 16),
// x permuted and scaled to match (PermuteX32). Each row sums the products of
// a pair in two partial sums (fields 0-3, 4-7), scales them by each lane's d
// and adds each lane's offset (Q4_1 / Q5_1: m; Q4_0: -8 d; Q5_0: -16 d)
// times its block's sum of x, which lane 4h alone carries (xsq). Pairs of
// blocks: a row of an odd number of blocks takes DotTile instead.

// Where the target has 16 f32 lanes, the 32-weight formats take four
// blocks at a time (quads: lanes 4h .. 4h + 3 block 4q + h) and a row's
// last pair, if its blocks are not whole quads, on 8 lanes: each
// instruction then does twice the work (docs/benchmarks.md, "One row on
// 512-bit vectors"). Elsewhere pairs throughout.

// The quads of a row of `in` weights (0 on 8-lane targets).
constexpr std::int32_t Quads32(std::int32_t in) {
  return kQuads32 ? in / 128 : 0;
}

// Quads q < Quads32(in): xp[128 q + 16 f + 4 h + l] = x[32 (4 q + h) + 4 l
// + f % 4 + 16 (f / 4)] * 2^(-8 (f % 4)); xsq[16 q + 4 h] = the sum of
// block 4q + h of x. The pairs p after them: xp[64 p + 8 f + 4 h + l] =
// x[32 (2 p + h) + 4 l + f % 4 + 16 (f / 4)] * 2^(-8 (f % 4)); xsq[8 p + 4
// h] = the sum of block 2p + h. The other lanes of xsq 0.
HWY_INLINE void PermuteX32(const float* x, std::int32_t in, float* xp, float* xsq) {
  // One group of `blocks` (2 or 4) blocks, 4 lanes each, from x, xp, xsq.
  const auto group = [](const float* x, std::int32_t blocks, float* xp, float* xsq) {
    constexpr float kScale[4] = {1.0f, 0x1p-8f, 0x1p-16f, 0x1p-24f};
    const std::int32_t lanes = 4 * blocks;
    float sums[4];
    SumsOf32(x, 32 * blocks, sums);
    for (std::int32_t f = 0; f < 8; ++f)
      for (std::int32_t h = 0; h < blocks; ++h)
        for (std::int32_t l = 0; l < 4; ++l)
          xp[lanes * f + 4 * h + l] = x[32 * h + 4 * l + f % 4 + 16 * (f / 4)] * kScale[f % 4];
    for (std::int32_t lane = 0; lane < lanes; ++lane)
      xsq[lane] = lane % 4 == 0 ? sums[lane / 4] : 0.0f;
  };
  const std::int32_t quads = Quads32(in);
  for (std::int32_t q = 0; q < quads; ++q) group(x + 128 * q, 4, xp + 128 * q, xsq + 16 * q);
  for (std::int32_t p = 2 * quads; p < in / 64; ++p) group(x + 64 * p, 2, xp + 64 * p, xsq + 8 * p);
}

// The fifth bits of two Q5 blocks as bit 4 of the byte their nibble is in:
// lo's byte k of block A (lanes 0-3) / B (lanes 4-7) holds bit k of that
// block's qh (weight k), hi's byte k bit 16 + k. Each byte picks its qh byte
// (vpshufb) and tests its bit (llama.cpp's bytes_from_bits_32 does the same).
// AVX2 targets; AVX-512 ones add the bits under byte masks (WideBlocks32).
HWY_INLINE void Q5FifthBits(std::uint32_t qh_a, std::uint32_t qh_b, V8U& lo, V8U& hi) {
  const __m256i qh = _mm256_set_m128i(_mm_set1_epi32(static_cast<int>(qh_b)),
                                      _mm_set1_epi32(static_cast<int>(qh_a)));
  const __m256i bit = _mm256_set1_epi64x(0x8040201008040201);
  const __m256i bytes_lo = _mm256_set_epi64x(0x0101010101010101, 0, 0x0101010101010101, 0);
  const __m256i bytes_hi = _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202,
                                             0x0303030303030303, 0x0202020202020202);
  const __m256i bit4 = _mm256_set1_epi8(0x10);
  const auto fifth = [&](__m256i bytes) {
    const __m256i picked = _mm256_and_si256(_mm256_shuffle_epi8(qh, bytes), bit);
    return V8U{_mm256_and_si256(_mm256_cmpeq_epi8(picked, bit), bit4)};
  };
  lo = fifth(bytes_lo);
  hi = fifth(bytes_hi);
}

// The block group of WideBlocks32: kBlocks (2, or 4 where the target has 16
// lanes) consecutive blocks on 4 kBlocks f32 lanes, 4 per block.
template <int kBlocks>
using DBlocks = hn::CappedTag<float, 4 * kBlocks>;

// Each lane's value of the half-precision field at byte `offset` of its
// block (lanes 4h .. 4h + 3: block h, blocks block_bytes apart).
template <int kBlocks>
HWY_INLINE hn::Vec<DBlocks<kBlocks>> PerBlock(const std::uint8_t* block, std::int64_t block_bytes,
                                              std::int64_t offset) {
  const auto pair = [&](std::int32_t h) {  // blocks h, h + 1 on 8 lanes
    const hn::Half<D8> dh;
    return hn::Combine(D8(), hn::Set(dh, HalfAt(block + (h + 1) * block_bytes + offset)),
                       hn::Set(dh, HalfAt(block + h * block_bytes + offset)));
  };
  if constexpr (kBlocks == 2) {
    return pair(0);
  } else {
    return hn::Combine(DBlocks<kBlocks>(), pair(2), pair(0));
  }
}

// kBlocks consecutive blocks from `block`, group g of the row's groups of
// kBlocks, into acc[r] for R rows (the group's x at xp + 32 kBlocks g, its
// sums at xsq + 4 kBlocks g).
template <WeightFormat F, std::int32_t R, int kBlocks>
HWY_INLINE void WideBlocks32(const std::uint8_t* block, const float* const* xp,
                             const float* const* xsq, std::size_t g,
                             hn::Vec<DBlocks<kBlocks>>* acc) {
  const DBlocks<kBlocks> df;
  const hn::RebindToUnsigned<decltype(df)> du;
  const D8U du8;
  const hn::Half<D8U> dh;
  const hn::Repartition<std::uint8_t, decltype(dh)> d8;
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  // Blocks h, h + 1 of the group on 8 lanes: their quant bytes.
  const auto quants = [&](std::int32_t h) {
    const auto at = [&](std::int32_t i) {
      return hn::BitCast(dh, hn::LoadU(d8, block + i * kBytes + BlockTraits<F>::kQuants));
    };
    return hn::Combine(du8, at(h + 1), at(h));
  };
  // The group's vector from the pairs' 8-lane ones.
  const auto whole = [&](const auto& of_pair) {
    if constexpr (kBlocks == 2) {
      return of_pair(0);
    } else {
      return hn::Combine(du, of_pair(2), of_pair(0));
    }
  };
  auto lo = whole(quants);
  auto hi = hn::ShiftRight<4>(lo);
  constexpr bool kFive = F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1;
  if constexpr (kFive) {
    const auto qh = [&](std::int32_t h) {
      std::uint32_t bits;
      std::memcpy(&bits, block + h * kBytes + BlockTraits<F>::kHighBits, sizeof bits);
      return bits;
    };
    const auto nibbles = hn::Set(du, 0x0f0f0f0fu);
    lo = hn::And(lo, nibbles);
    hi = hn::And(hi, nibbles);
#if HWY_TARGET <= HWY_AVX3
    // Byte 16 h + k of lo (hi) is weight k (16 + k) of block h: the blocks'
    // qh halves side by side are the byte masks that add the fifth bits, 16.
    std::uint64_t mask_lo = 0, mask_hi = 0;
    for (std::int32_t h = 0; h < kBlocks; ++h) {
      mask_lo |= std::uint64_t{qh(h) & 0xffffu} << (16 * h);
      mask_hi |= std::uint64_t{qh(h) >> 16} << (16 * h);
    }
    if constexpr (kBlocks == 2) {
      const __m256i sixteen = _mm256_set1_epi8(16);
      lo.raw = _mm256_mask_add_epi8(lo.raw, static_cast<__mmask32>(mask_lo), lo.raw, sixteen);
      hi.raw = _mm256_mask_add_epi8(hi.raw, static_cast<__mmask32>(mask_hi), hi.raw, sixteen);
    } else {
      const __m512i sixteen = _mm512_set1_epi8(16);
      lo.raw = _mm512_mask_add_epi8(lo.raw, mask_lo, lo.raw, sixteen);
      hi.raw = _mm512_mask_add_epi8(hi.raw, mask_hi, hi.raw, sixteen);
    }
#else
    V8U lo01, hi01;
    Q5FifthBits(qh(0), qh(1), lo01, hi01);
    lo = hn::Or(lo, lo01);
    hi = hn::Or(hi, hi01);
    static_assert(kBlocks == 2, "quads of blocks only on AVX-512 targets");
#endif
  }
  constexpr std::uint32_t kMask = kFive ? 0x1f : 0x0f;
  hn::Vec<DBlocks<kBlocks>> lo_sum[R], hi_sum[R];
  for (std::int32_t r = 0; r < R; ++r) lo_sum[r] = hi_sum[r] = hn::Zero(df);
  FieldSteps<R>(lo, hi, kInPlace<kMask>, xp, 32 * kBlocks * g, 16 * kBlocks, lo_sum, hi_sum);
  const auto d = PerBlock<kBlocks>(block, kBytes, 0);
  hn::Vec<DBlocks<kBlocks>> offset;
  if constexpr (F == WeightFormat::kQ4_1 || F == WeightFormat::kQ5_1)
    offset = PerBlock<kBlocks>(block, kBytes, 2);
  else
    offset = hn::Mul(d, hn::Set(df, F == WeightFormat::kQ4_0 ? -8.0f : -16.0f));
  for (std::int32_t r = 0; r < R; ++r) {
    acc[r] = hn::MulAdd(d, hn::Add(lo_sum[r], hi_sum[r]), acc[r]);
    acc[r] = hn::MulAdd(offset, hn::LoadU(df, xsq[r] + 4 * kBlocks * g), acc[r]);
  }
}

// y[r][o + c] for R rows and C weight rows; each (row, weight row) sums in
// the same order whatever R and C are.
template <WeightFormat F, std::int32_t R, std::int32_t C>
HWY_INLINE void WideRows32(const QuantProductArgs& a, const float* xp_rows, const float* xsq_rows,
                           std::int32_t row, std::int32_t o) {
  const D8 df;
  const std::int64_t pairs = a.in / 64, row_bytes = 2 * pairs * BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * row_bytes;
  const float* xp[R];
  const float* xsq[R];
  for (std::int32_t r = 0; r < R; ++r) {
    xp[r] = xp_rows + std::size_t(row + r) * a.in;
    xsq[r] = xsq_rows + std::size_t(row + r) * (a.in / 8);
  }
  V8 acc[C][R];
  for (std::int32_t c = 0; c < C; ++c)
    for (std::int32_t r = 0; r < R; ++r) acc[c][r] = hn::Zero(df);
  const std::int64_t quads = Quads32(a.in);
#if PAGEDATTN_QUADS32
  {
    const D16 d16;
    V16 acc16[C][R];
    for (std::int32_t c = 0; c < C; ++c)
      for (std::int32_t r = 0; r < R; ++r) acc16[c][r] = hn::Zero(d16);
    for (std::int64_t q = 0; q < quads; ++q)
      for (std::int32_t c = 0; c < C; ++c) {
        const std::uint8_t* quad = w + c * row_bytes + 4 * q * BlockTraits<F>::kBytes;
        PrefetchPast(quad, 4 * BlockTraits<F>::kBytes);
        WideBlocks32<F, R, 4>(quad, xp, xsq, std::size_t(q), acc16[c]);
      }
    for (std::int32_t c = 0; c < C; ++c)  // the quads' halves, then the pair
      for (std::int32_t r = 0; r < R; ++r)
        acc[c][r] = hn::Add(hn::LowerHalf(df, acc16[c][r]), hn::UpperHalf(df, acc16[c][r]));
  }
#endif
  for (std::int64_t p = 2 * quads; p < pairs; ++p)
    for (std::int32_t c = 0; c < C; ++c) {
      const std::uint8_t* pair = w + c * row_bytes + 2 * p * BlockTraits<F>::kBytes;
      PrefetchPast(pair, 2 * BlockTraits<F>::kBytes);
      WideBlocks32<F, R, 2>(pair, xp, xsq, std::size_t(p), acc[c]);
    }
  for (std::int32_t c = 0; c < C; ++c) {
    float sums[R];
    for (std::int32_t r = 0; r < R; ++r) sums[r] = hn::GetLane(hn::SumOfLanes(df, acc[c][r]));
    StoreSums<R>(a, row, o + c, sums);
  }
}

template <WeightFormat F>
void WideRange32(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  const auto prepare = [&](const float* x, float* xp, float* xsq) { PermuteX32(x, a.in, xp, xsq); };
  const auto columns = [&](const QuantProductArgs& g, const float* xp, const float* xsq) {
    std::int32_t o = out_begin;
    for (; o + 2 <= out_end; o += 2)  // pairs of weight rows: more chains for fewer x rows
      InPlaceRowTiles::VisitAll(0, g.rows, [&](auto rows, std::int32_t row) {
        if constexpr (rows() == kRowTile) {
          WideRows32<F, kRowTile, 1>(g, xp, xsq, row, o);
          WideRows32<F, kRowTile, 1>(g, xp, xsq, row, o + 1);
        } else {
          WideRows32<F, rows(), 2>(g, xp, xsq, row, o);
        }
      });
    for (; o < out_end; ++o)
      InPlaceRowTiles::VisitAll(0, g.rows, [&](auto rows, std::int32_t row) {
        WideRows32<F, rows(), 1>(g, xp, xsq, row, o);
      });
  };
  ForRowGroups(a, std::size_t(a.in / 8), prepare, columns);
}

// ------------------------------ int8 activations (opt-in, QuantProductArgs::int8_x)
//
// x rounded to int8 per 32 values (scale dx); the quants multiply it on
// integer dot products: vpmaddubsw (u8 quant x s8 x into i16 pairs, which
// cannot saturate: at most 2 * 63 * 127) and vpmaddwd (into i32 sums of 4),
// exact. Per sub-block the i32 sums are converted and scaled by
// d * sc * dx. Raw AVX2 intrinsics: Highway 1.0 has no u8 x s8 dot product.
using D8I = hn::RebindToSigned<D8>;
using V8I = hn::Vec<D8I>;

// sum over the 4 bytes of each lane of quant (u8) * x (s8).
HWY_INLINE V8I DotBytes(V8U quants, const std::int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = _mm256_maddubs_epi16(quants.raw, xv);
  return V8I{_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))};
}

// As DotBytes with the quants less 32 (Q6_K): sum (q - 32) * x.
HWY_INLINE V8I DotBytesLess32(V8U quants, const std::int8_t* x) {
  const __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x));
  const __m256i pairs = _mm256_sub_epi16(_mm256_maddubs_epi16(quants.raw, xv),
                                         _mm256_maddubs_epi16(_mm256_set1_epi8(32), xv));
  return V8I{_mm256_madd_epi16(pairs, _mm256_set1_epi16(1))};
}

// Row data of the int8 kernels: x8 [in], dx [in / 32], sums of x [in / 32].
struct Int8Rows {
  const std::int8_t* x8;
  const float* dx;
  const float* xsums;
  std::size_t stride;  // bytes from one row's x8 to the next
};

template <WeightFormat F, std::int32_t R>
HWY_INLINE void Int8RowsK45(const QuantProductArgs& a, const Int8Rows& rows, std::int32_t row,
                            std::int32_t o) {
  const D8 df;
  const D8U du;
  const hn::Rebind<std::uint8_t, D8> d8;
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const std::int8_t* x8[R];
  const float* dx[R];
  const float* xs[R];
  V8 acc_lo[R], acc_hi[R], macc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x8[r] = rows.x8 + std::size_t(row + r) * rows.stride;
    dx[r] = rows.dx + std::size_t(row + r) * (a.in / 32);
    xs[r] = rows.xsums + std::size_t(row + r) * (a.in / 32);
    acc_lo[r] = acc_hi[r] = macc[r] = hn::Zero(df);
  }
  const auto nibbles = hn::Set(du, 0x0f0f0f0fu);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    alignas(8) std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    const auto scales = ScaledIntegers(df, sc, HalfAt(block));
    const auto mins = ScaledIntegers(df, m, HalfAt(block + 2));
    // d * sc[j] * dx of sub-block j, per row, broadcast from memory.
    alignas(32) float scale[R][8];
    for (std::int32_t r = 0; r < R; ++r) {
      macc[r] = hn::MulAdd(mins, hn::LoadU(df, xs[r] + b * 8), macc[r]);
      hn::Store(hn::Mul(scales, hn::LoadU(df, dx[r] + b * 8)), df, scale[r]);
    }
    asm volatile("" : : "r"(scale) : "memory");
    const std::size_t base = std::size_t(b) * kQuantKBlock;
    for (std::size_t i = 0; i < 4; ++i) {
      const auto v = Load32(block + BlockTraits<F>::kQuants + 32 * i);
      auto lo = hn::And(v, nibbles), hi = hn::And(hn::ShiftRight<4>(v), nibbles);
      if constexpr (F == WeightFormat::kQ5_K) {
        const auto qh =
            hn::ShiftRightSame(Load32(block + BlockTraits<F>::kHighBits), static_cast<int>(2 * i));
        const auto bit4 = hn::Set(du, 0x10101010u);
        lo = hn::Or(lo, hn::And(hn::ShiftLeft<4>(qh), bit4));
        hi = hn::Or(hi, hn::And(hn::ShiftLeft<3>(qh), bit4));
      }
      for (std::int32_t r = 0; r < R; ++r) {
        const std::int8_t* x = x8[r] + base + 64 * i;
        acc_lo[r] =
            hn::MulAdd(hn::ConvertTo(df, DotBytes(lo, x)), hn::Set(df, scale[r][2 * i]), acc_lo[r]);
        acc_hi[r] = hn::MulAdd(hn::ConvertTo(df, DotBytes(hi, x + 32)),
                               hn::Set(df, scale[r][2 * i + 1]), acc_hi[r]);
      }
    }
  }
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r)
    sums[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc_lo[r], acc_hi[r]))) -
              hn::GetLane(hn::SumOfLanes(df, macc[r]));
  StoreSums<R>(a, row, o, sums);
}

template <std::int32_t R>
HWY_INLINE void Int8RowsQ6K(const QuantProductArgs& a, const Int8Rows& rows, std::int32_t row,
                            std::int32_t o) {
  const D8 df;
  const D8U du;
  const hn::Rebind<std::int8_t, D8> d8;
  alignas(32) static constexpr std::int32_t kLanes[4][8] = {{0, 0, 0, 0, 1, 1, 1, 1},
                                                            {2, 2, 2, 2, 3, 3, 3, 3},
                                                            {4, 4, 4, 4, 5, 5, 5, 5},
                                                            {6, 6, 6, 6, 7, 7, 7, 7}};
  const std::int64_t blocks = a.in / kQuantKBlock;
  constexpr std::int64_t kBytes = BlockTraits<WeightFormat::kQ6_K>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const std::int8_t* x8[R];
  const float* dx[R];
  V8 acc_a[R], acc_b[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x8[r] = rows.x8 + std::size_t(row + r) * rows.stride;
    dx[r] = rows.dx + std::size_t(row + r) * (a.in / 32);
    acc_a[r] = acc_b[r] = hn::Zero(df);
  }
  const auto nibbles = hn::Set(du, 0x0f0f0f0fu), bits45 = hn::Set(du, 0x30303030u);
  for (std::int64_t b = 0; b < blocks; ++b) {
    const std::uint8_t* block = w + b * kBytes;
    PrefetchPast(block, kBytes);
    const auto d = hn::Set(df, HalfAt(block + BlockTraits<WeightFormat::kQ6_K>::kScale));
    const auto* sc =
        reinterpret_cast<const std::int8_t*>(block + BlockTraits<WeightFormat::kQ6_K>::kScales);
    const std::size_t base = std::size_t(b) * kQuantKBlock;
    for (std::size_t h = 0; h < 2; ++h) {
      const auto dsc =
          hn::Mul(hn::ConvertTo(df, hn::PromoteTo(D8I(), hn::LoadU(d8, sc + 8 * h))), d);
      const auto qh = Load32(block + BlockTraits<WeightFormat::kQ6_K>::kHighBits + 32 * h);
      for (int p = 0; p < 2; ++p) {
        const auto ql = Load32(block + 64 * h + 32 * p);
        const auto high_a = p == 0 ? hn::ShiftLeft<4>(qh) : hn::ShiftLeft<2>(qh);
        const auto high_b = p == 0 ? qh : hn::ShiftRight<2>(qh);
        const auto qa = hn::Or(hn::And(ql, nibbles), hn::And(high_a, bits45));
        const auto qb = hn::Or(hn::And(hn::ShiftRight<4>(ql), nibbles), hn::And(high_b, bits45));
        const auto lanes_a = hn::TableLookupLanes(dsc, hn::SetTableIndices(df, kLanes[p]));
        const auto lanes_b = hn::TableLookupLanes(dsc, hn::SetTableIndices(df, kLanes[p + 2]));
        const std::size_t at = base + 128 * h + 32 * p;  // group g = p; g = p + 2 at + 64
        for (std::int32_t r = 0; r < R; ++r) {
          const auto scale_a = hn::Mul(lanes_a, hn::Set(df, dx[r][at / 32]));
          const auto scale_b = hn::Mul(lanes_b, hn::Set(df, dx[r][at / 32 + 2]));
          acc_a[r] =
              hn::MulAdd(hn::ConvertTo(df, DotBytesLess32(qa, x8[r] + at)), scale_a, acc_a[r]);
          acc_b[r] =
              hn::MulAdd(hn::ConvertTo(df, DotBytesLess32(qb, x8[r] + at + 64)), scale_b, acc_b[r]);
        }
      }
    }
  }
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r)
    sums[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc_a[r], acc_b[r])));
  StoreSums<R>(a, row, o, sums);
}

template <WeightFormat F>
void Int8RangeK(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  thread_local std::vector<float> scratch;
  const std::size_t sums = std::size_t(a.in / 32);
  const std::size_t per_row = std::size_t(a.in) / 4 + 2 * sums;  // in floats
  // Every row at once (at most kInt8DirectRows from linear()): the weights are read once.
  const std::int32_t group = std::max(a.rows, 1);
  if (scratch.size() < std::size_t(group) * per_row) scratch.resize(std::size_t(group) * per_row);
  for (std::int32_t first = 0; first < a.rows; first += group) {
    const std::int32_t count = std::min(group, a.rows - first);
    auto* x8 = reinterpret_cast<std::int8_t*>(scratch.data());
    float* dx = scratch.data() + std::size_t(count) * a.in / 4;
    float* xsums = dx + std::size_t(count) * sums;
    for (std::int32_t r = 0; r < count; ++r) {
      const float* x = a.x + std::size_t(first + r) * a.in;
      QuantizeQ8(x, a.in, x8 + std::size_t(r) * a.in, dx + std::size_t(r) * sums);
      if constexpr (F != WeightFormat::kQ6_K) SumsOf32(x, a.in, xsums + std::size_t(r) * sums);
    }
    const Int8Rows rows{x8, dx, xsums, std::size_t(a.in)};
    QuantProductArgs g = a;
    g.rows = count;
    g.y = a.y + std::size_t(first) * a.ldy;
    for (std::int32_t o = out_begin; o < out_end; ++o) {
      std::int32_t row = 0;
      if constexpr (F == WeightFormat::kQ6_K) {
        for (; row + kRowTile <= count; row += kRowTile) Int8RowsQ6K<kRowTile>(g, rows, row, o);
        for (; row < count; ++row) Int8RowsQ6K<1>(g, rows, row, o);
      } else {
        for (; row + kRowTile <= count; row += kRowTile) Int8RowsK45<F, kRowTile>(g, rows, row, o);
        for (; row < count; ++row) Int8RowsK45<F, 1>(g, rows, row, o);
      }
    }
  }
}

// The 32-weight formats on int8 x: a block's 32 quants as bytes in x's
// order (weight j < 16: low nibble of qs[j], j >= 16: high nibble of
// qs[j - 16]), times the block's 32 x8 on vpmaddubsw / vpmaddwd (exact i32
// sums of 4), converted, scaled by d * dx and added into one of two
// accumulators per row (even / odd blocks). Q8_0, Q4_0 (q - 8) and Q5_0
// (q - 16) are signed: |q| times x8 with q's sign (vpsignb), as llama.cpp;
// Q4_1 / Q5_1 multiply the unsigned q and add m * (the exact sum of x) per
// block in a scalar accumulator.

// Bit j of the 32 bits at p as 0xff (set) or 0 in byte j (llama.cpp's
// bytes_from_bits_32).
HWY_INLINE __m256i BytesFromBits32(const std::uint8_t* p) {
  std::uint32_t bits;
  std::memcpy(&bits, p, sizeof bits);
  const __m256i spread = _mm256_shuffle_epi8(
      _mm256_set1_epi32(static_cast<int>(bits)),
      _mm256_set_epi64x(0x0303030303030303, 0x0202020202020202, 0x0101010101010101, 0));
  const __m256i others = _mm256_or_si256(spread, _mm256_set1_epi64x(0x7fbfdfeff7fbfdfe));
  return _mm256_cmpeq_epi8(others, _mm256_set1_epi64x(-1));
}

// The 32 quants of a block as bytes, signed (q, q - 8, q - 16) for Q8_0 /
// Q4_0 / Q5_0 and unsigned (0..15, 0..31) for Q4_1 / Q5_1.
template <WeightFormat F>
HWY_INLINE __m256i BlockBytes(const std::uint8_t* block) {
  const std::uint8_t* q = block + BlockTraits<F>::kQuants;
  if constexpr (F == WeightFormat::kQ8_0) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q));
  } else {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(q));
    const __m256i nibbles =
        _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(packed, 4), packed), _mm256_set1_epi8(15));
    if constexpr (F == WeightFormat::kQ4_0) {
      return _mm256_sub_epi8(nibbles, _mm256_set1_epi8(8));
    } else if constexpr (F == WeightFormat::kQ4_1) {
      return nibbles;
    } else if constexpr (F == WeightFormat::kQ5_0) {  // fifth bit clear: q - 16 < 0
      const __m256i high = BytesFromBits32(block + BlockTraits<F>::kHighBits);
      return _mm256_or_si256(nibbles,
                             _mm256_andnot_si256(high, _mm256_set1_epi8(static_cast<char>(0xf0))));
    } else {  // Q5_1
      const __m256i high = BytesFromBits32(block + BlockTraits<F>::kHighBits);
      return _mm256_or_si256(nibbles, _mm256_and_si256(high, _mm256_set1_epi8(0x10)));
    }
  }
}

template <WeightFormat F>
inline constexpr bool kSignedBlock =
    F == WeightFormat::kQ8_0 || F == WeightFormat::kQ4_0 || F == WeightFormat::kQ5_0;

// Block b of a weight row into accumulator K of rows [0, R).
template <WeightFormat F, std::int32_t R, int K>
HWY_INLINE void Int8Block32(const std::uint8_t* block, std::int64_t b, const std::int8_t* const* x8,
                            const float* const* dx, const float* const* xs, V8 (*acc)[2],
                            float* macc) {
  const D8 df;
  const __m256i q = BlockBytes<F>(block);
  const __m256i u = kSignedBlock<F> ? _mm256_sign_epi8(q, q) : q;
  // d * dx per row (one rounding), broadcast from memory.
  const float d = HalfAt(block);
  alignas(32) float scale[R];
  for (std::int32_t r = 0; r < R; ++r) scale[r] = d * dx[r][b];
  asm volatile("" : : "r"(scale) : "memory");
  for (std::int32_t r = 0; r < R; ++r) {
    __m256i xv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x8[r] + b * kQuantBlock));
    if constexpr (kSignedBlock<F>) xv = _mm256_sign_epi8(xv, q);
    const V8I dot{_mm256_madd_epi16(_mm256_maddubs_epi16(u, xv), _mm256_set1_epi16(1))};
    acc[r][K] = hn::MulAdd(hn::ConvertTo(df, dot), hn::Set(df, scale[r]), acc[r][K]);
    if constexpr (!kSignedBlock<F>) macc[r] += HalfAt(block + 2) * xs[r][b];
  }
}

template <WeightFormat F, std::int32_t R>
HWY_INLINE void Int8Rows32(const QuantProductArgs& a, const Int8Rows& rows, std::int32_t row,
                           std::int32_t o) {
  const D8 df;
  const std::int64_t blocks = a.in / kQuantBlock;
  constexpr std::int64_t kBytes = BlockTraits<F>::kBytes;
  const auto* w = static_cast<const std::uint8_t*>(a.w) + o * blocks * kBytes;
  const std::int8_t* x8[R];
  const float* dx[R];
  const float* xs[R];
  V8 acc[R][2];
  float macc[R];
  for (std::int32_t r = 0; r < R; ++r) {
    x8[r] = rows.x8 + std::size_t(row + r) * rows.stride;
    dx[r] = rows.dx + std::size_t(row + r) * blocks;
    xs[r] = rows.xsums + std::size_t(row + r) * blocks;
    acc[r][0] = acc[r][1] = hn::Zero(df);
    macc[r] = 0.0f;
  }
  std::int64_t b = 0;
  for (; b + 2 <= blocks; b += 2) {
    PrefetchPast(w + b * kBytes, 2 * kBytes);
    Int8Block32<F, R, 0>(w + b * kBytes, b, x8, dx, xs, acc, macc);
    Int8Block32<F, R, 1>(w + (b + 1) * kBytes, b + 1, x8, dx, xs, acc, macc);
  }
  if (b < blocks) Int8Block32<F, R, 0>(w + b * kBytes, b, x8, dx, xs, acc, macc);
  float sums[R];
  for (std::int32_t r = 0; r < R; ++r)
    sums[r] = hn::GetLane(hn::SumOfLanes(df, hn::Add(acc[r][0], acc[r][1]))) + macc[r];
  StoreSums<R>(a, row, o, sums);
}

// Every row's x8 (and, for Q4_1 / Q5_1, sums of 32) once per call in
// per-thread scratch, then weight row by weight row, kRowTile rows at a
// time (the weight row stays in L1 for the whole batch).
template <WeightFormat F>
void Int8Range32(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  thread_local std::vector<float> scratch;
  const std::size_t sums = std::size_t(a.in / 32), rows = std::size_t(a.rows);
  const std::size_t per_row = std::size_t(a.in) / 4 + 2 * sums;  // in floats
  if (scratch.size() < rows * per_row) scratch.resize(rows * per_row);
  auto* x8 = reinterpret_cast<std::int8_t*>(scratch.data());
  float* dx = scratch.data() + rows * a.in / 4;
  float* xsums = dx + rows * sums;
  for (std::size_t r = 0; r < rows; ++r) {
    const float* x = a.x + r * a.in;
    QuantizeQ8(x, a.in, x8 + r * a.in, dx + r * sums);
    if constexpr (!kSignedBlock<F>) SumsOf32(x, a.in, xsums + r * sums);
  }
  const Int8Rows in_rows{x8, dx, xsums, std::size_t(a.in)};
  for (std::int32_t o = out_begin; o < out_end; ++o) {
    std::int32_t row = 0;
    for (; row + kRowTile <= a.rows; row += kRowTile) Int8Rows32<F, kRowTile>(a, in_rows, row, o);
    for (; row < a.rows; ++row) Int8Rows32<F, 1>(a, in_rows, row, o);
  }
}

#else
#define PAGEDATTN_WIDE_K 0
#endif  // HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX2

// The 32-weight formats: the int8 kernels where they exist and were asked
// for, else the f32 ones.
template <WeightFormat F>
void ProductRange32(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
#if PAGEDATTN_WIDE_K
  if (a.int8_x) return Int8Range32<F>(a, out_begin, out_end);
  if constexpr (F != WeightFormat::kQ8_0)
    if (a.in % 64 == 0) return WideRange32<F>(a, out_begin, out_end);
#endif
  ProductRange<F>(a, out_begin, out_end);
}

template <WeightFormat F>
void ProductRangeK(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
#if PAGEDATTN_WIDE_K
  if (a.int8_x)
    Int8RangeK<F>(a, out_begin, out_end);
  else
    WideRangeK<F>(a, out_begin, out_end);
#else
  if constexpr (F == WeightFormat::kQ6_K) {
    for (std::int32_t o = out_begin; o < out_end; ++o)
      InPlaceRowTiles::VisitAll(
          0, a.rows, [&](auto rows, std::int32_t row) { DotRowsQ6K<rows()>(a, row, o); });
  } else {
    thread_local std::vector<float> xsums;
    const std::size_t per_row = std::size_t(a.in / 32);
    if (xsums.size() < std::size_t(a.rows) * per_row) xsums.resize(std::size_t(a.rows) * per_row);
    for (std::int32_t r = 0; r < a.rows; ++r)
      SumsOf32(a.x + std::size_t(r) * a.in, a.in, xsums.data() + std::size_t(r) * per_row);
    for (std::int32_t o = out_begin; o < out_end; ++o)
      InPlaceRowTiles::VisitAll(0, a.rows, [&](auto rows, std::int32_t row) {
        DotRowsK45<F, rows()>(a, xsums.data(), row, o);
      });
  }
#endif
}

void QuantProduct(const QuantProductArgs& a, std::int32_t out_begin, std::int32_t out_end) {
  visit_weight_format(a.format, [&](auto format) {
    constexpr WeightFormat F = format();
    if constexpr (F == WeightFormat::kF32 || is_sixteen_bit(F))  // no int8 kernels: f32 x
      ProductRange<F>(a, out_begin, out_end);
    else if constexpr (weight_format_block(F) == kQuantKBlock)
      ProductRangeK<F>(a, out_begin, out_end);
    else
      ProductRange32<F>(a, out_begin, out_end);
  });
}

// Dequantisation, bit-equal to dequantize_row (src/model/gguf_types.cc):
// each block a unit at a time through UnitDecoder (weight_decode-inl.h).
template <WeightFormat F>
void DequantizeRange(const void* w, std::int32_t in, std::int32_t first_row, std::int32_t count,
                     float* dst) {
  using Decoder = UnitDecoder<F>;
  const DF df;
  const std::size_t n = hn::Lanes(df);
  constexpr std::int32_t kBlockWeights = weight_format_block(F);
  const std::int64_t blocks = std::int64_t{count} * (in / kBlockWeights);
  const auto* base = static_cast<const std::uint8_t*>(w) +
                     std::int64_t{first_row} * (in / kBlockWeights) * BlockTraits<F>::kBytes;
  for (std::int64_t b = 0; b < blocks; ++b, dst += kBlockWeights) {
    const Decoder decoder(base + b * BlockTraits<F>::kBytes);
    for (std::size_t u = 0; u < Decoder::kUnits; ++u) {
      hn::Vec<DF> v[ChunkSlots<Decoder::kUnitWeights>()];
      decoder.Decode(u, v);
      for (std::size_t c = 0; c < Decoder::kUnitWeights / n; ++c)
        hn::StoreU(v[c], df, dst + u * Decoder::kUnitWeights + c * n);
    }
  }
}

void DequantizeRows(const void* w, WeightFormat format, std::int32_t in, std::int32_t first_row,
                    std::int32_t count, float* dst) {
  visit_weight_format(format, [&](auto f) {
    if constexpr (f() != WeightFormat::kF32) DequantizeRange<f()>(w, in, first_row, count, dst);
  });
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {
HWY_EXPORT(QuantProduct);
HWY_EXPORT(DequantizeRows);
HWY_EXPORT(QuantizeQ8);

const char* weight_format_name(WeightFormat format) {
  switch (format) {
    case WeightFormat::kF32:
      return "f32";
    case WeightFormat::kQ8_0:
      return "q8_0";
    case WeightFormat::kQ4_0:
      return "q4_0";
    case WeightFormat::kQ4_1:
      return "q4_1";
    case WeightFormat::kQ4_K:
      return "q4_k";
    case WeightFormat::kQ5_K:
      return "q5_k";
    case WeightFormat::kQ6_K:
      return "q6_k";
    case WeightFormat::kQ5_0:
      return "q5_0";
    case WeightFormat::kQ5_1:
      return "q5_1";
    case WeightFormat::kF16:
      return "f16";
    case WeightFormat::kBF16:
      return "bf16";
  }
  return "?";
}

std::int64_t weight_block_bytes(WeightFormat format) {
  return visit_weight_format(format, [](auto f) -> std::int64_t {
    if constexpr (f() == WeightFormat::kF32) return 4;
    return BlockTraits<f()>::kBytes;
  });
}

std::int64_t weight_row_bytes(WeightFormat format, std::int64_t in) {
  if (format == WeightFormat::kF32) return in * 4;
  const std::int32_t block = weight_format_block(format);
  require(in % block == 0, "weight_row_bytes: a ", weight_format_name(format), " row of ", in,
          " weights is not a whole number of ", block, "-weight blocks");
  return in / block * weight_block_bytes(format);
}

void quantize_activations_q8(const float* x, std::int32_t in, std::int8_t* q, float* scales) {
  HWY_DYNAMIC_DISPATCH(QuantizeQ8)(x, in, q, scales);
}

void quant_product(const QuantProductArgs& args, std::int32_t out_begin, std::int32_t out_end) {
  HWY_DYNAMIC_DISPATCH(QuantProduct)(args, out_begin, out_end);
}

void dequantize_weight_rows(const void* w, WeightFormat format, std::int32_t in,
                            std::int32_t first_row, std::int32_t count, float* dst) {
  HWY_DYNAMIC_DISPATCH(DequantizeRows)(w, format, in, first_row, count, dst);
}

}  // namespace pagedattn::engine
#endif
