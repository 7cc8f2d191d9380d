// Token-tree attention scenarios (TVM's test_paged_attention_kv_cache_tree_attn
// and more), in several RoPE modes, KV dtypes and page sizes. TreeHarness
// checks every attention output against a dense reference that masks
// explicitly, and K/V after every commit.
#include <gtest/gtest.h>

#include "tree_harness.h"

namespace pagedattn::test {
namespace {

using Parents = std::vector<std::int64_t>;

const Parents kBinary7 = {-1, 0, 0, 1, 1, 2, 2};
const Parents kBinary15 = {-1, 0, 0, 1, 1, 2, 2, 3, 3, 4, 4, 5, 5, 6, 6};
const Parents kChain10 = {-1, 0, 1, 2, 3, 4, 5, 6, 7, 8};
const Parents kForest14 = {-1, 0, 0, 1, 1, 2, 2, -1, 7, 7, 8, 8, 9, 9};

class TreeScenario : public ::testing::TestWithParam<TreeSetup> {};

// Four trees in one forward, leaves [6, 11, 6, 13], then five decode rounds.
TEST_P(TreeScenario, TvmTreesCommitThenDecode) {
  TreeHarness t(GetParam());
  for (SeqId id : {0, 1, 2, 3}) t.add(id);
  t.step({0, 1, 2, 3}, {13, 5, 30, 1});
  t.tree_step({0, 1, 2, 3}, {kBinary7, kBinary15, kChain10, kForest14});
  t.commit({0, 1, 2, 3}, {6, 11, 6, 13});
  for (int round = 0; round < 5; ++round) t.step({0, 1, 2, 3}, {1, 1, 1, 1});
}

// Chains of 7 with leaves [2, 6, -1, 4] (one rejects everything), then decode.
TEST_P(TreeScenario, ChainsCommitThenDecode) {
  TreeHarness t(GetParam());
  for (SeqId id : {0, 1, 2, 3}) t.add(id);
  t.step({0, 1, 2, 3}, {17, 4, 9, 2});
  const Parents chain7 = {-1, 0, 1, 2, 3, 4, 5};
  t.tree_step({0, 1, 2, 3}, {chain7, chain7, chain7, chain7});
  t.commit({0, 1, 2, 3}, {2, 6, -1, 4});
  for (int round = 0; round < 5; ++round) t.step({0, 1, 2, 3}, {1, 1, 1, 1});
}

// A complete binary tree grown one level per forward (step i adds 2^i
// nodes: each forward's nodes attend to ancestors from earlier forwards),
// then committed at a deepest leaf and at a shallow one, then decode.
TEST_P(TreeScenario, TreeGrownOverFiveForwardsThenCommitted) {
  TreeHarness t(GetParam());
  for (SeqId id : {5, 6}) t.add(id);
  t.step({5, 6}, {21, 3});
  for (std::int64_t level = 0; level < 5; ++level) {
    Parents nodes;
    for (std::int64_t n = (1 << level) - 1; n < (2 << level) - 1; ++n)
      nodes.push_back(n == 0 ? -1 : (n - 1) / 2);
    t.tree_step({5, 6}, {nodes, nodes});
  }
  t.commit({6, 5}, {9, 30});
  for (int round = 0; round < 3; ++round) t.step({5, 6}, {1, 2});
}

// Trees beside chain sequences doing prefill (37 tokens) and decode (1), and
// an empty append, in one tree forward; then ordinary steps with a new
// sequence prefilling.
TEST_P(TreeScenario, MixedBatchesOfTreesPrefillAndDecode) {
  TreeHarness t(GetParam());
  for (SeqId id : {0, 1, 2, 3, 4}) t.add(id);
  t.step({0, 1, 2, 3}, {40, 6, 3, 2});
  Parents chain37;
  for (std::int64_t i = 0; i < 37; ++i) chain37.push_back(i - 1);
  t.tree_step({0, 1, 2, 3}, {kForest14, chain37, {-1}, {}});
  t.tree_step({0, 2}, {{3, 14, 15, -1}, {0, 0}});  // grows node 3 and adds a root
  t.commit({0, 1, 2, 3}, {16, 36, 2, -1});
  t.step({0, 1, 2, 3, 4}, {1, 1, 1, 1, 19});
  t.tree_step({4, 1}, {kBinary15, {-1, -1, 1}});
  t.commit({1, 4}, {2, 14});
  t.step({4, 1, 0}, {3, 1, 1});
}

INSTANTIATE_TEST_SUITE_P(ModesDtypesPages, TreeScenario,
                         ::testing::Values(TreeSetup{DType::kF16, RopeMode::kNone, 16},
                                           TreeSetup{DType::kF32, RopeMode::kNormal, 16},
                                           TreeSetup{DType::kBF16, RopeMode::kInline, 1},
                                           TreeSetup{DType::kINT8, RopeMode::kInline, 5},
                                           TreeSetup{DType::kF16, RopeMode::kNormal, 3},
                                           TreeSetup{DType::kBF16, RopeMode::kNone, 3, true},
                                           TreeSetup{DType::kINT8, RopeMode::kNone, 16, true}));

}  // namespace
}  // namespace pagedattn::test
