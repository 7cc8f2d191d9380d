// Many small independent products (a mixture of experts' experts, latent
// attention's per-head up-projections) split over a team's threads at once:
// where each would keep one thread busy, or open a region of its own, every
// thread takes an even share of all their columns and runs its pieces
// alone.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/team.h"
#include "engine/gemm.h"
#include "engine/weight_matrix.h"

namespace pagedattn::engine {

// Columns of one product, with all of its rows, for one thread.
struct ProductPiece {
  std::int32_t thread = 0;
  std::int32_t product = 0;  // the caller's id of the product
  IndexRange columns;
};

// The products' columns cut into units (`granule` columns from the first
// column of each part of a product's matrix, a part's last unit narrower),
// a unit costing its product's rows, and thread t taking the units that
// start in its 1 / threads of the total cost, merged into pieces.
struct ProductSplit {
  std::vector<ProductPiece> pieces;  // by thread, then in product order
  std::vector<std::int32_t> first;   // [threads + 1] offsets into pieces
  std::vector<std::int32_t> edges;   // scratch: one product's unit edges
};

// Deterministic mode cuts at kColumnBlock: f32 weights' BLAS tiles start
// there, so a column's bits do not depend on the split (column_range()).
constexpr std::int32_t product_split_granule(bool deterministic) {
  return deterministic ? kColumnBlock : kColumnGranule;
}

// A part's output columns: a matrix's, or a width alone (a split made
// before the step's weights are at hand, from their shapes).
inline std::int32_t part_width(const WeightMatrix& part) {
  return part.out();
}
inline std::int32_t part_width(std::int32_t width) {
  return width;
}

// edges = the first column of each unit of a matrix made of `parts`, then
// its width.
template <typename Part>
void unit_edges(std::span<const Part> parts, std::int32_t granule,
                std::vector<std::int32_t>& edges) {
  edges.assign(1, 0);
  std::int32_t first = 0;
  for (const Part& p : parts) {
    const std::int32_t width = part_width(p);
    for (std::int32_t c = granule; c < width; c += granule) edges.push_back(first + c);
    first += width;
    edges.push_back(first);
  }
}

// split = the units of `products` (ids; rows_of(id) rows, parts_of(id) the
// parts of its matrix, a std::span<const WeightMatrix> or of widths) over
// `threads`.
template <typename RowsOf, typename PartsOf>
void split_products(std::span<const std::int32_t> products, RowsOf&& rows_of, PartsOf&& parts_of,
                    std::int32_t granule, std::int32_t threads, ProductSplit& split) {
  std::int64_t total = 0;
  for (const std::int32_t p : products) {
    unit_edges(parts_of(p), granule, split.edges);
    total += std::int64_t{rows_of(p)} * std::int64_t(split.edges.size() - 1);
  }
  split.pieces.clear();
  split.first.assign(std::size_t(threads) + 1, 0);
  if (total == 0) return;
  std::int64_t done = 0;  // the cost of the units before
  for (const std::int32_t p : products) {
    unit_edges(parts_of(p), granule, split.edges);
    const std::int32_t rows = rows_of(p);
    for (std::size_t u = 0; u + 1 < split.edges.size(); ++u) {
      const auto thread = static_cast<std::int32_t>(done * threads / total);
      done += rows;
      const IndexRange unit{split.edges[u], split.edges[u + 1]};
      ProductPiece* last = split.pieces.empty() ? nullptr : &split.pieces.back();
      if (last != nullptr && last->thread == thread && last->product == p)
        last->columns.end = unit.end;
      else
        split.pieces.push_back({thread, p, unit});
    }
  }
  for (const ProductPiece& piece : split.pieces) ++split.first[std::size_t(piece.thread) + 1];
  for (std::int32_t t = 0; t < threads; ++t)
    split.first[std::size_t(t) + 1] += split.first[std::size_t(t)];
}

// f(piece, scratch[t]) for each piece of thread t of `split`, on the
// threads of the calling team (or a region of split's thread count outside
// one), each alone (core::SoloScope: its linear() calls do not split
// further) and on the caller's choice of activations. scratch: [threads].
template <typename F>
void run_pieces(const ProductSplit& split, std::vector<LinearScratch>& scratch, F&& f) {
  const auto threads = static_cast<std::int32_t>(split.first.size()) - 1;
  core::for_each_task(threads, with_callers_activations([&](std::int32_t t) {
                        const core::SoloScope solo;
                        for (std::int32_t i = split.first[std::size_t(t)];
                             i < split.first[std::size_t(t) + 1]; ++i)
                          f(split.pieces[std::size_t(i)], scratch[std::size_t(t)]);
                      }));
}

}  // namespace pagedattn::engine
