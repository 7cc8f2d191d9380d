// The sampler's row passes with Highway; softmax_weights takes
// hwy/contrib/math's exponential in double.
#include "engine/sampler_kernels.h"

#include <algorithm>
#include <cmath>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "engine/sampler_kernels.cc"
#include <hwy/foreach_target.h>  // IWYU pragma: keep
#include <hwy/highway.h>

// Per target, after highway.h (its own block: clang-format sorts within one).
#include <hwy/contrib/math/math-inl.h>

HWY_BEFORE_NAMESPACE();
namespace pagedattn::engine::HWY_NAMESPACE {
namespace hn = hwy::HWY_NAMESPACE;
using DD = hn::ScalableTag<double>;
using VD = hn::Vec<DD>;
using DF = hn::ScalableTag<float>;
using VF = hn::Vec<DF>;

// Below this exponent exp() is 0 in double (subnormals end near -745); -inf
// (a masked token) and overflowing quotients are clamped first.
constexpr double kLowest = -746.0;

HWY_INLINE VD Weight(DD d, VD logit, VD max, VD inverse_t, VD min_p) {
  const VD arg = hn::Mul(hn::Sub(logit, max), inverse_t);
  const VD w = hn::Exp(d, hn::Max(arg, hn::Set(d, kLowest)));
  return hn::IfThenZeroElse(hn::Or(hn::Lt(w, min_p), hn::Le(arg, hn::Set(d, kLowest))), w);
}

double SoftmaxWeights(const double* logits, std::size_t n, double max, double temperature,
                      double min_p, double* weights) {
  const DD d;
  const std::size_t lanes = hn::Lanes(d);
  const VD vmax = hn::Set(d, max), inverse_t = hn::Set(d, 1.0 / temperature);
  const VD vmin_p = hn::Set(d, min_p);
  VD sum = hn::Zero(d);
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const VD w = Weight(d, hn::LoadU(d, logits + i), vmax, inverse_t, vmin_p);
    hn::StoreU(w, d, weights + i);
    sum = hn::Add(sum, w);
  }
  double total = hn::GetLane(hn::SumOfLanes(d, sum));
  if (i < n) {  // the tail through a padded copy (Highway 1.0 has no partial loads)
    HWY_ALIGN double x[hn::MaxLanes(d)], w[hn::MaxLanes(d)];
    for (std::size_t j = 0; j < lanes; ++j) x[j] = i + j < n ? logits[i + j] : -HUGE_VAL;
    hn::Store(Weight(d, hn::Load(d, x), vmax, inverse_t, vmin_p), d, w);
    for (std::size_t j = 0; i + j < n; ++j) total += weights[i + j] = w[j];
  }
  return total;
}

void DistanceBins(const double* logits, std::size_t n, double max, double inverse_t, int per_unit,
                  int rest, std::int32_t* bins) {
  const DD d;
  const hn::Rebind<std::int32_t, DD> di;
  const std::size_t lanes = hn::Lanes(d);
  const VD scale = hn::Set(d, inverse_t * per_unit), vmax = hn::Set(d, max);
  const VD limit = hn::Set(d, double(rest));
  const auto bins_of = [&](VD logit) {  // NaN-free: -inf gives +inf, capped at rest
    return hn::DemoteTo(di, hn::Floor(hn::Min(hn::Mul(hn::Sub(vmax, logit), scale), limit)));
  };
  std::size_t i = 0;
  for (; i + lanes <= n; i += lanes) hn::StoreU(bins_of(hn::LoadU(d, logits + i)), di, bins + i);
  for (; i < n; ++i)
    bins[i] = static_cast<std::int32_t>(
        std::floor(std::min((max - logits[i]) * inverse_t * per_unit, double(rest))));
}

// The first index of the largest of x[0, n) (the lowest index on ties) and
// whether every value passes `usable`; no index is sought where one fails.
template <class D, class Usable>
RowMax FirstMax(D d, const hn::TFromD<D>* x, std::size_t n, const Usable& usable) {
  const std::size_t lanes = hn::Lanes(d);
  // The tail as a padded copy that repeats the first value (Highway 1.0 has
  // no partial loads): it changes neither the maximum nor the check.
  HWY_ALIGN hn::TFromD<D> tail[hn::MaxLanes(d)];
  const std::size_t whole = n / lanes * lanes;
  for (std::size_t j = 0; j < lanes; ++j) tail[j] = whole + j < n ? x[whole + j] : x[0];
  const auto at = [&](std::size_t i) {
    return i < whole ? hn::LoadU(d, x + i) : hn::Load(d, tail);
  };
  auto max = hn::Set(d, x[0]);
  auto ok = usable(max);
  for (std::size_t i = 0; i < n; i += lanes) {
    const auto v = at(i);
    max = hn::Max(max, v);
    ok = hn::And(ok, usable(v));
  }
  RowMax m;
  m.finite = hn::AllTrue(d, ok);
  if (!m.finite) return m;  // the token means nothing then
  const auto best = hn::Set(d, hn::GetLane(hn::MaxOfLanes(d, max)));
  for (std::size_t i = 0; i < n; i += lanes) {
    const intptr_t first = hn::FindFirstTrue(d, hn::Eq(at(i), best));
    if (first >= 0) {
      m.token = static_cast<std::int32_t>(i + std::size_t(first));
      break;
    }
  }
  return m;
}

RowMax RowMaxOf(const float* x, std::size_t n) {
  return FirstMax(DF(), x, n, [](VF v) { return hn::IsFinite(v); });
}

std::int32_t FirstMaxOf(const double* x, std::size_t n) {
  return FirstMax(DD(), x, n, [](VD v) { return hn::Not(hn::IsNaN(v)); }).token;
}

}  // namespace pagedattn::engine::HWY_NAMESPACE
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace pagedattn::engine {

HWY_EXPORT(SoftmaxWeights);
HWY_EXPORT(RowMaxOf);
HWY_EXPORT(FirstMaxOf);
HWY_EXPORT(DistanceBins);

void distance_bins(std::span<const double> logits, double max, double inverse_t, int per_unit,
                   int rest, std::int32_t* bins) {
  HWY_DYNAMIC_DISPATCH(DistanceBins)
  (logits.data(), logits.size(), max, inverse_t, per_unit, rest, bins);
}

RowMax row_max(std::span<const float> logits) {
  return HWY_DYNAMIC_DISPATCH(RowMaxOf)(logits.data(), logits.size());
}

std::int32_t first_max(std::span<const double> row) {
  return HWY_DYNAMIC_DISPATCH(FirstMaxOf)(row.data(), row.size());
}

double softmax_weights(std::span<const double> logits, double max, double temperature, double min_p,
                       double* weights) {
  return HWY_DYNAMIC_DISPATCH(SoftmaxWeights)(logits.data(), logits.size(), max, temperature, min_p,
                                              weights);
}

}  // namespace pagedattn::engine
#endif  // HWY_ONCE
