// Token-tree validation: every refused call names the argument, index and
// value, throws the documented type, and leaves the cache byte-identical.
// Also what the plan carries for trees and chains.
#include <gtest/gtest.h>

#include "support/expect_error.h"
#include "support/kv_values.h"
#include "tree_harness.h"

namespace pagedattn::test {
namespace {

using Ids = std::vector<SeqId>;
using Lens = std::vector<std::int64_t>;

class TreeValidation : public ::testing::Test {
 protected:
  TreeValidation() : kv(tree_config({DType::kF16, RopeMode::kNormal, 4})) {
    for (SeqId id : {1, 2}) kv.add_sequence(id);
    kv.begin_forward(Ids{1, 2}, Lens{6, 3});
    end_metadata_step(kv);
  }
  const BatchPlan& tree_forward(const Ids& ids, const Lens& lens, const Lens& parents) {
    const BatchPlan& plan = kv.begin_forward(ids, lens, parents);
    plan_copy = plan;
    end_metadata_step(kv);
    return plan_copy;
  }
  PagedKVCache kv;
  BatchPlan plan_copy;
};

TEST_F(TreeValidation, RejectsBadParents) {
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.begin_forward(Ids{1}, Lens{3}, Lens{-1, 0, -2});
                                   },
                                   {"token_tree_parents[2] = -2", "out of range"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.begin_forward(Ids{1}, Lens{3}, Lens{-1, 0, 7});
                                   },
                                   {"token_tree_parents[2] = 7", "out of range"});
  expect_rejected<InvalidArgument>(
      kv,
      [&] {
        kv.begin_forward(Ids{1, 2}, Lens{2, 2}, Lens{-1, 0, -1, 1});
      },
      {"token_tree_parents[3] = 1", "node 1 of seq_id = 2", "less than its node index 1"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.begin_forward(Ids{1}, Lens{3}, Lens{-1, 2, 0});
                                   },
                                   {"token_tree_parents[1] = 2", "less than its node index 1"});
  expect_rejected<InvalidArgument>(
      kv,
      [&] {
        kv.begin_forward(Ids{1, 2}, Lens{2, 2}, Lens{-1, 0, -1});
      },
      {"token_tree_parents has 3 entries but append_lengths sum to 4"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.begin_forward(Ids{1}, Lens{2}, Lens{-1, 0, 1});
                                   },
                                   {"token_tree_parents has 3 entries"});
  Lens many(257, -1);
  expect_rejected<InvalidArgument>(kv, [&] { kv.begin_forward(Ids{1}, Lens{257}, many); },
                                   {"seq_ids[0] = 1", "257 uncommitted tree nodes", "256"});
}

TEST_F(TreeValidation, NodeLimitCountsEarlierForwards) {
  tree_forward({1}, {200}, Lens(200, -1));
  expect_rejected<InvalidArgument>(kv, [&] { kv.begin_forward(Ids{1}, Lens{57}, Lens(57, -1)); },
                                   {"257 uncommitted tree nodes (200 before this forward)"});
  // A later forward's parents index the whole tree; beyond it is out of range.
  expect_rejected<InvalidArgument>(kv, [&] { kv.begin_forward(Ids{1}, Lens{1}, Lens{201}); },
                                   {"token_tree_parents[0] = 201", "nodes [0, 201)"});
  tree_forward({1}, {1}, {199});
  EXPECT_EQ(kv.token_tree_size(1), 201);
}

TEST_F(TreeValidation, RejectsTreesOnSlidingWindowSequences) {
  kv.enable_sliding_window(2, 8, 1);
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.begin_forward(Ids{1, 2}, Lens{1, 1}, Lens{-1, -1});
                                   },
                                   {"seq_ids[1] = 2 has a sliding window"});
}

TEST_F(TreeValidation, RejectsBadCommits) {
  tree_forward({1, 2}, {7, 2}, {-1, 0, 0, 1, 1, 2, 2, -1, 0});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.commit_accepted_token_tree_nodes(Ids{1, 2}, Lens{7, 0});
                                   },
                                   {"leaf_indices[0] = 7 for seq_id = 1", "outside [-1, 7)"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.commit_accepted_token_tree_nodes(Ids{1, 2}, Lens{6, -2});
                                   },
                                   {"leaf_indices[1] = -2 for seq_id = 2"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.commit_accepted_token_tree_nodes(Ids{1, 2}, Lens{6});
                                   },
                                   {"seq_ids has 2 entries but leaf_indices has 1"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.commit_accepted_token_tree_nodes(Ids{1, 1}, Lens{6, 6});
                                   },
                                   {"lists seq_id = 1 more than once"});
  expect_rejected<InvalidArgument>(kv,
                                   [&] {
                                     kv.commit_accepted_token_tree_nodes(Ids{1, 9}, Lens{6, 0});
                                   },
                                   {"seq_ids[1] = 9 does not exist"});
  kv.commit_accepted_token_tree_nodes(Ids{1}, Lens{5});
  EXPECT_EQ(kv.sequence_length(1), 6 + 3);
  expect_rejected<InvalidState>(kv,
                                [&] {
                                  kv.commit_accepted_token_tree_nodes(Ids{2, 1}, Lens{0, 5});
                                },
                                {"seq_ids[1] = 1 has no uncommitted token tree"});
  kv.commit_accepted_token_tree_nodes(Ids{2}, Lens{-1});
  EXPECT_EQ(kv.sequence_length(2), 3);
  kv.check_invariants();
}

TEST_F(TreeValidation, OpenTreeRefusesPlainForwardForkPopAndWindow) {
  tree_forward({1}, {2}, {-1, 0});  // even a chain opens a tree
  EXPECT_TRUE(kv.has_open_token_tree(1));
  expect_rejected<InvalidState>(kv,
                                [&] {
                                  kv.begin_forward(Ids{2, 1}, Lens{1, 1});
                                },
                                {"seq_ids[1] = 1 has an uncommitted token tree (2 nodes)"});
  expect_rejected<InvalidState>(kv, [&] { kv.fork_sequence(1, 5); },
                                {"fork_sequence: seq_id = 1 has an uncommitted token tree"});
  expect_rejected<InvalidState>(kv, [&] { kv.pop_n(1, 1); }, {"pop_n: seq_id = 1"});
  expect_rejected<InvalidState>(kv, [&] { kv.enable_sliding_window(1, 4, 0); },
                                {"enable_sliding_window: seq_id = 1"});
  kv.begin_forward(Ids{1}, Lens{1}, Lens{1});
  expect_rejected<InvalidState>(kv, [&] { kv.commit_accepted_token_tree_nodes(Ids{1}, Lens{2}); },
                                {"forward is in progress"});
  end_metadata_step(kv);
  EXPECT_EQ(kv.pages_needed(Ids{1}, Lens{1}), 0);  // dry runs only count pages
  kv.commit_accepted_token_tree_nodes(Ids{1}, Lens{2});
  kv.fork_sequence(1, 5);
  EXPECT_EQ(kv.sequence_length(5), 9);
  kv.check_invariants();
}

TEST(TreeValidationPool, OutOfPagesLeavesTheCacheUnchanged) {
  KVCacheConfig c = tree_config({DType::kF16, RopeMode::kNone, 4});
  c.num_pages = 4;
  PagedKVCache kv(c);
  kv.add_sequence(1);
  expect_rejected<OutOfPages>(kv, [&] { kv.begin_forward(Ids{1}, Lens{17}, Lens(17, -1)); },
                              {"needs 5 free pages"});
  kv.begin_forward(Ids{1}, Lens{16}, Lens(16, -1));
}

// A chain takes the ordinary causal path: no mask arrays, consecutive positions.
TEST_F(TreeValidation, ChainsCarryNoMaskAndTreesCarryIntervals) {
  const BatchPlan& chain = tree_forward({1, 2}, {3, 2}, {-1, 0, 1, -1, 0});
  EXPECT_FALSE(chain.has_tree);
  EXPECT_EQ(chain.positions, (std::vector<std::int32_t>{6, 7, 8, 3, 4}));
  kv.commit_accepted_token_tree_nodes(Ids{1, 2}, Lens{2, 1});
  const BatchPlan& tree = tree_forward({1, 2}, {2, 4}, {-1, 0, -1, -1, 1, 0});
  EXPECT_TRUE(tree.has_tree);
  EXPECT_EQ(tree.positions, (std::vector<std::int32_t>{9, 10, 5, 5, 6, 6}));
  EXPECT_EQ(tree.tree_begin, (std::vector<std::int32_t>{11, 5}));  // seq 1 is a chain
  EXPECT_EQ(tree.tree_node_indptr, (std::vector<std::int32_t>{0, 0, 4}));
  // Preorder: node 0 {0, 3}, its child 3 {1}, root 1 {2}, its child 2 {3}.
  EXPECT_EQ(tree.tree_enter, (std::vector<std::int32_t>{0, 2, 3, 1}));
  EXPECT_EQ(tree.tree_exit, (std::vector<std::int32_t>{1, 3, 3, 1}));
  EXPECT_EQ(tree.tree_positions, (std::vector<std::int32_t>{5, 5, 6, 6}));
}

}  // namespace
}  // namespace pagedattn::test
