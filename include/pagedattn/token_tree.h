// Token trees of speculative decoding as parent arrays (node i's parent is
// parents[i] < i, or -1 for a child of the committed prefix), and the forms
// derived from them: depths, the DFS intervals of a TokenTreeMask, the
// accepted root-to-leaf path. PagedKVCache uses them; callers of
// paged_attention who build a TokenTreeMask themselves may too. Pure
// functions: the parent arrays must already be valid.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace pagedattn {

// PagedKVCache holds up to this many uncommitted nodes per sequence (TVM's limit).
inline constexpr std::int64_t kMaxTokenTreeNodes = 256;

// Appends the depths of nodes [depths.size(), parents.size()) (roots 0).
void extend_depths(std::span<const std::int32_t> parents, std::vector<std::int32_t>& depths);

// True when every node's parent is the node before it (a plain chain).
bool is_chain(std::span<const std::int32_t> parents);

// DFS preorder intervals: node k is an ancestor-or-self of node q iff
// enter[k] <= enter[q] <= exit[k]. Appends one entry per node to each.
void append_dfs_intervals(std::span<const std::int32_t> parents, std::vector<std::int32_t>& enter,
                          std::vector<std::int32_t>& exit);

// Node indices from a root down to `leaf` (empty for leaf -1).
std::vector<std::int32_t> root_to_leaf_path(std::span<const std::int32_t> parents,
                                            std::int32_t leaf);

}  // namespace pagedattn
