// When row-wise element work goes to the threads.
#pragma once

#include <cstdint>

namespace pagedattn::core {

// Row-wise element work of a step (RMSNorm, RoPE, gated activations) is
// split over the threads from this many elements: a served step of a dozen
// rows or more, whose serial norms and activations otherwise stayed flat as
// threads were added. Each row is still computed whole by one thread, so the
// split changes no result.
inline constexpr std::int64_t kRowParallelElements = std::int64_t{1} << 13;

}  // namespace pagedattn::core
