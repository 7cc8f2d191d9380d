// The online-softmax state of one attention row, as (o, lse): o is the
// normalised output over the keys seen, lse = log(sum exp(logit)) over them
// (-inf when none). Split-KV partials and cascade levels are all merged
// through merge_into, so there is one definition of merging.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>

namespace pagedattn::kernels {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Merges state b into state a: a := a (+) b. A null o_b is a zero vector
// (a learned attention sink: it adds to the denominator only).
inline void merge_into(float* o_a, float& lse_a, const float* o_b, float lse_b, std::int32_t dim) {
  if (lse_b == kNegInf) return;
  if (lse_a == kNegInf) {
    for (std::int32_t d = 0; d < dim; ++d) o_a[d] = o_b ? o_b[d] : 0.0f;
    lse_a = lse_b;
    return;
  }
  const float m = lse_a > lse_b ? lse_a : lse_b;
  const float w_a = std::exp(lse_a - m), w_b = std::exp(lse_b - m);
  const float inv = 1.0f / (w_a + w_b);
  for (std::int32_t d = 0; d < dim; ++d)
    o_a[d] = (o_a[d] * w_a + (o_b ? o_b[d] * w_b : 0.0f)) * inv;
  lse_a = m + std::log(w_a + w_b);
}

}  // namespace pagedattn::kernels
