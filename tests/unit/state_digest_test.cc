// state_digest() must actually see the state: identical histories give equal
// digests, and every kind of successful change (metadata or the bytes of a
// used page) changes it. Otherwise the "failed calls leave the digest
// unchanged" checks elsewhere would prove nothing.
#include <gtest/gtest.h>

#include <vector>

#include "support/cache_driver.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

void build_history(CacheDriver& d) {
  d.add(1);
  d.step({1}, {6});
  d.fork(1, 2, 5);
}

TEST(StateDigest, EqualForEqualHistories) {
  CacheDriver a(small_config(4, 8, true)), b(small_config(4, 8, true));
  EXPECT_EQ(a.kv().state_digest(), b.kv().state_digest());
  build_history(a);
  build_history(b);
  EXPECT_EQ(a.kv().state_digest(), b.kv().state_digest());
}

TEST(StateDigest, ChangesWithEveryKindOfMutation) {
  CacheDriver d(small_config(4, 8, true));
  build_history(d);
  std::uint64_t last = d.kv().state_digest();
  auto expect_changed = [&](const char* what) {
    const std::uint64_t now = d.kv().state_digest();
    EXPECT_NE(now, last) << what;
    last = now;
  };
  d.add(3);
  expect_changed("add_sequence");
  d.step({3}, {2});
  expect_changed("append");
  write_kv(d.kv(), 3, 1, std::vector<std::uint64_t>{999});
  expect_changed("one token's bytes");
  d.pop(3, 1);
  expect_changed("pop_n");
  d.fork(1, 4, 4);
  expect_changed("fork_sequence");
  d.enable_window(4, 8, 1);
  expect_changed("enable_sliding_window (no trim)");
  const std::vector<SeqId> ids = {3};
  const std::vector<std::int64_t> lens = {0};
  d.kv().begin_forward(ids, lens);
  expect_changed("begin_forward");
  d.kv().end_forward();
  expect_changed("end_forward");
  d.remove(3);
  expect_changed("remove_sequence");
}

TEST(StateDigest, IgnoresBytesOfFreePages) {
  PagedKVCache kv(small_config(4, 4));
  const std::uint64_t before = kv.state_digest();
  // Page 3 is free: scribbling on it is not state.
  const PagedKVStorage s = kv.layer_storage(0);
  store_from_float(s.k_data, s.dtype, static_cast<std::size_t>(s.k_offset(3, 1, 2)), 5.0f);
  EXPECT_EQ(kv.state_digest(), before);
}

}  // namespace
}  // namespace pagedattn::test
