// Every error of the PagedKVCache API: the right type, a message naming the
// call, the argument and the offending value, and an unchanged state_digest().
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <vector>

#include "support/cache_driver.h"
#include "support/expect_error.h"
#include "support/kv_values.h"

namespace pagedattn::test {
namespace {

using Ids = std::vector<SeqId>;
using Lens = std::vector<std::int64_t>;

// Page size 4, 6 pages, sliding windows supported. Sequence 1 holds 6 tokens
// (pages 0 1), sequence 2 = fork(1, 4) shares page 0, sequence 3 is empty.
class ErrorPaths : public ::testing::Test {
 protected:
  ErrorPaths() : d_(small_config(4, 6, true)) {
    d_.add(1);
    d_.step({1}, {6});
    d_.fork(1, 2, 4);
    d_.add(3);
  }
  PagedKVCache& kv() { return d_.kv(); }

  CacheDriver d_;
};

TEST_F(ErrorPaths, UnknownIds) {
  expect_rejected<InvalidArgument>(kv(), [&] { kv().remove_sequence(99); },
                                   {"remove_sequence", "seq_id = 99", "does not exist"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(99, 5); },
                                   {"fork_sequence", "parent_id = 99", "does not exist"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().pop_n(-7, 1); },
                                   {"pop_n", "seq_id = -7", "does not exist"});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] {
                                     kv().begin_forward(Ids{1, 42}, Lens{1, 1});
                                   },
                                   {"begin_forward", "seq_ids", "= 42", "does not exist"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().enable_sliding_window(42, 4, 1); },
                                   {"enable_sliding_window", "seq_id = 42"});
  std::vector<float> k, v;
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_get_kv(42, 0, 0, k, v); },
                                   {"debug_get_kv", "seq_id = 42", "does not exist"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_set_kv(42, 0, 0, k, v); },
                                   {"debug_set_kv", "seq_id = 42"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().sequence_length(42); },
                                   {"sequence_length", "seq_id = 42"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().sequence_pages(42); },
                                   {"sequence_pages", "seq_id = 42"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().pages_needed(Ids{42}, Lens{1}); },
                                   {"pages_needed", "= 42"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().can_append(Ids{42}, Lens{1}); },
                                   {"can_append", "= 42"});
}

TEST_F(ErrorPaths, DuplicateIds) {
  expect_rejected<InvalidArgument>(kv(), [&] { kv().add_sequence(2); },
                                   {"add_sequence", "seq_id = 2", "already exists"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(1, 3); },
                                   {"fork_sequence", "child_id = 3", "already exists"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(1, 1); },
                                   {"child_id = 1", "already exists"});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] {
                                     kv().begin_forward(Ids{1, 3, 1}, Lens{1, 1, 1});
                                   },
                                   {"begin_forward", "seq_id = 1", "more than once"});
}

TEST_F(ErrorPaths, ForkPositionOutOfRange) {
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(1, 5, -2); },
                                   {"fork_sequence", "fork_pos = -2", "[0, 6]", "parent_id = 1"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(1, 5, 7); },
                                   {"fork_pos = 7", "[0, 6]"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(3, 5, 1); },
                                   {"fork_pos = 1", "[0, 0]"});
}

TEST_F(ErrorPaths, PopBeyondLength) {
  expect_rejected<InvalidArgument>(kv(), [&] { kv().pop_n(1, 7); },
                                   {"pop_n", "n = 7", "[0, 6]", "seq_id = 1"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().pop_n(1, -1); }, {"n = -1"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().pop_n(3, 1); }, {"n = 1", "[0, 0]"});
}

TEST_F(ErrorPaths, BadBatchArguments) {
  expect_rejected<InvalidArgument>(
      kv(),
      [&] {
        kv().begin_forward(Ids{1, 3}, Lens{1});
      },
      {"begin_forward", "seq_ids has 2 entries", "append_lengths has 1"});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] {
                                     kv().begin_forward(Ids{1, 3}, Lens{1, -3});
                                   },
                                   {"begin_forward", "append_lengths[1] = -3", "seq_id = 3"});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] { kv().begin_forward(Ids{3}, Lens{std::int64_t{1} << 31}); },
                                   {"append_lengths[0] = 2147483648", "2^31"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().pages_needed(Ids{1}, Lens{}); },
                                   {"pages_needed", "seq_ids has 1 entries"});
}

TEST_F(ErrorPaths, OutOfPagesLeavesEverythingUnchanged) {
  // 4 pages are free. Sequences 1 and 3 would fit, 2 does not.
  ASSERT_EQ(kv().num_free_pages(), 4);
  const Ids ids = {1, 3, 2};
  const Lens lens = {2, 4, 13};  // 0 + 1 + 4 pages
  EXPECT_EQ(kv().pages_needed(ids, lens), 5);
  EXPECT_FALSE(kv().can_append(ids, lens));
  expect_rejected<OutOfPages>(kv(), [&] { kv().begin_forward(ids, lens); },
                              {"begin_forward", "needs 5 free pages", "4 of 6 are free"});
  EXPECT_FALSE(kv().in_forward());
  EXPECT_EQ(kv().sequence_length(1), 6);
  EXPECT_EQ(kv().sequence_length(3), 0);
  d_.expect_matches();

  // A fork that must copy a partial page needs one free page too.
  d_.step({3}, {16});
  ASSERT_EQ(kv().num_free_pages(), 0);
  expect_rejected<OutOfPages>(kv(), [&] { kv().fork_sequence(1, 9, 5); },
                              {"fork_sequence", "needs 1 free pages", "0 of 6 are free"});
  d_.fork(1, 9, 4);  // page-aligned: shares only, needs nothing
  d_.expect_matches();
}

TEST_F(ErrorPaths, StructuralCallsDuringAForward) {
  kv().begin_forward(Ids{1}, Lens{1});
  const char* const kMsg = "not allowed while a forward is in progress";
  expect_rejected<InvalidState>(kv(), [&] { kv().add_sequence(8); }, {"add_sequence", kMsg});
  expect_rejected<InvalidState>(kv(), [&] { kv().remove_sequence(3); }, {"remove_sequence", kMsg});
  expect_rejected<InvalidState>(kv(), [&] { kv().fork_sequence(1, 8); }, {"fork_sequence", kMsg});
  expect_rejected<InvalidState>(kv(), [&] { kv().pop_n(1, 1); }, {"pop_n", kMsg});
  expect_rejected<InvalidState>(kv(), [&] { kv().enable_sliding_window(1, 4, 1); },
                                {"enable_sliding_window", kMsg});
  expect_rejected<InvalidState>(kv(), [&] { kv().begin_forward(Ids{3}, Lens{1}); },
                                {"begin_forward", kMsg});
  EXPECT_TRUE(kv().in_forward());
  end_metadata_step(kv());
  EXPECT_EQ(kv().sequence_length(1), 7);
}

TEST_F(ErrorPaths, EndForwardWithoutBegin) {
  expect_rejected<InvalidState>(kv(), [&] { kv().end_forward(); },
                                {"end_forward", "no forward is in progress"});
  expect_rejected<InvalidState>(kv(), [&] { (void)kv().plan(); }, {"plan", "no forward"});
  kv().begin_forward(Ids{}, Lens{});
  kv().end_forward();
  expect_rejected<InvalidState>(kv(), [&] { kv().end_forward(); }, {"end_forward"});
}

TEST_F(ErrorPaths, SlidingWindowArguments) {
  expect_rejected<InvalidArgument>(kv(), [&] { kv().enable_sliding_window(1, 0, 0); },
                                   {"enable_sliding_window", "window_size = 0"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().enable_sliding_window(1, -5, 0); },
                                   {"window_size = -5"});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] { kv().enable_sliding_window(1, std::int64_t{1} << 31, 0); },
                                   {"window_size = 2147483648"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().enable_sliding_window(1, 4, 4); },
                                   {"attn_sink_size = 4", "window_size = 4"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().enable_sliding_window(1, 4, -1); },
                                   {"attn_sink_size = -1"});
  d_.enable_window(3, 8, 2);
  expect_rejected<InvalidArgument>(
      kv(), [&] { kv().enable_sliding_window(3, 8, 2); },
      {"enable_sliding_window", "seq_id = 3", "already has a sliding window"});
  d_.fork(3, 9);  // a windowed parent forks; the child has no window
  EXPECT_EQ(kv().sequence_length(9), kv().sequence_length(3));
  kv().check_invariants();
}

TEST(ErrorPathsNoWindow, SlidingWindowNeedsTheConfigFlag) {
  PagedKVCache kv(small_config(4, 4, /*sliding_window=*/false));
  kv.add_sequence(1);
  expect_rejected<InvalidArgument>(kv, [&] { kv.enable_sliding_window(1, 8, 2); },
                                   {"enable_sliding_window", "support_sliding_window = false"});
}

TEST_F(ErrorPaths, PopIntoSinksAfterEvictions) {
  d_.enable_window(3, 6, 2);
  d_.step({3}, {9});  // 9 -> keeps 6: 2 sinks + 4
  expect_rejected<InvalidArgument>(
      kv(), [&] { kv().pop_n(3, 5); },
      {"pop_n", "n = 5", "[0, 4]", "attention sinks cannot be popped"});
  d_.pop(3, 4);
  EXPECT_EQ(kv().sequence_length(3), 2);
}

TEST_F(ErrorPaths, DebugSetIntoASharedPage) {
  const std::vector<std::uint64_t> uid = {1234};
  expect_rejected<InvalidArgument>(
      kv(), [&] { write_kv(kv(), 2, 3, uid); },
      {"debug_set_kv", "token 3", "seq_id = 2", "page 0", "shared by 2"});
  expect_rejected<InvalidArgument>(kv(), [&] { write_kv(kv(), 1, 0, uid); }, {"shared by 2"});
  // A range that starts in an unshared page but reaches a shared one writes nothing.
  d_.step({2}, {2});
  expect_rejected<InvalidArgument>(kv(),
                                   [&] {
                                     write_kv(kv(), 2, 3, std::vector<std::uint64_t>{7, 8, 9});
                                   },
                                   {"token 3"});
  write_kv(kv(), 1, 4, uid);  // page 1 is sequence 1's alone
}

TEST_F(ErrorPaths, DebugBufferSizesAndRanges) {
  const KVShape s = KVShape::of(kv().config());  // 2 layers, 2 heads, K dim 4, V dim 3
  std::vector<float> k(s.k_floats(2)), v(s.v_floats(2));
  ASSERT_EQ(k.size(), 32u);
  ASSERT_EQ(v.size(), 24u);
  std::vector<float> k_short(31), v_long(25);
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_get_kv(1, 0, 2, k_short, v); },
                                   {"debug_get_kv", "k buffer has 31 floats", "= 32"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_set_kv(1, 4, 6, k, v_long); },
                                   {"debug_set_kv", "v buffer has 25 floats", "= 24"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_get_kv(1, 5, 7, k, v); },
                                   {"range [5, 7)", "[0, 6]", "seq_id = 1"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_set_kv(1, 3, 1, k, v); },
                                   {"range [3, 1)"});
  expect_rejected<InvalidArgument>(kv(), [&] { kv().debug_get_kv(1, -1, 1, k, v); },
                                   {"range [-1, 1)"});
}

TEST_F(ErrorPaths, StorageAndPageQueriesOutOfRange) {
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().layer_storage(2); },
                                   {"layer_storage", "layer = 2", "[0, 2)"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().layer_storage(-1); }, {"layer = -1"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().page_refcount(6); },
                                   {"page_refcount", "page = 6", "[0, 6)"});
  expect_rejected<InvalidArgument>(kv(), [&] { (void)kv().page_refcount(-1); }, {"page = -1"});
}

TEST_F(ErrorPaths, FailedCallsLeaveTheModelMatching) {
  // After all kinds of failures in a row the cache still behaves normally.
  expect_rejected<InvalidArgument>(kv(), [&] { kv().pop_n(1, 9); });
  expect_rejected<OutOfPages>(kv(), [&] { kv().begin_forward(Ids{3}, Lens{100}); });
  expect_rejected<InvalidArgument>(kv(), [&] { kv().fork_sequence(1, 2); });
  d_.step({1, 2, 3}, {1, 1, 1});
  d_.expect_matches();
}

}  // namespace
}  // namespace pagedattn::test
