#include "pagedattn/token_tree.h"

#include <algorithm>

namespace pagedattn {

void extend_depths(std::span<const std::int32_t> parents, std::vector<std::int32_t>& depths) {
  for (std::size_t i = depths.size(); i < parents.size(); ++i)
    depths.push_back(parents[i] < 0 ? 0 : depths[static_cast<std::size_t>(parents[i])] + 1);
}

bool is_chain(std::span<const std::int32_t> parents) {
  for (std::size_t i = 0; i < parents.size(); ++i)
    if (parents[i] != static_cast<std::int32_t>(i) - 1) return false;
  return true;
}

void append_dfs_intervals(std::span<const std::int32_t> parents, std::vector<std::int32_t>& enter,
                          std::vector<std::int32_t>& exit) {
  const std::size_t n = parents.size();
  // Subtree sizes bottom-up (parents precede children).
  std::vector<std::int32_t> size(n, 1);
  for (std::size_t i = n; i-- > 0;)
    if (parents[i] >= 0) size[static_cast<std::size_t>(parents[i])] += size[i];
  // Preorder: a node takes the next free index inside its parent's interval;
  // children in node order.
  const std::size_t base = enter.size();
  enter.resize(base + n);
  exit.resize(base + n);
  std::vector<std::int32_t> next_child(n);
  std::int32_t next_root = 0;
  for (std::size_t i = 0; i < n; ++i) {
    std::int32_t& slot =
        parents[i] < 0 ? next_root : next_child[static_cast<std::size_t>(parents[i])];
    enter[base + i] = slot;
    slot += size[i];
    next_child[i] = enter[base + i] + 1;
    exit[base + i] = enter[base + i] + size[i] - 1;
  }
}

std::vector<std::int32_t> root_to_leaf_path(std::span<const std::int32_t> parents,
                                            std::int32_t leaf) {
  std::vector<std::int32_t> path;
  for (std::int32_t node = leaf; node >= 0; node = parents[static_cast<std::size_t>(node)])
    path.push_back(node);
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace pagedattn
