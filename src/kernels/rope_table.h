// A RoPE configuration with its cos/sin table attached, grown on demand, so
// a step rotates by table lookups instead of computing angles per token.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/rope.h"

namespace pagedattn::kernels {

class RopeTable {
 public:
  // `base` (without a table of its own) with a table covering positions
  // [0, positions) attached. The rows are computed by rope_cos_sin, in
  // double, and kept: every call must pass the same base.
  const RopeConfig& covering(const RopeConfig& base, std::int32_t head_dim, std::int32_t positions);

 private:
  RopeConfig rope_;
  std::vector<float> cos_, sin_;  // [rows][rotary_dim / 2]
};

}  // namespace pagedattn::kernels
