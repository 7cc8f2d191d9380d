// Software prefetches of K/V rows for the CPU attention kernels, into L2.
//
// Every prefetch of rows the kernels will read goes to L2 (prefetcht1), on
// purpose: a prefetch into L1 holds one of L1's few miss buffers until its
// line arrives from DRAM, which capped a core's decode bandwidth on Zen 3
// and Zen 4 whatever the distance; through L2 the same loops stream much
// faster, and the rows are an L2 hit away when read. The Xeon (Emerald
// Rapids) agrees (figures: docs/benchmarks.md, Attention kernels). Callers
// spread one prefetch per line consumed over their loops (a burst of a whole
// block stalls on the miss queues instead of overlapping with the
// arithmetic).
#pragma once

#include <hwy/base.h>

#include <cstddef>

#include "core/cache_line_vector.h"
#include "pagedattn/dtype.h"

namespace pagedattn::kernels {

// Both are forced inline (HWY_INLINE): as plain inline functions GCC 12
// left most calls in the kernels' unrolled loops out of line, and decode
// ran far slower.

inline constexpr std::size_t kLineBytes = core::kCacheLineBytes;  // the unit of every prefetch

// Prefetches the line at p into L2.
HWY_INLINE void PrefetchToL2(const void* p) {
  __builtin_prefetch(p, 0, 2);
}

// Prefetches the line holding element d of a kT row of `elems` elements, once
// per line: called with offsets d that step by at most a line and divide it
// (every vector), it fetches when d starts a line within the row.
template <DType kT>
HWY_INLINE void PrefetchLine(const void* row, std::size_t d, std::size_t elems) {
  constexpr std::size_t kLineElems = kLineBytes / dtype_size(kT);
  if (d % kLineElems == 0 && d < elems)
    PrefetchToL2(static_cast<const char*>(row) + d * dtype_size(kT));
}

}  // namespace pagedattn::kernels
