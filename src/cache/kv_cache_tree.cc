// PagedKVCache token trees (speculative decoding): the tree forward, its
// mask arrays in the plan, and committing the accepted path.
#include <algorithm>

#include "kv_cache_state.h"
#include "pagedattn/token_tree.h"

namespace pagedattn {

using cache::Sequence;

namespace {
constexpr const char* kCommit = "commit_accepted_token_tree_nodes";
}  // namespace

const BatchPlan& PagedKVCache::begin_forward(std::span<const SeqId> seq_ids,
                                             std::span<const std::int64_t> append_lengths,
                                             std::span<const std::int64_t> token_tree_parents) {
  const auto lock = state_->lock();
  state_->begin_tree(seq_ids, append_lengths, token_tree_parents);
  return state_->plan;
}

BatchPlan PagedKVCache::begin_forward_copy(std::span<const SeqId> seq_ids,
                                           std::span<const std::int64_t> append_lengths,
                                           std::span<const std::int64_t> token_tree_parents) {
  const auto lock = state_->lock();
  state_->begin_tree(seq_ids, append_lengths, token_tree_parents);
  return state_->plan;
}

void PagedKVCache::State::begin_tree(std::span<const SeqId> ids, std::span<const std::int64_t> lens,
                                     std::span<const std::int64_t> parents) {
  require_no_forward("begin_forward");
  const std::int64_t pages = validate_forward(ids, lens, "begin_forward", true);
  validate_tree_parents(ids, lens, parents);
  require_free_pages(pages, "begin_forward");
  start_step(lens);
  build_plan(ids, lens, true, parents);
  if (observer) {
    SequenceOp op{.kind = SequenceOp::Kind::kBeginForward, .count = 1};
    op.seq_ids.assign(ids.begin(), ids.end());
    op.values.assign(lens.begin(), lens.end());
    op.tree_parents.assign(parents.begin(), parents.end());
    notify(op);
  }
}

// Called after validate_forward: ids exist and are unique, sizes match.
void PagedKVCache::State::validate_tree_parents(std::span<const SeqId> ids,
                                                std::span<const std::int64_t> lens,
                                                std::span<const std::int64_t> parents) const {
  std::int64_t total = 0;
  for (std::int64_t len : lens) total += len;
  require(std::ssize(parents) == total, "PagedKVCache::begin_forward: token_tree_parents has ",
          parents.size(), " entries but append_lengths sum to ", total);
  std::int64_t at = 0;
  for (std::size_t i = 0; i < ids.size(); ++i) {
    const Sequence& s = seqs.find(ids[i])->second;
    require(!s.windowed(), "PagedKVCache::begin_forward: seq_ids[", i, "] = ", ids[i],
            " has a sliding window; token trees need a sequence without one");
    require(s.gap_len == 0, "PagedKVCache::begin_forward: seq_ids[", i, "] = ", ids[i],
            " keeps the gap of the windowed sequence it was forked from; token trees need "
            "a sequence without one");
    const std::int64_t first_node = s.tree_size(), end_node = first_node + lens[i];
    require(end_node <= kMaxTokenTreeNodes, "PagedKVCache::begin_forward: seq_ids[", i,
            "] = ", ids[i], " would hold ", end_node, " uncommitted tree nodes (", first_node,
            " before this forward), more than ", kMaxTokenTreeNodes);
    for (std::int64_t node = first_node; node < end_node; ++node, ++at) {
      const std::int64_t parent = parents[static_cast<std::size_t>(at)];
      require(parent >= -1 && parent < end_node, "PagedKVCache::begin_forward: token_tree_parents[",
              at, "] = ", parent, " (node ", node, " of seq_id = ", ids[i],
              ") is out of range: the tree has nodes [0, ", end_node, "), -1 = the prefix");
      require(parent < node, "PagedKVCache::begin_forward: token_tree_parents[", at, "] = ", parent,
              " (node ", node, " of seq_id = ", ids[i], ") must be less than its node index ",
              node);
    }
  }
}

void PagedKVCache::State::append_tree_to_plan(Sequence& s, std::span<const std::int64_t> parents) {
  s.tree_open = true;
  for (std::int64_t p : parents) s.tree_parents.push_back(static_cast<std::int32_t>(p));
  extend_depths(s.tree_parents, s.tree_depths);
  const auto committed = static_cast<std::int32_t>(s.committed_length());
  const std::size_t n = parents.size();
  std::int32_t* pos = plan.positions.data() + plan.positions.size() - n;
  const std::int32_t* depth = s.tree_depths.data() + s.tree_depths.size() - n;
  for (std::size_t t = 0; t < n; ++t) pos[t] = committed + depth[t];
  // A chain is ordinary causal attention: no mask arrays, full speed.
  const bool masked = !is_chain(s.tree_parents);
  plan.tree_begin.push_back(masked ? committed : static_cast<std::int32_t>(s.length));
  if (masked) {
    plan.has_tree = true;
    append_dfs_intervals(s.tree_parents, plan.tree_enter, plan.tree_exit);
    for (std::int32_t d : s.tree_depths) plan.tree_positions.push_back(committed + d);
  }
  plan.tree_node_indptr.push_back(static_cast<std::int32_t>(plan.tree_enter.size()));
}

TokenTreeMask BatchPlan::tree_mask() const {
  if (!has_tree) return {};
  return {tree_begin.data(), tree_node_indptr.data(), tree_enter.data(), tree_exit.data(),
          tree_positions.data()};
}

void PagedKVCache::commit_accepted_token_tree_nodes(std::span<const SeqId> seq_ids,
                                                    std::span<const std::int64_t> leaf_indices) {
  State& st = *state_;
  const auto lock = st.lock();
  st.require_no_forward(kCommit);
  require(seq_ids.size() == leaf_indices.size(), "PagedKVCache::", kCommit, ": seq_ids has ",
          seq_ids.size(), " entries but leaf_indices has ", leaf_indices.size());
  st.require_unique_ids(seq_ids, kCommit);
  for (std::size_t i = 0; i < seq_ids.size(); ++i) {
    const auto it = st.seqs.find(seq_ids[i]);
    require(it != st.seqs.end(), "PagedKVCache::", kCommit, ": seq_ids[", i, "] = ", seq_ids[i],
            " does not exist");
    const Sequence& s = it->second;
    require<InvalidState>(s.tree_open, "PagedKVCache::", kCommit, ": seq_ids[", i,
                          "] = ", seq_ids[i],
                          " has no uncommitted token tree (no tree forward since "
                          "its last commit)");
    require(leaf_indices[i] >= -1 && leaf_indices[i] < s.tree_size(), "PagedKVCache::", kCommit,
            ": leaf_indices[", i, "] = ", leaf_indices[i], " for seq_id = ", seq_ids[i],
            " is outside [-1, ", s.tree_size(), "): its tree has ", s.tree_size(), " nodes");
  }
  for (std::size_t i = 0; i < seq_ids.size(); ++i)
    st.commit_tree_path(st.seqs.find(seq_ids[i])->second,
                        static_cast<std::int32_t>(leaf_indices[i]));
  st.notify_list(SequenceOp::Kind::kCommitTree, seq_ids, leaf_indices);
}

void PagedKVCache::State::commit_tree_path(Sequence& s, std::int32_t leaf) {
  const std::vector<std::int32_t> path = root_to_leaf_path(s.tree_parents, leaf);
  const std::int64_t committed = s.committed_length();
  const std::int32_t ps = page_size();
  // Node path[d] >= d moves down to committed + d; in increasing d no source
  // is overwritten before it is read. The tree's pages are never shared
  // (appends copy-on-write, fork is refused while the tree is open).
  for (std::size_t d = 0; d < path.size(); ++d) {
    if (path[d] == static_cast<std::int32_t>(d)) continue;
    const std::int64_t from = committed + path[d], to = committed + std::int64_t(d);
    storage.copy_slots(s.pages[from / ps], static_cast<std::int32_t>(from % ps), s.pages[to / ps],
                       static_cast<std::int32_t>(to % ps), 1);
  }
  s.length = committed + std::ssize(path);
  s.tree_open = false;
  s.tree_parents.clear();
  s.tree_depths.clear();
  release_tail(s);
}

std::int64_t PagedKVCache::token_tree_size(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "token_tree_size", "seq_id").tree_size();
}

bool PagedKVCache::has_open_token_tree(SeqId seq_id) const {
  const auto lock = state_->lock();
  return state_->find(seq_id, "has_open_token_tree", "seq_id").tree_open;
}

}  // namespace pagedattn
