// White-box tests of the cache's building blocks (src/cache): the page pool's
// consistency check, which check_invariants() relies on to report broken
// refcounts, and the sliding-window trim arithmetic.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "cache/page_pool.h"
#include "cache/sequence.h"

namespace pagedattn::cache {
namespace {

using ::testing::HasSubstr;

TEST(PagePool, HandsOutLowIdsFirstAndRecyclesLastFreedFirst) {
  PagePool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.take(), 0);
  EXPECT_EQ(pool.take(), 1);
  EXPECT_EQ(pool.take(), 2);
  pool.release(1);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.take(), 1);
  EXPECT_EQ(pool.refcount(1), 1);
}

TEST(PagePool, RefcountsAndSharing) {
  PagePool pool(2);
  const std::int32_t p = pool.take();
  EXPECT_FALSE(pool.is_shared(p));
  pool.retain(p);
  EXPECT_TRUE(pool.is_shared(p));
  EXPECT_EQ(pool.refcount(p), 2);
  pool.release(p);
  EXPECT_EQ(pool.num_free(), 1);
  pool.release(p);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.check({0, 0}), "");
}

TEST(PagePool, CheckReportsMismatchedRefcountsAndLeaks) {
  PagePool pool(3);
  const std::int32_t a = pool.take(), b = pool.take();
  pool.retain(a);
  EXPECT_EQ(pool.check({2, 1, 0}), "");
  EXPECT_THAT(pool.check({1, 1, 0}), HasSubstr("page 0 has refcount 2 but 1 references"));
  EXPECT_THAT(pool.check({2, 0, 0}), HasSubstr("page 1 has refcount 1 but 0 references"));
  (void)b;
}

TEST(PagesForSlots, RoundsUp) {
  EXPECT_EQ(pages_for_slots(0, 4), 0);
  EXPECT_EQ(pages_for_slots(1, 4), 1);
  EXPECT_EQ(pages_for_slots(4, 4), 1);
  EXPECT_EQ(pages_for_slots(5, 4), 2);
  EXPECT_EQ(pages_for_slots(7, 1), 7);
}

Sequence windowed(std::int64_t length, std::int64_t gap, std::int64_t window, std::int64_t sink) {
  Sequence s;
  s.length = length;
  s.gap_len = gap;
  s.window_size = window;
  s.sink_len = sink;
  return s;
}

TEST(WindowTrim, NothingWithinTheWindowOrWithoutOne) {
  EXPECT_EQ(plan_window_trim(windowed(6, 0, 6, 2), 4).evict, 0);
  Sequence plain;
  plain.length = 100;
  EXPECT_EQ(plan_window_trim(plain, 4).evict, 0);
}

TEST(WindowTrim, ReleasesOnlyPagesWhollyInTheGap) {
  // Page 4, sink 2, window 6, 10 tokens, no gap yet: evict 4 -> gap slots
  // [2, 6): page 1 (slots 4-7) still holds tokens 6 and 7.
  WindowTrim t = plan_window_trim(windowed(10, 0, 6, 2), 4);
  EXPECT_EQ(t.evict, 4);
  EXPECT_EQ(t.num_pages, 0);
  // Gap 4 already, 9 tokens: evict 3 -> gap [2, 9): page 1 is wholly inside.
  t = plan_window_trim(windowed(9, 4, 6, 2), 4);
  EXPECT_EQ(t.evict, 3);
  EXPECT_EQ(t.first_page, 1);
  EXPECT_EQ(t.num_pages, 1);
  // Sink 0, 100 tokens, window 20: gap [0, 80) = pages 0-19.
  t = plan_window_trim(windowed(100, 0, 20, 0), 4);
  EXPECT_EQ(t.first_page, 0);
  EXPECT_EQ(t.num_pages, 20);
  // Sink 4 on a page boundary: the gap starts at page 1.
  t = plan_window_trim(windowed(30, 0, 16, 4), 4);
  EXPECT_EQ(t.evict, 14);
  EXPECT_EQ(t.first_page, 1);
  EXPECT_EQ(t.num_pages, 3);  // gap [4, 18): pages 1 2 3
}

TEST(SequenceSlots, SinksThenGap) {
  const Sequence s = windowed(6, 5, 6, 2);
  EXPECT_EQ(s.slot_of(1), 1);
  EXPECT_EQ(s.slot_of(2), 7);
  EXPECT_EQ(s.used_slots(), 11);
  Sequence e = s;
  e.evicted = 3;
  EXPECT_EQ(e.poppable(), 4);
  EXPECT_EQ(s.poppable(), 6);
}

}  // namespace
}  // namespace pagedattn::cache
