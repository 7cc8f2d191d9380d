// Token-tree masks: the SIMD kernel against the double reference on random
// forests (odd sizes, trees spanning several forwards, prefix keys, GQA,
// every KV dtype, page sizes 1/5/16, ALiBi, softcap, sinks, inline RoPE at
// tree positions), on every compiled Highway target; chains are exactly the
// causal result; malformed mask arrays are refused.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <hwy/targets.h>

#include <functional>
#include <random>

#include "attention_case.h"
#include "pagedattn/errors.h"

namespace pagedattn::testing {
namespace {

// The mask arrays of a batch, built here by a recursive DFS.
struct TreeArrays {
  std::vector<std::int32_t> begin, indptr{0}, enter, exit, positions;

  // Sequence b's keys [kv_len - parents.size(), kv_len) are the nodes.
  void add(const std::vector<std::int32_t>& parents, std::int32_t kv_len) {
    const auto n = static_cast<std::int32_t>(parents.size()), first = kv_len - n;
    begin.push_back(first);
    std::vector<std::vector<std::int32_t>> children(parents.size());
    for (std::int32_t i = 0; i < n; ++i)
      if (parents[i] >= 0) children[parents[i]].push_back(i);
    const std::size_t base = enter.size();
    enter.resize(base + parents.size());
    exit.resize(base + parents.size());
    positions.resize(base + parents.size());
    std::int32_t counter = 0;
    std::function<void(std::int32_t, std::int32_t)> visit = [&](std::int32_t node,
                                                                std::int32_t depth) {
      enter[base + node] = counter++;
      positions[base + node] = first + depth;
      for (std::int32_t c : children[node]) visit(c, depth + 1);
      exit[base + node] = counter - 1;
    };
    for (std::int32_t i = 0; i < n; ++i)
      if (parents[i] < 0) visit(i, 0);
    indptr.push_back(static_cast<std::int32_t>(enter.size()));
  }
  TokenTreeMask mask() const {
    return {begin.data(), indptr.data(), enter.data(), exit.data(), positions.data()};
  }
};

std::vector<std::int32_t> random_parents(std::int32_t n, std::mt19937& rng) {
  std::vector<std::int32_t> parents;
  const int style = std::uniform_int_distribution<int>(0, 2)(rng);
  for (std::int32_t i = 0; i < n; ++i) {
    std::uniform_int_distribution<std::int32_t> any(-1, i - 1), near(std::max(-1, i - 3), i - 1);
    parents.push_back(style == 0 ? any(rng) : style == 1 ? near(rng) : (i == 0 ? -1 : (i - 1) / 2));
  }
  return parents;
}

struct TreeCase {
  CaseSpec spec;
  TreeArrays trees;
};

TreeCase random_tree_case(std::uint32_t seed) {
  std::mt19937 rng(seed);
  auto pick = [&](auto... values) { return pick_one(rng, values...); };
  TreeCase t;
  CaseSpec& s = t.spec;
  s.seed = seed;
  const auto heads = pick(0, 1, 2, 3);
  const std::int32_t qo[] = {8, 32, 12, 8}, kv[] = {8, 8, 2, 1};
  s.num_qo_heads = qo[heads];
  s.num_kv_heads = kv[heads];
  s.head_dim = pick(32, 64, 80, 40);
  // Page sizes and KV dtypes rotate with the seed, so every run covers all.
  const std::int32_t pages[] = {1, 16, 5};
  const DType kv_types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kINT8, DType::kFP8E4M3};
  s.page_size = pages[seed % 3];
  s.kv_dtype = kv_types[seed % 5];
  s.q_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
  s.o_dtype = pick(DType::kF32, DType::kF16, DType::kBF16);
  s.layout = pick(KVLayout::kHND, KVLayout::kNHD);
  s.options.causal = pick(true, true, false);
  s.options.softcap = pick(0.0f, 0.0f, 30.0f);
  s.alibi = pick(false, false, true);
  s.sinks = pick(false, true);
  s.key_rope = pick(0, 0, 1, 2);
  const int batch = pick(1, 2, 3, 4);
  for (int b = 0; b < batch; ++b) {
    const std::int32_t prefix = pick(0, 1, 31, 97, 200);
    const std::int32_t nodes = pick(1, 7, 33, 64, 65);
    const std::int32_t queries = std::min(nodes, pick(1, 7, 64));  // earlier nodes: keys only
    const std::int32_t kv_len = prefix + nodes;
    s.kv_lens.push_back(kv_len);
    s.q_lens.push_back(queries);
    if (pick(0, 1, 2) == 0) {  // an ordinary sequence beside the trees
      t.trees.add({}, kv_len);
    } else {
      t.trees.add(random_parents(nodes, rng), kv_len);
    }
  }
  return t;
}

void run_with_trees(AttentionCase& c, const TokenTreeMask& mask, const AttentionPlanOptions& po) {
  AttentionParams ref = c.params(0), opt = c.params(1);
  ref.tree_mask = opt.tree_mask = mask;
  paged_attention_reference(ref);
  AttentionRunner(po).run(opt);
}

TEST(TreeAttentionKernel, MatchesReferenceOnRandomForests) {
  for (std::uint32_t seed = 1; seed <= 20; ++seed) {
    const TreeCase t = random_tree_case(seed);
    SCOPED_TRACE(seed);
    AttentionCase c(t.spec);
    run_with_trees(
        c, t.trees.mask(),
        AttentionPlanOptions{1 + std::int32_t(seed % 3), 0, 32, false, false, false, false, false});
    expect_close(c, "seed " + std::to_string(seed));
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(TreeAttentionKernel, EveryCompiledHighwayTargetMatchesReference) {
  for_each_highway_target([](std::int64_t target) {
    for (std::uint32_t seed = 100; seed < 102; ++seed) {
      const TreeCase t = random_tree_case(seed);
      SCOPED_TRACE(std::string(hwy::TargetName(target)) + " seed " + std::to_string(seed));
      AttentionCase c(t.spec);
      run_with_trees(c, t.trees.mask(),
                     AttentionPlanOptions{2, 0, 16, false, false, false, false, false});
      expect_close(c, hwy::TargetName(target));
    }
  });
}

// A chain's mask hides exactly what causality hides: same bits as no mask.
TEST(TreeAttentionKernel, ChainMaskEqualsCausalBitwise) {
  CaseSpec spec;
  spec.q_lens = {64, 1, 37};
  spec.kv_lens = {300, 50, 37};
  spec.num_qo_heads = 12;
  spec.num_kv_heads = 2;
  spec.head_dim = 64;
  spec.kv_dtype = DType::kF16;
  spec.alibi = true;
  spec.key_rope = 1;
  TreeArrays chains;
  for (std::size_t b = 0; b < spec.q_lens.size(); ++b) {
    std::vector<std::int32_t> parents;
    for (std::int32_t i = 0; i < spec.q_lens[b]; ++i) parents.push_back(i - 1);
    chains.add(parents, spec.kv_lens[b]);
  }
  AttentionCase c(spec);
  AttentionParams masked = c.params(1);
  masked.tree_mask = chains.mask();
  AttentionRunner(AttentionPlanOptions{2, 0, 64, false, false, false, false, false})
      .run(c.params(0));
  AttentionRunner(AttentionPlanOptions{2, 0, 64, false, false, false, false, false}).run(masked);
  EXPECT_EQ(c.output(0), c.output(1));
}

TEST(TreeAttentionKernel, RejectsMalformedMasks) {
  CaseSpec spec;
  spec.q_lens = {3};
  spec.kv_lens = {10};
  AttentionCase c(spec);
  auto rejects = [&](const TreeArrays& t, AttentionOptions options, const char* what) {
    AttentionParams p = c.params(1);
    p.tree_mask = t.mask();
    p.options = options;
    try {
      paged_attention_reference(p);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const InvalidArgument& e) {
      EXPECT_THAT(e.what(), ::testing::HasSubstr(what));
    }
  };
  TreeArrays ok;
  ok.add({-1, 0, 0}, 10);
  AttentionOptions windowed;
  windowed.window_left = 4;
  rejects(ok, windowed, "window_left = 4 cannot be combined");
  TreeArrays short_tree;
  short_tree.add({-1, 0}, 10);
  rejects(
      short_tree, {},
      "tree_mask.tree_begin[0] = 8 must be kv_len = 10 (no tree) or in [0, kv_len - q_len = 7]");
  TreeArrays bad = ok;
  bad.exit[1] = 3;
  rejects(bad, {}, "tree_mask node 1 has enter = 1, exit = 3");
  bad = ok;
  bad.positions[2] = 10;
  rejects(bad, {}, "tree_mask.positions[2] = 10");
  bad = ok;
  bad.indptr[1] = 2;
  rejects(bad, {}, "gives sequence 0 2 nodes, kv_len - tree_begin = 3");
}

}  // namespace
}  // namespace pagedattn::testing
