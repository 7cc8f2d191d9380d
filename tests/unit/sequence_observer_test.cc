// PagedKVCache's sequence observer: it sees every successful call that
// changes the cache (not the failed ones), and replaying its log with
// apply() on a cache of the same config rebuilds the same state (tensor
// parallelism keeps its ranks' caches in step this way).
#include <gtest/gtest.h>

#include <span>
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
  ASSERT_EQ(log.size(), 6u);  // add, begin_forward, end_forward, fork, pop_n, remove
  EXPECT_EQ(log[1].kind, SequenceOp::Kind::kBeginForward);
  EXPECT_EQ(log[1].values, std::vector<std::int64_t>{6});
  EXPECT_EQ(log[3].kind, SequenceOp::Kind::kFork);
  EXPECT_EQ(log[3].parent_id, 1);
  EXPECT_EQ(log[3].count, 5);
  for (const SequenceOp& op : log) {
    b.apply(op);
    if (op.kind == SequenceOp::Kind::kBeginForward) b.mark_layer_appended(0);
  }
  EXPECT_EQ(b.sequence_ids(), a.sequence_ids());
  EXPECT_EQ(b.sequence_length(2), 5);
  EXPECT_EQ(b.sequence_pages(2), a.sequence_pages(2));
  EXPECT_EQ(b.num_free_pages(), a.num_free_pages());
}

// Writes every layer's K/V of the open step's new tokens of `ids` (the
// last `lens[i]` tokens of each): values from the sequence and position,
// so a replica writing the same step holds the same bytes.
void write_step(PagedKVCache& c, std::span<const SeqId> ids, std::span<const std::int64_t> lens) {
  const KVCacheConfig& k = c.config();
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const std::int64_t end = c.sequence_length(ids[i]), start = end - lens[i];
    std::vector<float> kv(std::size_t(k.num_layers * lens[i] * k.num_kv_heads * k.head_dim));
    for (std::size_t j = 0; j < kv.size(); ++j)
      kv[j] = float(ids[i]) * 0.5f + float(start) * 0.03f + float(j % 97) * 0.001f;
    c.debug_set_kv(ids[i], start, end, kv, kv);
  }
}

void step(PagedKVCache& c, std::vector<SeqId> ids, std::vector<std::int64_t> lens,
          std::vector<std::int64_t> parents = {}) {
  if (parents.empty())
    c.begin_forward(ids, lens);
  else
    c.begin_forward(ids, lens, parents);
  write_step(c, ids, lens);
  c.end_forward();
}

// Prefix hits (device and host tier), told tokens, forks, swaps, a token
// tree and its commit, a cancelled step, evictions that demote cached pages
// and a reset: the replica ends bit-identical (state_digest: metadata, the
// prefix index, LRU order, host tier and K/V bytes) with equal counters.
TEST(SequenceObserver, ReplayingEveryCacheFeatureRebuildsTheSameState) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.head_dim = 8;
  k.page_size = 4;
  k.num_pages = 8;
  k.enable_prefix_caching = true;
  k.host_num_pages = 8;
  PagedKVCache a(k), b(k);
  std::vector<SequenceOp> log;
  a.set_sequence_observer([&](const SequenceOp& op) { log.push_back(op); });
  std::vector<std::int32_t> t(32);
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = std::int32_t(100 + i);
  const auto first = [&](std::size_t n) { return std::span<const std::int32_t>(t.data(), n); };
  a.add_sequence(1);
  step(a, {1}, {10});
  a.set_sequence_tokens(1, first(10));  // publishes 2 pages
  a.fork_sequence(1, 2, 9);
  step(a, {2}, {3});
  a.remove_sequence(1);
  std::vector<std::int32_t> third(t.begin(), t.begin() + 10);
  third.push_back(7);
  EXPECT_EQ(a.add_sequence_with_prefix(3, third), 8);  // 2 shared device pages
  a.swap_out(std::vector<SeqId>{2});
  a.swap_in(std::vector<SeqId>{2});
  step(a, {3}, {3}, {-1, 0, 0});
  a.commit_accepted_token_tree_nodes(std::vector<SeqId>{3}, std::vector<std::int64_t>{2});
  a.set_sequence_tokens(3, std::vector<std::int32_t>{100, 101, 102, 103, 104, 105, 106, 107, 1, 2});
  a.begin_forward(std::vector<SeqId>{3}, std::vector<std::int64_t>{1});
  a.cancel_forward();
  a.remove_sequence(2);
  a.remove_sequence(3);
  a.add_sequence(4);
  step(a, {4}, {32});  // every page: the cached ones are demoted to the host tier
  a.remove_sequence(4);
  EXPECT_EQ(a.add_sequence_with_prefix(5, first(10)), 8);  // host hits
  a.reset_prefix_cache();
  const PrefixCacheStats sa = a.prefix_cache_stats();
  EXPECT_GT(sa.demotions, 0);
  EXPECT_EQ(sa.host_hit_tokens, 8);
  EXPECT_GT(sa.swapped_out_pages, 0);

  for (const SequenceOp& op : log) {
    b.apply(op);
    if (op.kind == SequenceOp::Kind::kBeginForward) write_step(b, op.seq_ids, op.values);
  }
  b.check_invariants();
  EXPECT_EQ(b.state_digest(), a.state_digest());
  const PrefixCacheStats sb = b.prefix_cache_stats();
  EXPECT_EQ(sb.hit_tokens, sa.hit_tokens);
  EXPECT_EQ(sb.demotions, sa.demotions);
  EXPECT_EQ(sb.swapped_in_pages, sa.swapped_in_pages);
}

// A replica that is not in the state the log assumes refuses the call.
TEST(SequenceObserver, ReplayRefusesADivergedCache) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.head_dim = 8;
  k.page_size = 4;
  k.num_pages = 8;
  k.enable_prefix_caching = true;
  PagedKVCache c(k);
  SequenceOp add{.kind = SequenceOp::Kind::kAddWithPrefix, .seq_id = 1, .count = 4};
  add.token_ids = {1, 2, 3, 4, 5};
  EXPECT_THROW(c.apply(add), InvalidArgument);  // nothing cached here
  EXPECT_FALSE(c.has_sequence(1));
  add.count = 0;
  c.apply(add);
  SequenceOp tell{.kind = SequenceOp::Kind::kTellTokens, .seq_id = 1, .count = 3};
  tell.token_ids = {9};
  EXPECT_THROW(c.apply(tell), InvalidArgument);  // told 0 tokens, not 3
}

// Page transfer brings K/V from outside: not while a log is kept.
TEST(SequenceObserver, PageTransferIsRefusedWhileObserved) {
  KVCacheConfig k;
  k.num_layers = 1;
  k.head_dim = 8;
  k.page_size = 4;
  k.num_pages = 8;
  PagedKVCache c(k);
  c.add_sequence(1);
  step(c, {1}, {5});
  c.set_sequence_observer([](const SequenceOp&) {});
  EXPECT_THROW(c.reserve_incoming(2, 4), Unsupported);
  EXPECT_THROW(c.outgoing_pages(1), Unsupported);
  c.set_sequence_observer({});
  c.release_outgoing(c.outgoing_pages(1).id);
}

}  // namespace
}  // namespace pagedattn
