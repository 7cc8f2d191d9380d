// One logical weight matrix stored as row blocks that may differ in format:
// a Q4_K_M file keeps attn_q and attn_k in Q4_K but attn_v in Q6_K, and
// fusing them into one format would mean dequantising all three.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/gemm.h"
#include "engine/weight_matrix.h"

namespace pagedattn::engine {

class StackedMatrix {
 public:
  StackedMatrix() = default;
  explicit StackedMatrix(WeightMatrix m) { append(std::move(m)); }

  // Stacks `m`'s rows below the others (merged into the last part when the
  // formats agree). InvalidArgument when its input width differs.
  void append(WeightMatrix m);
  std::int32_t out() const { return out_; }
  std::int32_t in() const { return parts_.empty() ? 0 : parts_.front().in(); }
  const std::vector<WeightMatrix>& parts() const { return parts_; }
  std::int64_t bytes() const;

  // The rows [begin, begin + count) of each range, stacked in order (a
  // tensor-parallel shard's q, k and v heads).
  struct RowRange {
    std::int32_t begin, count;
  };
  StackedMatrix gather_rows(const std::vector<RowRange>& ranges, const char* what) const;

  // y[rows][out()] (+)= x[rows][in()] w^T, part by part into adjacent columns.
  // x_int8: x's rows already rounded to int8, for the parts that take the
  // int8 tiles (LinearArgs::x_int8).
  void project(const float* x, std::int32_t rows, float* y, bool accumulate, bool deterministic,
               LinearScratch& scratch, const Int8Rows* x_int8 = nullptr) const;
  // The same for the columns `cols` of y alone (y still [rows][out()]), each
  // part's share through column_range(): deterministic mode keeps the bits
  // of project() where cols.begin is on a multiple of kColumnBlock from the
  // first column of its part.
  void project_columns(const float* x, std::int32_t rows, float* y, IndexRange cols,
                       bool accumulate, bool deterministic, LinearScratch& scratch,
                       const Int8Rows* x_int8 = nullptr) const;
  // Whether a part runs a batch of `rows` on the int8 tiles
  // (takes_int8_tiles): where x rounded once is worth handing to project().
  bool takes_int8_tiles(std::int32_t rows, bool deterministic) const;

 private:
  std::vector<WeightMatrix> parts_;
  std::int32_t out_ = 0;
};

}  // namespace pagedattn::engine
