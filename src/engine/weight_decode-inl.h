// Decoders of the quantised and 16-bit weight formats (quant_kernels.h)
// into f32 vectors of at most 16 lanes, per target (Highway -inl.h
// pattern): shared by the in-place kernels and dequantize_weight_rows
// (quant_kernels.cc) and by dot_tiles' few-row tiles (dot_tiles.cc), which
// decode in registers and must give exactly the weights that
// dequantize_weight_rows stores.
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "engine/quant_kernels.h"
#include "kernels/cpu/prefetch.h"
#include "pagedattn/dtype.h"

#if defined(PAGEDATTN_ENGINE_WEIGHT_DECODE_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_ENGINE_WEIGHT_DECODE_INL_H_
#undef PAGEDATTN_ENGINE_WEIGHT_DECODE_INL_H_
#else
#define PAGEDATTN_ENGINE_WEIGHT_DECODE_INL_H_
#endif

#include <hwy/cache_control.h>
#include <hwy/highway.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 16 lanes: a block's 16 nibble bytes then fill one vector or more.
using DF = hn::CappedTag<float, 16>;

HWY_INLINE float HalfAt(const std::uint8_t* p) {
  std::uint16_t bits;
  std::memcpy(&bits, p, sizeof bits);
  return f16_bits_to_float(bits);
}

// Lanes [c * N, c * N + N) of a block, as f32 weights.
template <WeightFormat F>
HWY_INLINE hn::Vec<DF> DecodeChunk(const std::uint8_t* block, std::size_t c) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const std::size_t n = hn::Lanes(df), first = c * n;
  if constexpr (F == WeightFormat::kF32) {
    return hn::LoadU(df, reinterpret_cast<const float*>(block) + first);
  } else if constexpr (F == WeightFormat::kF16 || F == WeightFormat::kBF16) {
    using T = std::conditional_t<F == WeightFormat::kF16, hwy::float16_t, hwy::bfloat16_t>;
    const hn::Rebind<T, DF> d16;
    return hn::PromoteTo(df, hn::LoadU(d16, reinterpret_cast<const T*>(block) + first));
  }
  const std::uint8_t* q = block + BlockTraits<F>::kQuants;
  const auto d = hn::Set(df, HalfAt(block));
  if constexpr (F == WeightFormat::kQ8_0) {
    const hn::Rebind<std::int8_t, DF> d8;
    const auto v =
        hn::PromoteTo(di, hn::LoadU(d8, reinterpret_cast<const std::int8_t*>(q) + first));
    return hn::Mul(hn::ConvertTo(df, v), d);
  } else {
    const hn::Rebind<std::uint8_t, DF> d8;
    const bool high = first >= 16;
    auto v = hn::PromoteTo(di, hn::LoadU(d8, q + (high ? first - 16 : first)));
    v = high ? hn::ShiftRight<4>(v) : hn::And(v, hn::Set(di, 0x0f));
    if constexpr (F == WeightFormat::kQ5_0 || F == WeightFormat::kQ5_1) {
      // Bit j of qh is the fifth bit of weight j: lane i's is bit first + i,
      // taken as a mask (a mask register on AVX-512).
      std::uint32_t qh;
      std::memcpy(&qh, block + BlockTraits<F>::kHighBits, sizeof qh);
      const std::uint64_t lane_bits = qh >> first;
      std::uint8_t mask_bytes[sizeof lane_bits];
      std::memcpy(mask_bytes, &lane_bits, sizeof lane_bits);
      v = hn::Or(v, hn::IfThenElseZero(hn::LoadMaskBits(di, mask_bytes), hn::Set(di, 16)));
    }
    if constexpr (F == WeightFormat::kQ4_0) {
      return hn::Mul(hn::ConvertTo(df, hn::Sub(v, hn::Set(di, 8))), d);
    } else if constexpr (F == WeightFormat::kQ5_0) {
      return hn::Mul(hn::ConvertTo(df, hn::Sub(v, hn::Set(di, 16))), d);
    } else {  // Q4_1, Q5_1
      return hn::MulAdd(hn::ConvertTo(df, v), d, hn::Set(df, HalfAt(block + 2)));
    }
  }
}

// How far ahead of the block being read every kernel prefetches its weights:
// short rows (SmolLM2's are 396-1,260 bytes) read a few side by side, one
// tile after another, are not a pattern the hardware prefetchers run far
// enough ahead of (docs/benchmarks.md, "Weight prefetch").
constexpr std::int64_t kPrefetchBytes = 8192;

// Where PrefetchPast brings the lines. Into L1 each prefetch holds one of
// L1's few miss buffers until its line arrives from DRAM: the kernels that
// do little arithmetic per byte (Q8_0, f32 and 16-bit rows in place,
// dot_tiles' register tiles) then wait on the buffers, and ask for L2
// instead; the kernels that decode
// 4-6 bit quants measured slower with L2 and keep L1 (docs/benchmarks.md,
// "Weight prefetch").
enum class PrefetchLevel { kL1, kL2 };

// The lines kPrefetchBytes past the `bytes` of a weight block being read.
template <PrefetchLevel kLevel = PrefetchLevel::kL1>
HWY_INLINE void PrefetchPast(const std::uint8_t* block, std::int64_t bytes) {
  constexpr auto kLine = static_cast<std::int64_t>(kernels::kLineBytes);
  for (std::int64_t i = 0; i < bytes; i += kLine) {
    if constexpr (kLevel == PrefetchLevel::kL2)
      kernels::PrefetchToL2(block + kPrefetchBytes + i);
    else
      hwy::Prefetch(block + kPrefetchBytes + i);
  }
}

// Quants of Q4_K / Q5_K sub-blocks 2i (lo) and 2i + 1 (hi), weights
// [c * N, c * N + N) of each, as exact f32 integers (0..15 / 0..31).
template <WeightFormat F>
HWY_INLINE void DecodeKPair(const std::uint8_t* block, std::size_t i, std::size_t c,
                            hn::Vec<DF>& lo, hn::Vec<DF>& hi) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  const std::size_t n = hn::Lanes(df);
  const std::uint8_t* q = block + BlockTraits<F>::kQuants + 32 * i + c * n;
  const auto v = hn::PromoteTo(di, hn::LoadU(d8, q));
  auto low = hn::And(v, hn::Set(di, 0x0f));
  auto high = hn::ShiftRight<4>(v);
  if constexpr (F == WeightFormat::kQ5_K) {
    // Bit j of qh[l] is bit 4 of weight l of sub-block j.
    const auto h = hn::ShiftRightSame(
        hn::PromoteTo(di, hn::LoadU(d8, block + BlockTraits<F>::kHighBits + c * n)),
        static_cast<int>(2 * i));
    const auto bit4 = hn::Set(di, 0x10);
    low = hn::Or(low, hn::And(hn::ShiftLeft<4>(h), bit4));
    high = hn::Or(high, hn::And(hn::ShiftLeft<3>(h), bit4));
  }
  lo = hn::ConvertTo(df, low);
  hi = hn::ConvertTo(df, high);
}

// Q6_K: weight 128 h + 32 g + l (h < 2, g < 4, l < 32) is nibble g / 2 of
// ql[64 h + 32 (g % 2) + l] with bits 2g, 2g + 1 of qh[32 h + l] above it,
// minus 32. Group P (0, 1) decodes g = P (a, low nibbles) and g = P + 2 (b,
// high nibbles) for l in [l0, l0 + N), as exact f32 integers (-32..31).
template <int P>
HWY_INLINE void DecodeQ6(const std::uint8_t* block, std::size_t h, std::size_t l0, hn::Vec<DF>& a,
                         hn::Vec<DF>& b) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const hn::Rebind<std::uint8_t, DF> d8;
  const auto ql = hn::PromoteTo(di, hn::LoadU(d8, block + 64 * h + 32 * P + l0));
  const auto qh = hn::PromoteTo(
      di, hn::LoadU(d8, block + BlockTraits<WeightFormat::kQ6_K>::kHighBits + 32 * h + l0));
  const auto bits45 = hn::Set(di, 0x30), offset = hn::Set(di, 32);
  const auto high_a = P == 0 ? hn::ShiftLeft<4>(qh) : hn::ShiftLeft<2>(qh);
  const auto high_b = P == 0 ? qh : hn::ShiftRight<2>(qh);
  a = hn::ConvertTo(
      df, hn::Sub(hn::Or(hn::And(ql, hn::Set(di, 0x0f)), hn::And(high_a, bits45)), offset));
  b = hn::ConvertTo(df, hn::Sub(hn::Or(hn::ShiftRight<4>(ql), hn::And(high_b, bits45)), offset));
}

// Vectors a unit of kWeights weights takes (vectors of Lanes(DF()) floats;
// scalable targets may have fewer lanes than MaxLanes).
template <std::size_t kWeights>
constexpr std::size_t ChunkSlots() {
  return HWY_HAVE_SCALABLE ? kWeights : kWeights / hn::MaxLanes(DF());
}

// A block's weights as f32 vectors in input order, kUnitWeights at a time:
// Decode(u, w) writes weights [u kUnitWeights, (u + 1) kUnitWeights) of the
// block to w[0 .. kUnitWeights / Lanes). dequantize_weight_rows stores
// exactly these vectors, and dot_tiles' few-row tiles multiply them from
// registers, so both see the same weights bit for bit. The 32-weight
// formats (and f32 / F16 / BF16 rows in blocks of 32): the unit is the block.
template <WeightFormat F>
struct BlockDecoder {
  static constexpr std::size_t kUnits = 1, kUnitWeights = kQuantBlock;
  const std::uint8_t* block;
  HWY_INLINE explicit BlockDecoder(const std::uint8_t* b) : block(b) {}
  HWY_INLINE void Decode(std::size_t, hn::Vec<DF>* w) const {
    const std::size_t n = hn::Lanes(DF());
    for (std::size_t c = 0; c < kUnitWeights / n; ++c) w[c] = DecodeChunk<F>(block, c);
  }
};

// d * q[j] for the lanes of df from the 8-bit integers at q (the K-quants'
// scales and mins), as d * float(q[j]) rounds.
template <class D, typename T>
HWY_INLINE hn::Vec<D> ScaledIntegers(D df, const T* q, float d) {
  const hn::Rebind<T, D> dq;
  const hn::RebindToSigned<D> di;
  return hn::Mul(hn::ConvertTo(df, hn::PromoteTo(di, hn::LoadU(dq, q))), hn::Set(df, d));
}

// out[j] = d * q[j] for j < kCount, in vectors of at most kCount lanes.
template <std::size_t kCount, typename T>
HWY_INLINE void ScaleAll(float d, const T* q, float* out) {
  const hn::CappedTag<float, kCount> df;
  for (std::size_t j = 0; j < kCount; j += hn::Lanes(df))
    hn::StoreU(ScaledIntegers(df, q + j, d), df, out + j);
}

// Q4_K / Q5_K: unit i is sub-blocks 2i and 2i + 1, w = d sc q - dmin m.
// The scale d * sc and the offset dmin * m are exact in f32, so is the
// product of the scale and a quant (at most 11 + 6 + 5 or 11 + 7 + 5
// significant bits), and only the subtraction of the offset rounds: the
// weights are bit-equal to dequantize_row (src/model/gguf_types.cc), and
// one fused multiply-subtract gives the same bits as a multiply and a
// subtraction.
template <WeightFormat F>
struct KDecoder {
  static constexpr std::size_t kUnits = 4, kUnitWeights = 64;
  const std::uint8_t* block;
  float scale[8], offset[8];
  HWY_INLINE explicit KDecoder(const std::uint8_t* b) : block(b) {
    alignas(8) std::uint8_t sc[8], m[8];
    unpack_k_scales(block + 4, sc, m);
    ScaleAll<8>(HalfAt(block), sc, scale);
    ScaleAll<8>(HalfAt(block + 2), m, offset);
  }
  HWY_INLINE void Decode(std::size_t i, hn::Vec<DF>* w) const {
    const DF df;
    const std::size_t n = hn::Lanes(df), chunks = 32 / n;
    const auto scale_lo = hn::Set(df, scale[2 * i]), scale_hi = hn::Set(df, scale[2 * i + 1]);
    const auto min_lo = hn::Set(df, offset[2 * i]), min_hi = hn::Set(df, offset[2 * i + 1]);
    for (std::size_t c = 0; c < chunks; ++c) {
      hn::Vec<DF> lo, hi;
      DecodeKPair<F>(block, i, c, lo, hi);
      w[c] = hn::MulSub(scale_lo, lo, min_lo);
      w[chunks + c] = hn::MulSub(scale_hi, hi, min_hi);
    }
  }
};

// Q6_K: unit h is half h (groups g = 0..3 of 32 weights), w = d sc (q - 32)
// with one int8 scale per 16 weights.
struct Q6Decoder {
  static constexpr std::size_t kUnits = 2, kUnitWeights = 128;
  const std::uint8_t* block;
  float scale[16];  // d * sc
  HWY_INLINE explicit Q6Decoder(const std::uint8_t* b) : block(b) {
    ScaleAll<16>(
        HalfAt(b + BlockTraits<WeightFormat::kQ6_K>::kScale),
        reinterpret_cast<const std::int8_t*>(b + BlockTraits<WeightFormat::kQ6_K>::kScales), scale);
  }
  HWY_INLINE void Decode(std::size_t h, hn::Vec<DF>* w) const {
    const DF df;
    const std::size_t n = hn::Lanes(df), chunks = 32 / n;
    for (std::size_t l = 0; l < 32; l += n) {
      const std::size_t k = 8 * h + l / 16, at = l / n;
      hn::Vec<DF> a, b;
      DecodeQ6<0>(block, h, l, a, b);
      w[at] = hn::Mul(hn::Set(df, scale[k]), a);
      w[2 * chunks + at] = hn::Mul(hn::Set(df, scale[k + 4]), b);
      DecodeQ6<1>(block, h, l, a, b);
      w[chunks + at] = hn::Mul(hn::Set(df, scale[k + 2]), a);
      w[3 * chunks + at] = hn::Mul(hn::Set(df, scale[k + 6]), b);
    }
  }
};

// The decoder of format F.
template <WeightFormat F>
using UnitDecoder =
    std::conditional_t<F == WeightFormat::kQ6_K, Q6Decoder,
                       std::conditional_t<F == WeightFormat::kQ4_K || F == WeightFormat::kQ5_K,
                                          KDecoder<F>, BlockDecoder<F>>>;

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_ENGINE_WEIGHT_DECODE_INL_H_ toggle
