// The optimised CPU attention kernel: Highway SIMD with dynamic dispatch once
// per call, OpenMP threads over the planner's work items.
//
// A work item is one sequence, one KV head, a tile of query tokens (rows =
// tokens x the group's query heads) and a key range. Keys go in blocks of
// kKeyBlock; each block's K/V rows are read straight from the pages and
// converted in registers (dequantisation scales are applied per key to the
// score and to the softmax weight, not per element), so each K/V byte is
// read once per group. When many rows share a block (prefill) the block is
// first converted to f32 scratch and the same loops run on that.
// Online softmax per row: (m, l, o), finalised to (o / l, m + log l), the
// form merge_into combines.
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "../attention_traits.h"
#include "../softmax_state.h"
#include "attention_cpu.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention_cpu.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/cache_control.h>
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;

// At most 8 f32 lanes: head dims are multiples of 8, so rows never have tails.
using DF = hn::CappedTag<float, 8>;
using VF = hn::Vec<DF>;
constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;

// --- element conversion -------------------------------------------------------------

// Lanes(DF) elements of a `kT` row starting at `i`, as f32 without any scale
// (fp8 e4m3 comes out as value x 2^-8: kFormatScale undoes it per key).
template <DType kT>
HWY_INLINE VF LoadConvert(const void* row, std::size_t i) {
  const DF df;
  if constexpr (kT == DType::kF32) {
    return hn::LoadU(df, static_cast<const float*>(row) + i);
  } else if constexpr (kT == DType::kF16) {
    const hn::Rebind<hwy::float16_t, DF> dh;
    return hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(row) + i));
  } else if constexpr (kT == DType::kBF16) {
    const hn::Rebind<hwy::bfloat16_t, DF> db;
    return hn::PromoteTo(df, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(row) + i));
  } else if constexpr (kT == DType::kINT8) {
    const hn::Rebind<std::int8_t, DF> d8;
    const hn::Rebind<std::int32_t, DF> d32;
    return hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, static_cast<const std::int8_t*>(row) + i)));
  } else {
    // fp8 -> f16 bits: e5m2 is the top byte of an f16; e4m3 moved into f16's
    // fields is its value x 2^-8 (subnormals included). e4m3 S.1111.111 is NaN.
    const hn::Rebind<std::uint8_t, DF> d8;
    const hn::Rebind<std::uint16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto b = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const std::uint8_t*>(row) + i));
    if constexpr (kT == DType::kFP8E5M2) {
      return hn::PromoteTo(df, hn::BitCast(dh, hn::ShiftLeft<8>(b)));
    } else {
      const auto low7 = hn::And(b, hn::Set(d16, 0x7f));
      const auto h = hn::Or(hn::ShiftLeft<7>(low7), hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 0x80))));
      const hn::Rebind<std::uint32_t, DF> du32;
      const auto is_nan =
          hn::RebindMask(df, hn::Eq(hn::PromoteTo(du32, low7), hn::Set(du32, 0x7f)));
      return hn::IfThenElse(is_nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()),
                            hn::PromoteTo(df, hn::BitCast(dh, h)));
    }
  }
}

template <DType kT>
constexpr float kFormatScale = kT == DType::kFP8E4M3 ? 256.0f : 1.0f;

// --- a block of keys ------------------------------------------------------------------

// Row pointers and per-key dequantisation scales of up to kKB keys; keys past
// `count` point at a zero row with scale 0, so loops always run kKB keys.
struct KeyBlock {
  const void* k[kKB];
  const void* v[kKB];
  float k_scale[kKB];
  float v_scale[kKB];
  std::int32_t first = 0;  // key index of entry 0
  std::int32_t count = 0;
};

struct Scratch {
  float* q;      // [rows][dq] queries x softmax scale
  float* o;      // [rows][dv] unnormalised outputs
  float* m;      // [rows]
  float* l;      // [rows]
  float* s;      // [rows][kKB] scores, then weights
  float* k;      // [kKB][dq] f32 copy of a block (prefill)
  float* v;      // [kKB][dv]
  const void* zero;  // a zero row (any dtype)
};

struct Item {
  const AttentionParams* p;
  const AttentionWorkItem* w;
  const KernelContext* c;
  Scratch sc;
  std::byte* partials;
};

template <DType kT>
void GatherBlock(const Item& it, std::int32_t j0, std::int32_t count, KeyBlock& kb) {
  const AttentionParams& p = *it.p;
  const PagedKVStorage& kv = p.kv;
  const std::int32_t b = it.w->batch, h = it.w->kv_head;
  const auto elem = static_cast<std::int64_t>(dtype_size(kT));
  const auto* kbase = static_cast<const std::byte*>(kv.k_data);
  const auto* vbase = static_cast<const std::byte*>(kv.v_data);
  kb.first = j0;
  kb.count = count;
  for (std::int32_t jj = 0; jj < count; ++jj) {
    const std::int32_t page = p.table.page_of_key(b, j0 + jj);
    const std::int32_t slot = p.table.offset_of_key(b, j0 + jj);
    kb.k[jj] = kbase + kv.k_offset(page, h, slot) * elem;
    kb.v[jj] = vbase + kv.v_offset(page, h, slot) * elem;
    kb.k_scale[jj] = kv.k_dequant(page, h, slot) * kFormatScale<kT>;
    kb.v_scale[jj] = kv.v_dequant(page, h, slot) * kFormatScale<kT>;
  }
  for (std::int32_t jj = count; jj < kKB; ++jj) {
    kb.k[jj] = kb.v[jj] = it.sc.zero;
    kb.k_scale[jj] = kb.v_scale[jj] = 0.0f;
  }
}

template <DType kT>
void PrefetchBlock(const Item& it, std::int32_t j0, std::int32_t count) {
  const AttentionParams& p = *it.p;
  const PagedKVStorage& kv = p.kv;
  const std::int32_t b = it.w->batch, h = it.w->kv_head;
  const auto elem = static_cast<std::int64_t>(dtype_size(kT));
  const std::int64_t k_bytes = kv.head_dim * elem, v_bytes = kv.v_head_dim * elem;
  for (std::int32_t jj = 0; jj < count; ++jj) {
    const std::int32_t page = p.table.page_of_key(b, j0 + jj);
    const std::int32_t slot = p.table.offset_of_key(b, j0 + jj);
    const auto* k = static_cast<const char*>(kv.k_data) + kv.k_offset(page, h, slot) * elem;
    const auto* v = static_cast<const char*>(kv.v_data) + kv.v_offset(page, h, slot) * elem;
    for (std::int64_t off = 0; off < k_bytes; off += 64) hwy::Prefetch(k + off);
    for (std::int64_t off = 0; off < v_bytes; off += 64) hwy::Prefetch(v + off);
  }
}

// Converts a gathered block to f32 scratch rows and repoints it there.
template <DType kT>
void ConvertBlock(const Item& it, KeyBlock& kb) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const KernelContext& c = *it.c;
  for (std::int32_t jj = 0; jj < kKB; ++jj) {
    float* kd = it.sc.k + std::size_t(jj) * c.dq;
    float* vd = it.sc.v + std::size_t(jj) * c.dv;
    for (std::size_t d = 0; d < std::size_t(c.head_dim); d += n) hn::Store(LoadConvert<kT>(kb.k[jj], d), df, kd + d);
    for (std::size_t d = 0; d < std::size_t(c.v_head_dim); d += n) hn::Store(LoadConvert<kT>(kb.v[jj], d), df, vd + d);
    kb.k[jj] = kd;
    kb.v[jj] = vd;
  }
}

// Inline RoPE: rotates the f32 key rows of the block at their positions.
void RotateKeys(const Item& it, const KeyBlock& kb) {
  const RopeConfig& rope = *it.p->options.key_rope;
  const KernelContext& c = *it.c;
  const std::int32_t r = rope.rotary_dim ? rope.rotary_dim : c.head_dim, half = r / 2;
  const bool neox = rope.style == RopeStyle::kNeox;
  for (std::int32_t jj = 0; jj < kb.count; ++jj) {
    float* k = it.sc.k + std::size_t(jj) * c.dq;
    const std::int64_t pos = kb.first + jj;
    for (std::int32_t i = 0; i < half; ++i) {
      float cs, sn;
      if (rope.cos_cache) {
        cs = rope.cos_cache[pos * half + i];
        sn = rope.sin_cache[pos * half + i];
      } else {
        const double angle = double(pos) * rope_inv_freq(rope, r, i);
        cs = static_cast<float>(std::cos(angle));
        sn = static_cast<float>(std::sin(angle));
      }
      float& a = k[neox ? i : 2 * i];
      float& b = k[neox ? i + half : 2 * i + 1];
      const float x = a, y = b;
      a = x * cs - y * sn;
      b = y * cs + x * sn;
    }
  }
}

// --- QK ---------------------------------------------------------------------------------

// Sums each of 8 vectors: out[i] = sum of lanes of a[i].
HWY_INLINE void Reduce8(const VF* a, float* HWY_RESTRICT out) {
#if HWY_TARGET == HWY_SCALAR
  for (int i = 0; i < 8; ++i) out[i] = hn::GetLane(a[i]);
#else
  const DF df;
  // Per 128-bit block: pairwise interleave-adds leave [s0 s1 s2 s3] partials.
  const hn::Repartition<std::uint64_t, DF> d64;
  HWY_ALIGN float tmp[2 * hn::MaxLanes(df)];
  for (int half = 0; half < 2; ++half) {
    const VF* x = a + 4 * half;
    const VF t01 = hn::Add(hn::InterleaveLower(df, x[0], x[1]), hn::InterleaveUpper(df, x[0], x[1]));
    const VF t23 = hn::Add(hn::InterleaveLower(df, x[2], x[3]), hn::InterleaveUpper(df, x[2], x[3]));
    const auto u01 = hn::BitCast(d64, t01), u23 = hn::BitCast(d64, t23);
    const VF s = hn::Add(hn::BitCast(df, hn::InterleaveLower(d64, u01, u23)),
                         hn::BitCast(df, hn::InterleaveUpper(d64, u01, u23)));
    hn::Store(s, df, tmp + half * hn::Lanes(df));
  }
  const std::size_t blocks = hn::Lanes(df) / 4;
  for (int half = 0; half < 2; ++half)
    for (int i = 0; i < 4; ++i) {
      float sum = 0.0f;
      for (std::size_t blk = 0; blk < blocks; ++blk) sum += tmp[half * hn::Lanes(df) + blk * 4 + i];
      out[4 * half + i] = sum;
    }
#endif
}

// Scores kRows rows x kKeys keys (kRows * kKeys == 8) starting at key jj.
template <DType kT, int kRows, int kKeys>
HWY_INLINE void ScoreTile(const Item& it, const KeyBlock& kb, std::int32_t row0, std::int32_t jj) {
  static_assert(kRows * kKeys == 8, "Reduce8 takes 8 accumulators");
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const KernelContext& c = *it.c;
  VF acc[8];
  for (auto& a : acc) a = hn::Zero(df);
  const float* q = it.sc.q + std::size_t(row0) * c.dq;
  for (std::size_t d = 0; d < std::size_t(c.head_dim); d += n) {
    VF k[kKeys];
    for (int e = 0; e < kKeys; ++e) k[e] = LoadConvert<kT>(kb.k[jj + e], d);
    for (int r = 0; r < kRows; ++r) {
      const VF qv = hn::Load(df, q + std::size_t(r) * c.dq + d);
      for (int e = 0; e < kKeys; ++e) acc[r * kKeys + e] = hn::MulAdd(qv, k[e], acc[r * kKeys + e]);
    }
  }
  float dots[8];
  Reduce8(acc, dots);
  for (int r = 0; r < kRows; ++r)
    for (int e = 0; e < kKeys; ++e)
      it.sc.s[std::size_t(row0 + r) * kKB + jj + e] = dots[r * kKeys + e] * kb.k_scale[jj + e];
}

template <DType kT>
void ScoreBlock(const Item& it, const KeyBlock& kb, std::int32_t rows) {
  std::int32_t r = 0;
  for (; r + 4 <= rows; r += 4)
    for (std::int32_t jj = 0; jj < kKB; jj += 2) ScoreTile<kT, 4, 2>(it, kb, r, jj);
  for (; r + 2 <= rows; r += 2)
    for (std::int32_t jj = 0; jj < kKB; jj += 4) ScoreTile<kT, 2, 4>(it, kb, r, jj);
  for (; r < rows; ++r)
    for (std::int32_t jj = 0; jj < kKB; jj += 8) ScoreTile<kT, 1, 8>(it, kb, r, jj);
}

// --- masks, softcap, ALiBi, online softmax -----------------------------------------------

// Applies softcap, ALiBi and visibility to one row's scores (vectorised over keys).
void TransformRow(const Item& it, const KeyBlock& kb, std::int32_t row, std::int64_t q_pos,
                  std::int32_t head) {
  const DF df;
  const hn::RebindToSigned<DF> di;
  const std::size_t n = hn::Lanes(df);
  const AttentionOptions& opt = it.p->options;
  float* s = it.sc.s + std::size_t(row) * kKB;
  // Visible keys of this row within the block: [lo, hi).
  std::int64_t hi = kb.first + kb.count;
  if (opt.causal) hi = std::min<std::int64_t>(hi, q_pos + 1);
  std::int64_t lo = kb.first;
  if (opt.window_left >= 0) lo = std::max<std::int64_t>(lo, q_pos - opt.window_left);
  // idx > lo - 1 and idx < hi, relative to the block (clamped to fit int32).
  const auto vlo = hn::Set(di, static_cast<std::int32_t>(std::clamp<std::int64_t>(lo - kb.first, 0, kKB) - 1));
  const auto vhi = hn::Set(di, static_cast<std::int32_t>(std::clamp<std::int64_t>(hi - kb.first, -1, kKB)));
  const float slope = opt.alibi_slopes ? opt.alibi_slopes[head] : 0.0f;
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) {
    VF x = hn::LoadU(df, s + i);
    if (opt.softcap > 0.0f) {
      const VF cap = hn::Set(df, opt.softcap);
      x = hn::Mul(cap, hn::Tanh(df, hn::Div(x, cap)));
    }
    const auto idx = hn::Iota(di, static_cast<std::int32_t>(i));
    if (opt.alibi_slopes) {
      const VF dist = hn::ConvertTo(df, hn::Add(idx, hn::Set(di, static_cast<std::int32_t>(kb.first - q_pos))));
      x = hn::MulAdd(hn::Set(df, slope), dist, x);
    }
    const auto visible = hn::RebindMask(df, hn::And(hn::Gt(idx, vlo), hn::Lt(idx, vhi)));
    hn::StoreU(hn::IfThenElse(visible, x, hn::Set(df, kNegInf)), df, s + i);
  }
}

// Online-softmax update of one row; leaves weight x value scale in s.
void SoftmaxRow(const Item& it, const KeyBlock& kb, std::int32_t row) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const KernelContext& c = *it.c;
  float* s = it.sc.s + std::size_t(row) * kKB;
  VF vmax = hn::Set(df, kNegInf);
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) vmax = hn::Max(vmax, hn::LoadU(df, s + i));
  const float m_old = it.sc.m[row];
  const float m_new = std::max(hn::GetLane(hn::MaxOfLanes(df, vmax)), m_old);
  if (m_new == kNegInf) {  // nothing visible yet
    std::fill_n(s, kKB, 0.0f);
    return;
  }
  const VF vm = hn::Set(df, m_new);
  VF vsum = hn::Zero(df);
  for (std::size_t i = 0; i < std::size_t(kKB); i += n) {
    const VF e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm));
    vsum = hn::Add(vsum, e);
    hn::StoreU(hn::Mul(e, hn::LoadU(df, kb.v_scale + i)), df, s + i);
  }
  const float corr = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
  it.sc.l[row] = it.sc.l[row] * corr + hn::GetLane(hn::SumOfLanes(df, vsum));
  it.sc.m[row] = m_new;
  if (corr != 1.0f) {
    float* o = it.sc.o + std::size_t(row) * c.dv;
    const VF vc = hn::Set(df, corr);
    for (std::size_t d = 0; d < std::size_t(c.v_head_dim); d += n) hn::Store(hn::Mul(hn::Load(df, o + d), vc), df, o + d);
  }
}

// --- PV -----------------------------------------------------------------------------------

// o[row0 .. row0 + kRows) += weights x V over the block.
template <DType kT, int kRows>
HWY_INLINE void AccumulateRows(const Item& it, const KeyBlock& kb, std::int32_t row0) {
  const DF df;
  const std::size_t n = hn::Lanes(df);
  const KernelContext& c = *it.c;
  const float* w = it.sc.s + std::size_t(row0) * kKB;
  float* o = it.sc.o + std::size_t(row0) * c.dv;
  const std::size_t dv = std::size_t(c.v_head_dim);
  std::size_t d = 0;
  for (; d + 2 * n <= dv; d += 2 * n) {  // kRows x 2 vectors of outputs in registers
    VF acc[2 * kRows];
    for (int r = 0; r < kRows; ++r) {
      acc[2 * r] = hn::Load(df, o + r * c.dv + d);
      acc[2 * r + 1] = hn::Load(df, o + r * c.dv + d + n);
    }
    for (std::int32_t jj = 0; jj < kb.count; ++jj) {
      const VF v0 = LoadConvert<kT>(kb.v[jj], d), v1 = LoadConvert<kT>(kb.v[jj], d + n);
      for (int r = 0; r < kRows; ++r) {
        const VF wv = hn::Set(df, w[r * kKB + jj]);
        acc[2 * r] = hn::MulAdd(wv, v0, acc[2 * r]);
        acc[2 * r + 1] = hn::MulAdd(wv, v1, acc[2 * r + 1]);
      }
    }
    for (int r = 0; r < kRows; ++r) {
      hn::Store(acc[2 * r], df, o + r * c.dv + d);
      hn::Store(acc[2 * r + 1], df, o + r * c.dv + d + n);
    }
  }
  for (; d < dv; d += n) {
    VF acc[kRows];
    for (int r = 0; r < kRows; ++r) acc[r] = hn::Load(df, o + r * c.dv + d);
    for (std::int32_t jj = 0; jj < kb.count; ++jj) {
      const VF v0 = LoadConvert<kT>(kb.v[jj], d);
      for (int r = 0; r < kRows; ++r) acc[r] = hn::MulAdd(hn::Set(df, w[r * kKB + jj]), v0, acc[r]);
    }
    for (int r = 0; r < kRows; ++r) hn::Store(acc[r], df, o + r * c.dv + d);
  }
}

template <DType kT>
void AccumulateBlock(const Item& it, const KeyBlock& kb, std::int32_t rows) {
  std::int32_t r = 0;
  for (; r + 4 <= rows; r += 4) AccumulateRows<kT, 4>(it, kb, r);
  for (; r < rows; ++r) AccumulateRows<kT, 1>(it, kb, r);
}

// --- one work item -------------------------------------------------------------------------

void InitRows(const Item& it, std::int32_t rows) {
  const AttentionParams& p = *it.p;
  const KernelContext& c = *it.c;
  const std::int64_t first_token = p.table.qo_indptr[it.w->batch] + it.w->q_begin;
  for (std::int32_t row = 0; row < rows; ++row) {
    const std::int64_t token = first_token + row / c.group;
    const std::int64_t head = std::int64_t{it.w->kv_head} * c.group + row % c.group;
    const std::int64_t off = token * p.q.token_stride + head * p.q.head_stride;
    float* q = it.sc.q + std::size_t(row) * c.dq;
    for (std::int32_t d = 0; d < c.head_dim; ++d)
      q[d] = load_as_float(p.q.data, p.q.dtype, static_cast<std::size_t>(off + d)) * c.scale;
    std::fill_n(it.sc.o + std::size_t(row) * c.dv, c.dv, 0.0f);
    it.sc.m[row] = kNegInf;
    it.sc.l[row] = 0.0f;
  }
}

// Finalises each row to (o / l, lse) and writes it to the partial slot or,
// through the sink, to the output.
void FinishRows(const Item& it, std::int32_t rows) {
  const KernelContext& c = *it.c;
  const AttentionWorkItem& w = *it.w;
  for (std::int32_t row = 0; row < rows; ++row) {
    float* o = it.sc.o + std::size_t(row) * c.dv;
    const float l = it.sc.l[row];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (std::int32_t d = 0; d < c.v_head_dim; ++d) o[d] *= inv;
    const float lse = l > 0.0f ? it.sc.m[row] + std::log(l) : kNegInf;
    if (w.partial >= 0) {
      std::byte* slot = it.partials + std::size_t(w.partial) * c.partial_slot_bytes;
      std::memcpy(slot + std::size_t(row) * c.dv * sizeof(float), o, std::size_t(c.dv) * sizeof(float));
      reinterpret_cast<float*>(slot + c.partial_lse_offset)[row] = lse;
      continue;
    }
    const std::int64_t token = it.p->table.qo_indptr[w.batch] + w.q_begin + row / c.group;
    write_output_row(*it.p, token, std::int64_t{w.kv_head} * c.group + row % c.group, o, lse);
  }
}

// Rows above which a block is converted to f32 once rather than per row group.
constexpr std::int32_t kConvertRows = 8;

template <DType kT>
void ProcessItem(const Item& it) {
  const KernelContext& c = *it.c;
  const AttentionWorkItem& w = *it.w;
  const PagedKVTable& t = it.p->table;
  const std::int32_t rows = (w.q_end - w.q_begin) * c.group;
  const std::int64_t first_pos = std::int64_t{t.kv_lens[w.batch]} - t.q_len(w.batch) + w.q_begin;
  InitRows(it, rows);
  const bool rotate_keys = it.p->options.key_rope != nullptr;
  KeyBlock kb;
  for (std::int32_t j0 = w.kv_begin; j0 < w.kv_end; j0 += kKB) {
    const std::int32_t count = std::min(kKB, w.kv_end - j0);
    const std::int32_t next = j0 + kKB;
    PrefetchBlock<kT>(it, next, std::clamp(w.kv_end - next, 0, kKB));
    GatherBlock<kT>(it, j0, count, kb);
    // f32 scratch when many rows share the block, or keys need rotating.
    const bool convert = (rows > kConvertRows && kT != DType::kF32) || rotate_keys;
    if (convert) {
      ConvertBlock<kT>(it, kb);
      if (rotate_keys) RotateKeys(it, kb);
      ScoreBlock<DType::kF32>(it, kb, rows);
    } else {
      ScoreBlock<kT>(it, kb, rows);
    }
    for (std::int32_t row = 0; row < rows; ++row) {
      TransformRow(it, kb, row, first_pos + row / c.group, w.kv_head * c.group + row % c.group);
      SoftmaxRow(it, kb, row);
    }
    if (convert)
      AccumulateBlock<DType::kF32>(it, kb, rows);
    else
      AccumulateBlock<kT>(it, kb, rows);
  }
  FinishRows(it, rows);
}

void ProcessItemAnyType(const Item& it) {
  switch (it.p->kv.dtype) {
    case DType::kF32: return ProcessItem<DType::kF32>(it);
    case DType::kF16: return ProcessItem<DType::kF16>(it);
    case DType::kBF16: return ProcessItem<DType::kBF16>(it);
    case DType::kFP8E4M3: return ProcessItem<DType::kFP8E4M3>(it);
    case DType::kFP8E5M2: return ProcessItem<DType::kFP8E5M2>(it);
    case DType::kINT8: return ProcessItem<DType::kINT8>(it);
  }
}

Scratch ThreadScratch(std::byte* base, const KernelContext& c) {
  const ScratchLayout& l = c.layout;
  auto at = [&](std::size_t off) { return reinterpret_cast<float*>(base + off); };
  return {at(l.q), at(l.o), at(l.m), at(l.l), at(l.s), at(l.k), at(l.v), base + l.zero};
}

void RunAttention(const AttentionParams& p, const AttentionPlan& plan, std::byte* workspace) {
  const KernelContext ctx = make_kernel_context(p, plan);
  std::byte* partials = workspace + plan.scratch_bytes_per_thread * std::size_t(plan.num_threads);
#pragma omp parallel num_threads(plan.num_threads)
  {
    // If OpenMP gives fewer threads than planned, each takes several lists.
    const int team = omp_get_num_threads();
    const int me = omp_get_thread_num();
    std::byte* base = workspace + plan.scratch_bytes_per_thread * std::size_t(me);
    std::memset(base + ctx.layout.zero, 0, ctx.layout.zero_bytes);
    const Scratch sc = ThreadScratch(base, ctx);
    for (int list = me; list < plan.num_threads; list += team)
      for (std::int32_t i = plan.thread_items[list]; i < plan.thread_items[list + 1]; ++i)
        ProcessItemAnyType({&p, &plan.items[std::size_t(i)], &ctx, sc, partials});
#pragma omp barrier
#pragma omp for schedule(static)
    for (std::size_t m = 0; m < plan.merges.size(); ++m) merge_partials(p, ctx, plan.merges[m], partials);
  }
}

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::kernels {
HWY_EXPORT(RunAttention);

void run_attention_cpu(const AttentionParams& params, const AttentionPlan& plan,
                       std::byte* workspace) {
  HWY_DYNAMIC_DISPATCH(RunAttention)(params, plan, workspace);
}
}  // namespace pagedattn::kernels
#endif
