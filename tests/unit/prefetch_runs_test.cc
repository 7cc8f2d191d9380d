// ForEachRunStart (src/kernels/cpu/prefetch.h): which rows of a gathered
// block start a run of rows that follow each other in memory, the rows whose
// first lines the decode loop prefetches early.
#include <gtest/gtest.h>

#include <cstddef>
#include <vector>

#include "kernels/cpu/prefetch.h"

namespace {

using pagedattn::kernels::ForEachRunStart;

std::vector<const char*> run_starts(const std::vector<const void*>& rows, std::size_t row_bytes) {
  std::vector<const char*> starts;
  ForEachRunStart(rows.data(), static_cast<std::int32_t>(rows.size()), row_bytes,
                  [&](const char* row) { starts.push_back(row); });
  return starts;
}

TEST(PrefetchRuns, PagesOfABlockAreOneRunEach) {
  constexpr std::size_t kRow = 256;  // f16, head_dim 128
  std::vector<char> pool(64 * kRow);
  // Keys 0-3 in the page at row 40, keys 4-7 in the page at row 8 (page 4).
  std::vector<const void*> rows;
  for (int e = 0; e < 4; ++e) rows.push_back(pool.data() + (40 + e) * kRow);
  for (int e = 0; e < 4; ++e) rows.push_back(pool.data() + (8 + e) * kRow);
  EXPECT_EQ(run_starts(rows, kRow), (std::vector<const char*>{pool.data() + 40 * kRow, pool.data() + 8 * kRow}));
}

TEST(PrefetchRuns, ConsecutivePagesInMemoryMakeOneRun) {
  constexpr std::size_t kRow = 128;
  std::vector<char> pool(16 * kRow);
  std::vector<const void*> rows;
  for (int e = 0; e < 16; ++e) rows.push_back(pool.data() + e * kRow);
  EXPECT_EQ(run_starts(rows, kRow), (std::vector<const char*>{pool.data()}));
}

TEST(PrefetchRuns, RepeatedOrBackwardRowsStartNewRuns) {
  constexpr std::size_t kRow = 64;
  std::vector<char> pool(8 * kRow);
  const char* r0 = pool.data();
  const char* r1 = r0 + kRow;
  // A zero row repeated (keys past a block's count) and a step backwards.
  std::vector<const void*> rows{r1, r1, r0, r1};
  EXPECT_EQ(run_starts(rows, kRow), (std::vector<const char*>{r1, r1, r0}));
  EXPECT_TRUE(run_starts({}, kRow).empty());
}

}  // namespace
