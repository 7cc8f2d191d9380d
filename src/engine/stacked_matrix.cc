#include "engine/stacked_matrix.h"

#include <algorithm>

#include "pagedattn/errors.h"

namespace pagedattn::engine {

void StackedMatrix::append(WeightMatrix m) {
  require(parts_.empty() || m.in() == in(), "StackedMatrix::append: rows of ", m.in(),
          " weights below rows of ", in());
  out_ += m.out();
  if (!parts_.empty() && parts_.back().format() == m.format())
    parts_.back().append_rows(m);
  else
    parts_.push_back(std::move(m));
}

std::int64_t StackedMatrix::bytes() const {
  std::int64_t total = 0;
  for (const WeightMatrix& p : parts_) total += p.bytes();
  return total;
}

StackedMatrix StackedMatrix::gather_rows(const std::vector<RowRange>& ranges,
                                         const char* what) const {
  StackedMatrix result;
  for (const RowRange& range : ranges) {
    require(range.begin >= 0 && range.count >= 0 && std::int64_t{range.begin} + range.count <= out_,
            "StackedMatrix::gather_rows: rows [", range.begin, ", +", range.count, ") of ", what,
            " (", out_, " rows) are out of range");
    std::int32_t part_begin = 0;
    for (const WeightMatrix& p : parts_) {  // the pieces of the range inside each part
      const std::int32_t lo = std::max(range.begin, part_begin);
      const std::int32_t hi = std::min(range.begin + range.count, part_begin + p.out());
      if (lo < hi) result.append(p.slice(lo - part_begin, hi - lo, 0, p.in(), what));
      part_begin += p.out();
    }
  }
  return result;
}

bool StackedMatrix::takes_int8_tiles(std::int32_t rows, bool deterministic) const {
  return std::any_of(parts_.begin(), parts_.end(), [&](const WeightMatrix& p) {
    return engine::takes_int8_tiles(rows, p.format(), deterministic);
  });
}

void StackedMatrix::project(const float* x, std::int32_t rows, float* y, bool accumulate,
                            bool deterministic, LinearScratch& scratch,
                            const Int8Rows* x_int8) const {
  project_columns(x, rows, y, {0, out_}, accumulate, deterministic, scratch, x_int8);
}

void StackedMatrix::project_columns(const float* x, std::int32_t rows, float* y, IndexRange cols,
                                    bool accumulate, bool deterministic, LinearScratch& scratch,
                                    const Int8Rows* x_int8) const {
  std::int32_t first = 0;  // the part's first column
  for (const WeightMatrix& p : parts_) {
    const std::int32_t begin = std::max(cols.begin, first);
    const std::int32_t end = std::min(cols.end, first + p.out());
    if (begin < end) {
      LinearArgs args{x,         rows,       p.in(),        p.data(),  p.out(),
                      y + first, accumulate, deterministic, p.format()};
      args.ldy = out_;
      args.x_int8 = x_int8;
      linear(column_range(args, {begin - first, end - first}), scratch);
    }
    first += p.out();
  }
}

}  // namespace pagedattn::engine
