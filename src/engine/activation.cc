// gated_activation with Highway (dispatched once per call, at the top): the
// exponential and tanh of hwy/contrib/math, within a few ulp of std::exp
// and std::tanh, instead of a scalar libm call per element.
#include "engine/activation.h"

#include <algorithm>
#include <cstddef>

#include "core/row_parallel.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/activation.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h (its own block: clang-format sorts within one).
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// SiLU: g / (1 + e^-g). e^-g is capped at e^88 (finite): the quotient is
// then -0 or a denormal, as the exact value rounds to, where the uncapped
// exponential would leave its valid range. A NaN gate stays NaN through g.
HWY_INLINE VF Silu(DF d, VF g) {
  const VF e = hn::Exp(d, hn::Min(hn::Neg(g), hn::Set(d, 88.0f)));
  return hn::Div(g, hn::Add(hn::Set(d, 1.0f), e));
}

// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
HWY_INLINE VF GeluTanh(DF d, VF x) {
  const VF x3 = hn::Mul(hn::Mul(x, x), x);
  const VF inner =
      hn::Mul(hn::Set(d, 0.7978845608028654f), hn::MulAdd(hn::Set(d, 0.044715f), x3, x));
  const VF t = hn::Tanh(d, inner);
  return hn::Mul(hn::Mul(hn::Set(d, 0.5f), x), hn::Add(hn::Set(d, 1.0f), t));
}

template <bool kGelu>
void GatedRow(const float* HWY_RESTRICT gate, const float* HWY_RESTRICT up, std::int32_t width,
              float* HWY_RESTRICT out) {
  const DF d;
  const std::size_t n = hn::Lanes(d), w = std::size_t(width);
  std::size_t i = 0;
  auto one = [&](VF g, VF u) { return hn::Mul(kGelu ? GeluTanh(d, g) : Silu(d, g), u); };
  for (; i + n <= w; i += n)
    hn::StoreU(one(hn::LoadU(d, gate + i), hn::LoadU(d, up + i)), d, out + i);
  if (i == w) return;
  // The tail through zero-padded copies (Highway 1.0 has no partial loads).
  HWY_ALIGN float g[hn::MaxLanes(d)] = {}, u[hn::MaxLanes(d)] = {}, o[hn::MaxLanes(d)];
  std::copy(gate + i, gate + w, g);
  std::copy(up + i, up + w, u);
  hn::Store(one(hn::Load(d, g), hn::Load(d, u)), d, o);
  std::copy(o, o + (w - i), out + i);
}

void GatedActivation(const float* gate_up, std::int32_t rows, std::int32_t width, bool gelu,
                     float* act) {
  const std::int64_t elements = std::int64_t{rows} * width;
#pragma omp parallel for schedule(static) if (elements >= core::kRowParallelElements)
  for (std::int32_t r = 0; r < rows; ++r) {
    const float* gate = gate_up + std::size_t(r) * 2 * std::size_t(width);
    float* out = act + std::size_t(r) * std::size_t(width);
    if (gelu)
      GatedRow<true>(gate, gate + width, width, out);
    else
      GatedRow<false>(gate, gate + width, width, out);
  }
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {

HWY_EXPORT(GatedActivation);

void gated_activation(const float* gate_up, std::int32_t rows, std::int32_t width,
                      MlpActivation activation, float* act) {
  HWY_DYNAMIC_DISPATCH(GatedActivation)
  (gate_up, rows, width, activation == MlpActivation::kGeluTanh, act);
}

}  // namespace pagedattn::engine
#endif  // HWY_ONCE
