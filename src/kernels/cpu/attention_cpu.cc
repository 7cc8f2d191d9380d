// The optimised CPU attention kernel: Highway SIMD with dynamic dispatch once
// per call, OpenMP threads over the planner's work items.
//
// Per work item (one sequence, one KV head, a tile of query tokens with all
// the query heads of the group as rows, a key range): keys are processed in
// blocks of kKeyBlock. Each block's K and V rows are dequantised once into
// f32 scratch and shared by every row, so each K/V byte is read once per
// group. Scores use an online softmax; the state is (m, l, o) per row and is
// finalised to (o / l, m + log l), the form merge_into combines.
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
#include <hwy/highway.h>
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

// --- dequantising row loads -------------------------------------------------------
// dst[0, n) = src[0, n) * scale; n is a multiple of 8 (head dims are).

template <DType kT>
HWY_INLINE void LoadRow(const void* src, float scale, float* HWY_RESTRICT dst, std::int32_t n) {
  const DF df;
  const std::int32_t lanes = static_cast<std::int32_t>(hn::Lanes(df));
  const auto vscale = hn::Set(df, scale);
  std::int32_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::VFromD<DF> v;
    if constexpr (kT == DType::kF32) {
      v = hn::LoadU(df, static_cast<const float*>(src) + i);
    } else if constexpr (kT == DType::kF16) {
      const hn::Rebind<hwy::float16_t, DF> dh;
      v = hn::PromoteTo(df, hn::LoadU(dh, static_cast<const hwy::float16_t*>(src) + i));
    } else if constexpr (kT == DType::kBF16) {
      const hn::Rebind<hwy::bfloat16_t, DF> db;
      v = hn::PromoteTo(df, hn::LoadU(db, static_cast<const hwy::bfloat16_t*>(src) + i));
    } else if constexpr (kT == DType::kINT8) {
      const hn::Rebind<std::int8_t, DF> d8;
      const hn::Rebind<std::int32_t, DF> d32;
      v = hn::ConvertTo(df, hn::PromoteTo(d32, hn::LoadU(d8, static_cast<const std::int8_t*>(src) + i)));
    } else {
      // fp8 -> f16 bit pattern: e5m2 is the top byte of an f16; e4m3 shifted
      // into f16's fields is its value times 2^-8 (normal and subnormal alike).
      const hn::Rebind<std::uint8_t, DF> d8;
      const hn::Rebind<std::uint16_t, DF> d16;
      const hn::Rebind<hwy::float16_t, DF> dh;
      const auto b = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const std::uint8_t*>(src) + i));
      hn::VFromD<decltype(d16)> h;
      if constexpr (kT == DType::kFP8E5M2) {
        h = hn::ShiftLeft<8>(b);
      } else {
        h = hn::Or(hn::ShiftLeft<7>(hn::And(b, hn::Set(d16, 0x7f))),
                   hn::ShiftLeft<8>(hn::And(b, hn::Set(d16, 0x80))));
      }
      v = hn::PromoteTo(df, hn::BitCast(dh, h));
      if constexpr (kT == DType::kFP8E4M3) {  // undo 2^-8; S.1111.111 is NaN
        const hn::Rebind<std::uint32_t, DF> du32;
        const auto low7 = hn::And(hn::PromoteTo(du32, b), hn::Set(du32, 0x7f));
        const auto is_nan = hn::RebindMask(df, hn::Eq(low7, hn::Set(du32, 0x7f)));
        v = hn::IfThenElse(is_nan, hn::Set(df, std::numeric_limits<float>::quiet_NaN()),
                           hn::Mul(v, hn::Set(df, 256.0f)));
      }
    }
    hn::StoreU(hn::Mul(v, vscale), df, dst + i);
  }
  for (; i < n; ++i) dst[i] = load_as_float(src, kT, static_cast<std::size_t>(i)) * scale;
}

// --- QK: four dot products at once -------------------------------------------------

// Returns {dot(q, k0), dot(q, k1), dot(q, k2), dot(q, k3)} over `n` (padded) floats.
HWY_INLINE void Dot4(const float* HWY_RESTRICT q, const float* HWY_RESTRICT k, std::size_t k_stride,
                     std::int32_t n, float* HWY_RESTRICT out) {
  const DF df;
  const std::int32_t lanes = static_cast<std::int32_t>(hn::Lanes(df));
  auto a0 = hn::Zero(df), a1 = hn::Zero(df), a2 = hn::Zero(df), a3 = hn::Zero(df);
  for (std::int32_t i = 0; i < n; i += lanes) {
    const auto qv = hn::Load(df, q + i);
    a0 = hn::MulAdd(qv, hn::Load(df, k + i), a0);
    a1 = hn::MulAdd(qv, hn::Load(df, k + k_stride + i), a1);
    a2 = hn::MulAdd(qv, hn::Load(df, k + 2 * k_stride + i), a2);
    a3 = hn::MulAdd(qv, hn::Load(df, k + 3 * k_stride + i), a3);
  }
  out[0] = hn::GetLane(hn::SumOfLanes(df, a0));
  out[1] = hn::GetLane(hn::SumOfLanes(df, a1));
  out[2] = hn::GetLane(hn::SumOfLanes(df, a2));
  out[3] = hn::GetLane(hn::SumOfLanes(df, a3));
}

// --- one work item -------------------------------------------------------------------

struct Item {
  const AttentionParams* p;
  const AttentionWorkItem* w;
  const KernelContext* ctx;
  std::byte* scratch;
  std::byte* partials;
};

struct Rows {
  float* q;
  float* o;
  float* m;
  float* l;
  float* s;
  float* k;
  float* v;
};

Rows ScratchRows(const Item& it) {
  const ScratchLayout lay = it.ctx->layout;
  auto at = [&](std::size_t off) { return reinterpret_cast<float*>(it.scratch + off); };
  return {at(lay.q), at(lay.o), at(lay.m), at(lay.l), at(lay.s), at(lay.k), at(lay.v)};
}

// Loads the item's query rows (scaled) and resets the softmax state.
void InitRows(const Item& it, const Rows& r, std::int32_t num_rows) {
  const AttentionParams& p = *it.p;
  const KernelContext& c = *it.ctx;
  const std::int32_t first_token = p.table.qo_indptr[it.w->batch] + it.w->q_begin;
  for (std::int32_t row = 0; row < num_rows; ++row) {
    const std::int64_t token = first_token + row / c.group;
    const std::int64_t head = std::int64_t{it.w->kv_head} * c.group + row % c.group;
    const std::int64_t off = token * p.q.token_stride + head * p.q.head_stride;
    float* q = r.q + std::size_t(row) * c.dq;
    for (std::int32_t d = 0; d < c.head_dim; ++d)
      q[d] = load_as_float(p.q.data, p.q.dtype, static_cast<std::size_t>(off + d)) * c.scale;
    std::memset(q + c.head_dim, 0, sizeof(float) * std::size_t(c.dq - c.head_dim));
    std::memset(r.o + std::size_t(row) * c.dv, 0, sizeof(float) * std::size_t(c.dv));
    r.m[row] = kNegInf;
    r.l[row] = 0.0f;
  }
}

// Dequantises keys/values [j0, j0 + nb) into the scratch rows (zero past nb).
template <DType kT>
void LoadBlock(const Item& it, const Rows& r, std::int32_t j0, std::int32_t nb) {
  const AttentionParams& p = *it.p;
  const PagedKVStorage& kv = p.kv;
  const KernelContext& c = *it.ctx;
  const std::int32_t b = it.w->batch, h = it.w->kv_head;
  const auto elem = static_cast<std::int64_t>(dtype_size(kT));
  const auto* kbase = static_cast<const std::byte*>(kv.k_data);
  const auto* vbase = static_cast<const std::byte*>(kv.v_data);
  for (std::int32_t jj = 0; jj < nb; ++jj) {
    const std::int32_t page = p.table.page_of_key(b, j0 + jj);
    const std::int32_t slot = p.table.offset_of_key(b, j0 + jj);
    LoadRow<kT>(kbase + kv.k_offset(page, h, slot) * elem, kv.k_dequant(page, h, slot),
                r.k + std::size_t(jj) * c.dq, c.head_dim);
    LoadRow<kT>(vbase + kv.v_offset(page, h, slot) * elem, kv.v_dequant(page, h, slot),
                r.v + std::size_t(jj) * c.dv, c.v_head_dim);
  }
  for (std::int32_t jj = nb; jj < AttentionTraits::kKeyBlock; ++jj) {
    std::memset(r.k + std::size_t(jj) * c.dq, 0, sizeof(float) * std::size_t(c.dq));
    std::memset(r.v + std::size_t(jj) * c.dv, 0, sizeof(float) * std::size_t(c.dv));
  }
}

// Scores one row against the block: scale (in q), softcap, ALiBi, mask.
void ScoreRow(const Item& it, const Rows& r, std::int32_t row, std::int32_t j0, std::int32_t nb,
              std::int64_t q_pos, std::int32_t head) {
  const KernelContext& c = *it.ctx;
  const AttentionOptions& opt = it.p->options;
  float* s = r.s + std::size_t(row) * AttentionTraits::kKeyBlock;
  const float* q = r.q + std::size_t(row) * c.dq;
  for (std::int32_t jj = 0; jj < AttentionTraits::kKeyBlock; jj += 4)
    Dot4(q, r.k + std::size_t(jj) * c.dq, std::size_t(c.dq), c.dq, s + jj);
  const float slope = opt.alibi_slopes ? opt.alibi_slopes[head] : 0.0f;
  for (std::int32_t jj = 0; jj < AttentionTraits::kKeyBlock; ++jj) {
    const std::int64_t j = j0 + jj;
    const bool visible = jj < nb && (!opt.causal || j <= q_pos) &&
                         (opt.window_left < 0 || j >= q_pos - opt.window_left);
    float x = s[jj];
    if (opt.softcap > 0.0f) x = opt.softcap * std::tanh(x / opt.softcap);
    x += slope * static_cast<float>(j - q_pos);
    s[jj] = visible ? x : kNegInf;
  }
}

// Online-softmax update of one row with its block scores; leaves weights in s.
void SoftmaxRow(const Rows& r, std::int32_t row, std::int32_t dv) {
  const DF df;
  const std::int32_t lanes = static_cast<std::int32_t>(hn::Lanes(df));
  float* s = r.s + std::size_t(row) * AttentionTraits::kKeyBlock;
  auto vmax = hn::Set(df, kNegInf);
  for (std::int32_t i = 0; i < AttentionTraits::kKeyBlock; i += lanes)
    vmax = hn::Max(vmax, hn::LoadU(df, s + i));
  const float block_max = hn::GetLane(hn::MaxOfLanes(df, vmax));
  const float m_old = r.m[row];
  const float m_new = block_max > m_old ? block_max : m_old;
  if (m_new == kNegInf) {  // nothing visible yet: all weights 0
    for (std::int32_t i = 0; i < AttentionTraits::kKeyBlock; ++i) s[i] = 0.0f;
    return;
  }
  const auto vm = hn::Set(df, m_new);
  auto vsum = hn::Zero(df);
  for (std::int32_t i = 0; i < AttentionTraits::kKeyBlock; i += lanes) {
    const auto e = hn::Exp(df, hn::Sub(hn::LoadU(df, s + i), vm));
    vsum = hn::Add(vsum, e);
    hn::StoreU(e, df, s + i);
  }
  const float corr = m_old == kNegInf ? 0.0f : std::exp(m_old - m_new);
  r.l[row] = r.l[row] * corr + hn::GetLane(hn::SumOfLanes(df, vsum));
  r.m[row] = m_new;
  if (corr != 1.0f) {
    float* o = r.o + std::size_t(row) * dv;
    const auto vc = hn::Set(df, corr);
    for (std::int32_t d = 0; d < dv; d += lanes) hn::Store(hn::Mul(hn::Load(df, o + d), vc), df, o + d);
  }
}

// o[row] += sum_j w[row][j] * v[j].
void AccumulateRow(const Rows& r, std::int32_t row, std::int32_t nb, std::int32_t dv) {
  const DF df;
  const std::int32_t lanes = static_cast<std::int32_t>(hn::Lanes(df));
  const float* w = r.s + std::size_t(row) * AttentionTraits::kKeyBlock;
  float* o = r.o + std::size_t(row) * dv;
  for (std::int32_t d = 0; d < dv; d += lanes) {
    auto acc = hn::Load(df, o + d);
    for (std::int32_t jj = 0; jj < nb; ++jj)
      acc = hn::MulAdd(hn::Set(df, w[jj]), hn::Load(df, r.v + std::size_t(jj) * dv + d), acc);
    hn::Store(acc, df, o + d);
  }
}

// Turns the row states into (o / l, lse) and writes them to the partial slot
// or, through the sink, to the output.
void FinishRows(const Item& it, const Rows& r, std::int32_t num_rows) {
  const AttentionParams& p = *it.p;
  const KernelContext& c = *it.ctx;
  const AttentionWorkItem& w = *it.w;
  for (std::int32_t row = 0; row < num_rows; ++row) {
    float* o = r.o + std::size_t(row) * c.dv;
    const float l = r.l[row];
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    for (std::int32_t d = 0; d < c.dv; ++d) o[d] *= inv;
    float lse = l > 0.0f ? r.m[row] + std::log(l) : kNegInf;
    if (w.partial >= 0) {
      std::byte* slot = it.partials + std::size_t(w.partial) * c.partial_slot_bytes;
      std::memcpy(slot + std::size_t(row) * c.dv * sizeof(float), o, std::size_t(c.dv) * sizeof(float));
      reinterpret_cast<float*>(slot + c.partial_lse_offset)[row] = lse;
      continue;
    }
    const std::int64_t token = p.table.qo_indptr[w.batch] + w.q_begin + row / c.group;
    const std::int64_t head = std::int64_t{w.kv_head} * c.group + row % c.group;
    write_output_row(p, token, head, o, lse);
  }
}

template <DType kT>
void ProcessItem(const Item& it) {
  const KernelContext& c = *it.ctx;
  const AttentionWorkItem& w = *it.w;
  const AttentionParams& p = *it.p;
  const Rows r = ScratchRows(it);
  const std::int32_t num_rows = (w.q_end - w.q_begin) * c.group;
  InitRows(it, r, num_rows);
  const std::int64_t first_pos = std::int64_t{p.table.kv_lens[w.batch]} - p.table.q_len(w.batch) + w.q_begin;
  for (std::int32_t j0 = w.kv_begin; j0 < w.kv_end; j0 += AttentionTraits::kKeyBlock) {
    const std::int32_t nb = std::min(AttentionTraits::kKeyBlock, w.kv_end - j0);
    LoadBlock<kT>(it, r, j0, nb);
    for (std::int32_t row = 0; row < num_rows; ++row) {
      ScoreRow(it, r, row, j0, nb, first_pos + row / c.group, w.kv_head * c.group + row % c.group);
      SoftmaxRow(r, row, c.dv);
      AccumulateRow(r, row, nb, c.dv);
    }
  }
  FinishRows(it, r, num_rows);
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

void RunAttention(const AttentionParams& p, const AttentionPlan& plan, std::byte* workspace) {
  const KernelContext ctx = make_kernel_context(p, plan);
  std::byte* partials = workspace + plan.scratch_bytes_per_thread * std::size_t(plan.num_threads);
#pragma omp parallel num_threads(plan.num_threads)
  {
    // If OpenMP gives fewer threads than planned, each takes several lists.
    const int team = omp_get_num_threads();
    const int me = omp_get_thread_num();
    std::byte* scratch = workspace + plan.scratch_bytes_per_thread * std::size_t(me);
    for (int list = me; list < plan.num_threads; list += team)
      for (std::int32_t i = plan.thread_items[list]; i < plan.thread_items[list + 1]; ++i)
        ProcessItemAnyType({&p, &plan.items[i], &ctx, scratch, partials});
#pragma omp barrier
#pragma omp for schedule(static)
    for (std::size_t m = 0; m < plan.merges.size(); ++m)
      merge_partials(p, ctx, plan.merges[m], partials);
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
