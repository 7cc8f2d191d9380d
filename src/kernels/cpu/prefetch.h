// Software prefetches of K/V rows for the CPU attention kernels, into L2.
//
// Every prefetch of rows the kernels will read goes to L2 (prefetcht1), on
// purpose: a prefetch into L1 holds one of L1's few miss buffers until its
// line arrives from DRAM, which capped decode near 8 GB/s per core on Zen 3
// and Zen 4 whatever the distance; through L2 the same loops streamed
// 1.5-1.7x faster (docs/benchmarks.md), and the rows are an L2 hit away when
// read. The Xeon (Emerald Rapids) agrees: with prefetcht0 f16 b1 x 8k
// decode took 2.04-2.05 ms against 1.60-1.85 ms through L2 (medians of
// alternating runs). Callers spread one prefetch per line consumed over their loops (a
// burst of a whole block stalls on the miss queues instead of overlapping
// with the arithmetic).
#pragma once

#include <hwy/base.h>

#include <cstddef>
#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::kernels {

// Both are forced inline (HWY_INLINE): as plain inline functions GCC 12
// kept a seventh of the prefetch instructions in the kernels' unrolled
// loops and decode ran 2x slower.

inline constexpr std::size_t kLineBytes = 64;  // a cache line: the unit of every prefetch

// Prefetches the line at p into L2.
HWY_INLINE void PrefetchToL2(const void* p) { __builtin_prefetch(p, 0, 2); }

// Prefetches the line holding element d of a kT row of `elems` elements, once
// per line: called with offsets d that step by at most a line and divide it
// (every vector), it fetches when d starts a line within the row.
template <DType kT>
HWY_INLINE void PrefetchLine(const void* row, std::size_t d, std::size_t elems) {
  constexpr std::size_t kLineElems = kLineBytes / dtype_size(kT);
  if (d % kLineElems == 0 && d < elems) PrefetchToL2(static_cast<const char*>(row) + d * dtype_size(kT));
}

// Calls f(row) for every row of rows[0, count) that starts a run: rows that
// follow each other in memory (`row_bytes` apart) form one run, so a paged
// block's rows of one head give one run per page.
template <class F>
HWY_INLINE void ForEachRunStart(const void* const* rows, std::int32_t count, std::size_t row_bytes, F&& f) {
  const char* after_previous = nullptr;  // where the previous row's run would go on
  for (std::int32_t e = 0; e < count; ++e) {
    const char* row = static_cast<const char*>(rows[e]);
    if (row != after_previous) f(row);
    after_previous = row + row_bytes;
  }
}

// Prefetches the first two lines of every run of rows (ForEachRunStart),
// steps before the spread prefetches reach them. Within a run the hardware's
// L2 streamer runs ahead of the loops once it has seen two misses in a 4 KiB
// region; a contiguous sequence's head is one long run it follows from 4 KiB
// region to the next, but a paged one starts over at a random place every
// page, and waited for the spread prefetches to start it. Measured on the
// Xeon (Emerald Rapids): paged f16 decode at page 16 went from 7-10% slower
// than contiguous to 1-3% (docs/benchmarks.md). The second line may lie past
// a short run's end: prefetches never fault.
HWY_INLINE void PrefetchRunStarts(const void* const* rows, std::int32_t count, std::size_t row_bytes) {
  ForEachRunStart(rows, count, row_bytes, [](const char* row) {
    PrefetchToL2(row);
    PrefetchToL2(row + kLineBytes);
  });
}

}  // namespace pagedattn::kernels
