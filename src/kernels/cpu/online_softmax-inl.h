// The online-softmax update of up to 16 query rows of a scored block at once
// on AVX-512, per target (Highway -inl.h pattern, raw intrinsics): the rows'
// maxima and sums come out of one transpose-reduce tree each (ReduceN: 16,
// 8 or 4 rows), and m, l and the rescale factors are computed for all rows in
// one vector, where a row at a time would reduce each row on its own and
// call exp for its rescale factor.
#if defined(PAGEDATTN_KERNELS_CPU_ONLINE_SOFTMAX_INL_H_) == defined(HWY_TARGET_TOGGLE)
#ifdef PAGEDATTN_KERNELS_CPU_ONLINE_SOFTMAX_INL_H_
#undef PAGEDATTN_KERNELS_CPU_ONLINE_SOFTMAX_INL_H_
#else
#define PAGEDATTN_KERNELS_CPU_ONLINE_SOFTMAX_INL_H_
#endif

#include <hwy/highway.h>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "kernels/attention_traits.h"
#include "kernels/cpu/reduce16-inl.h"

HWY_BEFORE_NAMESPACE();
namespace pagedattn::kernels::HWY_NAMESPACE {

#if HWY_ARCH_X86 && HWY_TARGET <= HWY_AVX3
namespace softmax16 {

constexpr std::int32_t kKB = AttentionTraits::kKeyBlock;
static_assert(kKB == 32, "a row's scores are two vectors");
constexpr int kMaxRows = 16;  // rows per update: one lane each

constexpr float kLog2E = 1.44269504f;

// 2^t for the softmax weights, as 2^n x p(f), n the nearest integer and p a
// polynomial of 2^f on |f| <= 1/2: at degree 6 the Taylor polynomial
// (relative error below 2e-7), at degree 3 a minimax fit (7.5e-5: enough
// where the weights are rounded to bf16, 2^-9). t below -125 (nothing
// beside a row's weight of 1) and -inf give 0 from a masked scalef: a result
// below f32's normal range would cost a microcode assist (more than 100
// cycles) per instruction. NaN gives NaN (a score of +inf minus a maximum
// of +inf: the row comes out NaN, as the reference has it).
template <int kDegree = 6>
HWY_INLINE __m512 Exp2(__m512 t) {
  static_assert(kDegree == 3 || kDegree == 6, "the two accuracies the paths need");
  const __mmask16 normal = _mm512_cmp_ps_mask(t, _mm512_set1_ps(-125.0f), _CMP_NLT_UQ);
  const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  const __m512 f = _mm512_sub_ps(t, n);
  __m512 p;
  if constexpr (kDegree == 6) {
    p = _mm512_set1_ps(1.5403530e-4f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.3333558e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504109e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022651e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
  } else {
    p = _mm512_set1_ps(5.5171598e-2f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4261111e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9326100e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.9992806e-1f));
  }
  return _mm512_maskz_scalef_ps(normal, p, n);
}

// exp(x) = 2^(x log2 e) (Exp2).
template <int kDegree = 6>
HWY_INLINE __m512 Exp(__m512 x) {
  return Exp2<kDegree>(_mm512_mul_ps(x, _mm512_set1_ps(kLog2E)));
}

// Stores a row's 32 weights as f32 (what the PV loops read unless they take
// bf16 weights: see amx::StoreWeightsBf16). kFusedShift false: the weights'
// exponent is (x - shift) log2 e, exact where x is near the shift; the fused
// x log2 e - shift log2 e (one instruction fewer) rounds shift log2 e once
// per row and step, an error of up to |shift| 2^-24 between steps that only
// weights rounded to bf16 can ignore.
struct StoreWeightsF32 {
  static constexpr int kExpDegree = 6;
  static constexpr bool kFusedShift = false;
  HWY_INLINE void operator()(float* x, __m512 w0, __m512 w1) const {
    _mm512_store_ps(x, w0);
    _mm512_store_ps(x + 16, w1);
  }
};

// f32 weights that the path rounds to 8 significant bits or fewer next
// (bf16, or u8 against the row's largest): the degree-3 exp and the fused
// shift, whose errors that rounding hides.
struct StoreWeightsF32Rounded : StoreWeightsF32 {
  static constexpr int kExpDegree = 3;
  static constexpr bool kFusedShift = true;
};

// Online-softmax update of `rows` (1 to 16) rows over `blocks` blocks of
// masked scores (block b's rows of kKB at s + b * block_stride floats),
// their m, l and output rows (o, stride dv, v_dim dims): leaves each row's
// weights (x the block's v_scales[b][key] when v_scales is given) in s
// through `store` (f32 rows by default; its kExpDegree is the degree of the
// weights' exp, kFusedShift how its exponent is formed) and rescales the
// output rows whose maximum grew, once for all the blocks. A row with
// nothing visible yet keeps m = -inf, l = 0 and gets zero weights; a row
// with a NaN score gets l = NaN (its output and LSE come out NaN).
template <class Store = StoreWeightsF32>
HWY_INLINE void UpdateBlocks(float* s, std::size_t block_stride, int blocks, float* m, float* l,
                             float* o, std::size_t dv, std::size_t v_dim,
                             const float* const* v_scales, int rows, const Store& store = Store()) {
  const __m512 neg_inf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  const __m512 one = _mm512_set1_ps(1.0f);
  const __mmask16 live = rows >= kMaxRows ? __mmask16(0xFFFF) : __mmask16((1u << rows) - 1u);
  __m512 acc[kMaxRows];
  __mmask16 nan_rows = 0;
  for (int i = 0; i < kMaxRows; ++i) {
    acc[i] = neg_inf;
    if (i >= rows) continue;
    bool nan = false;
    for (int b = 0; b < blocks; ++b) {
      const float* x = s + std::size_t(b) * block_stride + i * kKB;
      const __m512 x0 = _mm512_load_ps(x), x1 = _mm512_load_ps(x + 16);
      acc[i] = _mm512_max_ps(acc[i], _mm512_max_ps(x0, x1));
      nan |= _mm512_cmp_ps_mask(x0, x1, _CMP_UNORD_Q) != 0;
    }
    nan_rows |= __mmask16(nan << i);
  }
  // Decode has few rows (the GQA group): a smaller tree, same sums.
  const auto reduce = [rows, &acc](auto op) {
    return rows <= 4 ? ReduceN<4>(acc, op) : rows <= 8 ? ReduceN<8>(acc, op) : ReduceN<16>(acc, op);
  };
  const auto max = [](__m512 x, __m512 y) { return _mm512_max_ps(x, y); };
  const AddLanes add;
  const __m512 m_old = _mm512_mask_loadu_ps(neg_inf, live, m);
  const __m512 m_new = _mm512_max_ps(m_old, reduce(max));
  const __mmask16 none = _mm512_cmp_ps_mask(m_new, neg_inf, _CMP_EQ_OQ);
  alignas(64) float shift[kMaxRows];  // m_new, 0 where nothing is visible: exp(-inf - 0) = 0
  const __m512 row_shift = _mm512_mask_blend_ps(none, m_new, _mm512_setzero_ps());
  _mm512_store_ps(
      shift, Store::kFusedShift ? _mm512_mul_ps(row_shift, _mm512_set1_ps(kLog2E)) : row_shift);
  for (int i = 0; i < kMaxRows; ++i) acc[i] = _mm512_setzero_ps();
  // Blocks outer: each block's V scales loaded once for its rows; without
  // scales, no multiply at all.
  const auto exp_pass = [&](auto scaled) {
    for (int b = 0; b < blocks; ++b) {
      __m512 vs0 = one, vs1 = one;
      if constexpr (decltype(scaled)::value) {
        vs0 = _mm512_loadu_ps(v_scales[b]);
        vs1 = _mm512_loadu_ps(v_scales[b] + 16);
      }
      for (int i = 0; i < kMaxRows; ++i) {
        if (i >= rows) continue;
        float* x = s + std::size_t(b) * block_stride + i * kKB;
        const __m512 shift_i = _mm512_set1_ps(shift[i]);
        auto weight = [&](const float* at) {
          if constexpr (Store::kFusedShift)
            return Exp2<Store::kExpDegree>(
                _mm512_fmsub_ps(_mm512_load_ps(at), _mm512_set1_ps(kLog2E), shift_i));
          else
            return Exp<Store::kExpDegree>(_mm512_sub_ps(_mm512_load_ps(at), shift_i));
        };
        const __m512 e0 = weight(x), e1 = weight(x + 16);
        acc[i] = _mm512_add_ps(acc[i], _mm512_add_ps(e0, e1));
        if constexpr (decltype(scaled)::value)
          store(x, _mm512_mul_ps(e0, vs0), _mm512_mul_ps(e1, vs1));
        else
          store(x, e0, e1);
      }
    }
  };
  if (v_scales != nullptr)
    exp_pass(std::true_type{});
  else
    exp_pass(std::false_type{});
  // exp(m_old - m_new): 0 after -inf, exactly 1 where the maximum stayed.
  const __m512 corr = _mm512_mask_blend_ps(none, Exp(_mm512_sub_ps(m_old, m_new)), one);
  const __m512 l_new = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(live, l), corr, reduce(add));
  _mm512_mask_storeu_ps(
      l, live,
      _mm512_mask_blend_ps(nan_rows, l_new,
                           _mm512_set1_ps(std::numeric_limits<float>::quiet_NaN())));
  _mm512_mask_storeu_ps(m, live, m_new);
  alignas(64) float factor[kMaxRows];
  _mm512_store_ps(factor, corr);
  for (std::uint32_t grew = _mm512_mask_cmp_ps_mask(live, corr, one, _CMP_NEQ_UQ); grew != 0;
       grew &= grew - 1) {
    const int i = __builtin_ctz(grew);
    float* y = o + std::size_t(i) * dv;
    const __m512 c = _mm512_set1_ps(factor[i]);
    for (std::size_t d = 0; d < v_dim; d += 16)
      _mm512_store_ps(y + d, _mm512_mul_ps(_mm512_load_ps(y + d), c));
  }
}

// The update over one block (s rows of kKB), weights x v_scale[key] when given.
template <class Store = StoreWeightsF32>
HWY_INLINE void Update(float* s, float* m, float* l, float* o, std::size_t dv, std::size_t v_dim,
                       const float* v_scale, int rows) {
  UpdateBlocks(s, 0, 1, m, l, o, dv, v_dim, v_scale ? &v_scale : nullptr, rows, Store());
}

}  // namespace softmax16
#endif

}  // namespace pagedattn::kernels::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#endif  // PAGEDATTN_KERNELS_CPU_ONLINE_SOFTMAX_INL_H_
