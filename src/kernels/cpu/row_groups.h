// The row-group ladder of the tiled kernels (attention; the engine's weight products).
//
// A kernel keeps a tile of query rows in registers and is instantiated per
// row count; a block of rows is walked in groups of the sizes it was built
// for, largest first (8, 4, 2, 1 or a subset). RowGroups<8, 4, 2, 1> is that
// walk, written once: it calls visit(std::integral_constant<int, kRows>{},
// row) for each group, so the visitor names the tile size as a constant.
//
// The visitor is inlined into the caller's target: a lambda inside a function
// with its own __attribute__((target(...))) must carry the same attribute
// (GCC and clang do not pass it on to lambdas), or the tile calls it makes
// cannot be inlined.
#pragma once

#include <hwy/base.h>

#include <bit>
#include <cstdint>
#include <type_traits>

namespace pagedattn::kernels {

template <int... kSizes>
constexpr int LastOf() {
  int last = 0;
  ((last = kSizes), ...);
  return last;
}

template <int... kSizes>
struct RowGroups {
  static_assert(LastOf<kSizes...>() == 1, "the last group is one row");

  // Visits the first group of rows [row, row_end) (not empty): the largest
  // size that fits. Returns its size.
  template <class Visit>
  static HWY_INLINE std::int32_t VisitFirst(std::int32_t row, std::int32_t row_end, Visit&& visit) {
    std::int32_t size = 0;
    (void)((row + kSizes <= row_end &&
            (visit(std::integral_constant<int, kSizes>{}, row), size = kSizes, true)) ||
           ...);
    return size;
  }

  // Visits rows [row, row_end) group by group.
  template <class Visit>
  static HWY_INLINE void VisitAll(std::int32_t row, std::int32_t row_end, Visit&& visit) {
    while (row < row_end) row += VisitFirst(row, row_end, visit);
  }
};

// The width of a register tile of `rows` rows in `accumulators`
// accumulators: the most columns (keys) that fit, a power of two so that
// tiles cover a block of a power of two. Rows that do not divide the
// accumulators leave some of them unused rather than split the group.
constexpr int PowerOfTwoTileWidth(int rows, int accumulators) {
  return static_cast<int>(std::bit_floor(static_cast<unsigned>(accumulators / rows)));
}

// Every group size from 8 rows down: the decode tiles that take a KV head's
// whole GQA group (3, 5, 6 and 7 too) as one tile.
using EveryRowGroup = RowGroups<8, 7, 6, 5, 4, 3, 2, 1>;

}  // namespace pagedattn::kernels
