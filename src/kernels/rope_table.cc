#include "kernels/rope_table.h"

#include <algorithm>

namespace pagedattn::kernels {

const RopeConfig& RopeTable::covering(const RopeConfig& base, std::int32_t head_dim,
                                      std::int32_t positions) {
  const std::int32_t r = base.rotary_dim == 0 ? head_dim : base.rotary_dim, half = r / 2;
  const std::int32_t have = cos_.empty() ? 0 : rope_.cache_max_position;
  if (positions <= have) return rope_;
  const std::int32_t target = std::max(positions, 2 * have);  // amortised growth
  rope_ = base;
  cos_.resize(std::size_t(target) * half);
  sin_.resize(std::size_t(target) * half);
  for (std::int32_t p = have; p < target; ++p)
    for (std::int32_t i = 0; i < half; ++i)  // base has no table: computed in double
      rope_cos_sin(base, r, p, i, cos_[std::size_t(p) * half + i], sin_[std::size_t(p) * half + i]);
  rope_.cos_cache = cos_.data();
  rope_.sin_cache = sin_.data();
  rope_.cache_max_position = target;
  return rope_;
}

}  // namespace pagedattn::kernels
