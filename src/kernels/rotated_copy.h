// A rotated f32 copy of q or k: for callers whose inputs must stay unmodified
// (cache-level attention, peer operators that rotate before caching).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/paged_kv.h"
#include "pagedattn/rope.h"

namespace pagedattn::kernels {

// Copies x [tokens][heads][dim] to dense f32 `out` and rotates it at
// `positions` [tokens]; returns the view of `out`.
HeadTensor rotated_copy(const HeadTensor& x, std::int32_t tokens, std::int32_t heads,
                        std::int32_t dim, const std::int32_t* positions, const RopeConfig& rope,
                        std::vector<float>& out);

}  // namespace pagedattn::kernels
