// PagedKVCache's sequence observer: it sees every successful sequence
// operation (not the failed ones), and replaying its log with apply() on a
// cache of the same shape rebuilds the same sequences, lengths and pages
// (tensor parallelism keeps its ranks' caches in step this way).
#include <gtest/gtest.h>

#include <vector>

#include "pagedattn/errors.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn {
namespace {

TEST(SequenceObserver, ReplayingTheLogRebuildsTheSameCache) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.head_dim = 8;
  k.page_size = 4;
  k.num_pages = 16;
  PagedKVCache a(k), b(k);
  std::vector<SequenceOp> log;
  a.set_sequence_observer([&](const SequenceOp& op) { log.push_back(op); });
  a.add_sequence(1);
  a.begin_forward(std::vector<SeqId>{1}, std::vector<std::int64_t>{6});
  a.mark_layer_appended(0);
  a.end_forward();
  EXPECT_THROW(a.add_sequence(1), InvalidArgument);  // failed calls are not logged
  a.fork_sequence(1, 2, 5);
  a.pop_n(1, 2);
  a.remove_sequence(1);
  ASSERT_EQ(log.size(), 4u);
  EXPECT_EQ(log[1].kind, SequenceOp::Kind::kFork);
  EXPECT_EQ(log[1].parent_id, 1);
  EXPECT_EQ(log[1].count, 5);
  b.add_sequence(1);
  b.begin_forward(std::vector<SeqId>{1}, std::vector<std::int64_t>{6});
  b.mark_layer_appended(0);
  b.end_forward();
  for (std::size_t i = 1; i < log.size(); ++i) b.apply(log[i]);
  EXPECT_EQ(b.sequence_ids(), a.sequence_ids());
  EXPECT_EQ(b.sequence_length(2), 5);
  EXPECT_EQ(b.sequence_pages(2), a.sequence_pages(2));
  EXPECT_EQ(b.num_free_pages(), a.num_free_pages());
}

TEST(SequenceObserver, IsRefusedWhereTheLogCannotDescribeTheCache) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.head_dim = 8;
  k.page_size = 4;
  k.num_pages = 16;
  const auto log_nothing = [](const SequenceOp&) {};
  k.enable_prefix_caching = true;
  PagedKVCache caching(k);
  EXPECT_THROW(caching.set_sequence_observer(log_nothing), Unsupported);
  caching.set_sequence_observer({});  // removing none is fine
  k.enable_prefix_caching = false;
  k.host_num_pages = 8;
  PagedKVCache tiered(k);
  EXPECT_THROW(tiered.set_sequence_observer(log_nothing), Unsupported);
}

}  // namespace
}  // namespace pagedattn
