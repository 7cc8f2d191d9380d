// TreeHarness: a PagedKVCache driven through tree and plain forwards whose
// every attention output is checked against dense attention computed in
// double from debug_get_kv, with the ancestor mask and the RoPE positions
// derived independently here (by walking parent links), and whose commits
// are checked row by row against the K/V read before the commit.
#pragma once

#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace pagedattn::test {

struct TreeSetup {
  DType kv_dtype = DType::kF16;
  RopeMode rope_mode = RopeMode::kNone;
  std::int32_t page_size = 16;
  bool mla = false;  // AttentionKind::kMLA with one KV head and V = the whole K row
};

KVCacheConfig tree_config(const TreeSetup& setup);

class TreeHarness {
 public:
  explicit TreeHarness(const TreeSetup& setup);

  PagedKVCache& cache() { return cache_; }
  void add(SeqId id);
  // A plain forward (two-argument begin_forward), checked.
  void step(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& lens);
  // A tree forward, checked; parents flat over the batch as the API takes them.
  void tree_step(const std::vector<SeqId>& ids,
                 const std::vector<std::vector<std::int64_t>>& parents);
  // Commits and checks: prefix rows unchanged, the path's rows moved, length.
  void commit(const std::vector<SeqId>& ids, const std::vector<std::int64_t>& leaves);

 private:
  struct Mirror {  // what the test expects of one sequence
    std::int64_t committed = 0;
    std::vector<std::int64_t> parents;  // open tree, node order
  };
  void run_layers(const BatchPlan& plan);
  void check_sequence(const BatchPlan& plan, std::int32_t b, std::int32_t layer,
                      const std::vector<float>& q, const std::vector<float>& out);
  std::vector<float> random(std::size_t n);

  TreeSetup setup_;
  PagedKVCache cache_;
  std::map<SeqId, Mirror> seqs_;
  std::mt19937 rng_{11};
};

}  // namespace pagedattn::test
