#include "op_checks.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <optional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/errors.h"

namespace pagedattn::ops {

const char* index_type_name(IndexType type) noexcept {
  return type == IndexType::kInt32 ? "int32" : "int64";
}

namespace checks {
namespace {

template <typename Extents>
std::string shape_string(const Extents& shape, std::int32_t rank) {
  std::ostringstream os;
  os << '[';
  for (std::int32_t d = 0; d < rank; ++d)
    os << (d ? ", " : "") << shape[static_cast<std::size_t>(d)];
  os << ']';
  return os.str();
}

template <typename View>
void check_shape_of(const char* call, const char* name, const View& v,
                    std::initializer_list<std::int64_t> expected) {
  bool same = v.rank == static_cast<std::int32_t>(expected.size());
  std::int32_t d = 0;
  for (std::int64_t extent : expected) same = same && v.dim(d++) == extent;
  require(same, call, ": ", name, " has shape ", shape_string(v.shape, v.rank), ", expected ",
          shape_string(std::data(expected), static_cast<std::int32_t>(expected.size())));
}

constexpr std::int64_t kInt32Max = std::numeric_limits<std::int32_t>::max();

}  // namespace

void check_present(const char* call, const char* name, const void* data, std::int64_t elements) {
  require(elements == 0 || data != nullptr, call, ": ", name, " is null but has ", elements,
          " elements");
}

void check_shape(const char* call, const char* name, const TensorView& t,
                 std::initializer_list<std::int64_t> expected) {
  check_shape_of(call, name, t, expected);
}

void check_shape(const char* call, const char* name, const IndexView& v,
                 std::initializer_list<std::int64_t> expected) {
  check_shape_of(call, name, v, expected);
}

void check_rank(const char* call, const char* name, std::int32_t rank, std::int32_t expected) {
  require(rank == expected, call, ": ", name, " has rank ", rank, ", expected ", expected);
}

void check_dtype(const char* call, const char* name, DType actual, DType expected) {
  require(actual == expected, call, ": ", name, " has dtype ", dtype_name(actual), ", expected ",
          dtype_name(expected));
}

void check_activation_dtype(const char* call, const char* name, const TensorView& t) {
  require(is_activation_dtype(t.dtype), call, ": ", name, " has dtype ", dtype_name(t.dtype),
          ", expected float32, float16 or bfloat16");
}

void check_index_type(const char* call, const char* name, const IndexView& v, IndexType expected) {
  require(v.type == expected, call, ": ", name, " has dtype ", index_type_name(v.type),
          ", expected ", index_type_name(expected));
}

void check_contiguous(const char* call, const char* name, const TensorView& t) {
  const auto dense = dense_strides(t.shape, t.rank);
  for (std::int32_t d = 0; d < t.rank; ++d)
    require(t.dim(d) <= 1 || t.stride(d) == dense[static_cast<std::size_t>(d)], call, ": ", name,
            " must be contiguous: stride[", d, "] = ", t.stride(d), ", expected ",
            dense[static_cast<std::size_t>(d)]);
}

namespace {

// Layouts with interleaved axes are checked element by element up to this
// many rows (their start offsets are sorted); larger ones are refused.
constexpr std::int64_t kMaxRowsCheckedExactly = std::int64_t{1} << 22;

// Two rows (index tuples over every axis but the last, `row` elements each)
// of `t` that share an element, as flat row numbers with the distance of
// their starts; none when every row is apart.
struct RowClash {
  std::int64_t first_row = 0, second_row = 0, distance = 0;
};
std::optional<RowClash> clashing_rows(const TensorView& t, std::int64_t row) {
  const std::int32_t outer = t.rank - 1;
  std::vector<std::pair<std::int64_t, std::int64_t>> starts;  // (offset, flat row)
  std::array<std::int64_t, kMaxTensorRank> index{};
  std::int64_t offset = 0;
  for (std::int64_t flat = 0;; ++flat) {
    starts.emplace_back(offset, flat);
    std::int32_t d = outer - 1;
    for (; d >= 0; --d) {  // odometer over the outer axes, last fastest
      const auto a = static_cast<std::size_t>(d);
      offset += t.stride(d);
      if (++index[a] < t.dim(d)) break;
      offset -= t.stride(d) * t.dim(d);
      index[a] = 0;
    }
    if (d < 0) break;
  }
  std::sort(starts.begin(), starts.end());
  for (std::size_t i = 1; i < starts.size(); ++i)
    if (starts[i].first - starts[i - 1].first < row)
      return RowClash{starts[i - 1].second, starts[i].second,
                      starts[i].first - starts[i - 1].first};
  return std::nullopt;
}

// "[i, j, k]": flat row `flat` of t's outer axes, then `last` on the last axis.
std::string element_string(const TensorView& t, std::int64_t flat, std::int64_t last) {
  std::array<std::int64_t, kMaxTensorRank> index{};
  index[static_cast<std::size_t>(t.rank - 1)] = last;
  for (std::int32_t d = t.rank - 2; d >= 0; --d) {
    index[static_cast<std::size_t>(d)] = flat % t.dim(d);
    flat /= t.dim(d);
  }
  return shape_string(index, t.rank);
}

}  // namespace

void check_rows_contiguous(const char* call, const char* name, const TensorView& t) {
  const std::int32_t last = t.rank - 1;
  require(t.rank >= 1 && (t.dim(last) <= 1 || t.stride(last) == 1), call, ": ", name,
          " must have a contiguous last axis: stride[", last, "] = ", t.rank ? t.stride(last) : 0);
  for (std::int32_t d = 0; d < t.rank; ++d)
    if (t.dim(d) == 0) return;  // no element, nothing to share
  const std::string layout = detail::concat(" (shape ", shape_string(t.shape, t.rank), ", strides ",
                                            shape_string(t.strides, t.rank), ")");
  for (std::int32_t d = 0; d < last; ++d)
    require(t.dim(d) <= 1 || t.stride(d) >= 0, call, ": ", name, " stride[", d, "] = ", t.stride(d),
            " is negative", layout, "; only forward strides are supported");
  // Any order of the axes is fine (head-major views, slices of fused
  // tensors): sorted by stride, each axis must step past all the elements
  // the smaller ones reach. Slicing, transposing and reshaping a dense
  // tensor only make such layouts.
  std::array<std::int32_t, kMaxTensorRank> axes{};
  std::int32_t count = 0;
  for (std::int32_t d = 0; d < last; ++d)
    if (t.dim(d) > 1) axes[static_cast<std::size_t>(count++)] = d;
  std::stable_sort(axes.begin(), axes.begin() + count,
                   [&](std::int32_t a, std::int32_t b) { return t.stride(a) < t.stride(b); });
  const std::int64_t row = t.dim(last);
  std::int64_t extent = row, rows = 1, span = 0;
  bool overflow = false;
  for (std::int32_t i = 0; i < count; ++i) {
    const std::int32_t d = axes[static_cast<std::size_t>(i)];
    overflow = overflow || __builtin_mul_overflow(t.stride(d), t.dim(d) - 1, &span) ||
               __builtin_add_overflow(extent, span, &extent) ||
               __builtin_mul_overflow(rows, t.dim(d), &rows);
  }
  require(!overflow, call, ": ", name, layout, " spans more than 2^63 elements");
  std::int64_t reach = row;
  std::int32_t inner = last;
  for (std::int32_t i = 0; i < count; ++i) {
    const std::int32_t d = axes[static_cast<std::size_t>(i)];
    if (t.stride(d) >= reach) {
      reach += t.stride(d) * (t.dim(d) - 1);
      inner = d;
      continue;
    }
    const std::string clash =
        detail::concat(call, ": ", name, " stride[", d, "] = ", t.stride(d), " overlaps the ",
                       reach, " elements of axis ", inner, layout);
    // A step shorter than a row: element s of one row is element 0 of the next.
    std::array<std::int64_t, kMaxTensorRank> first{}, second{};
    first[static_cast<std::size_t>(last)] = t.stride(d);
    second[static_cast<std::size_t>(d)] = 1;
    require(t.stride(d) >= row, clash, ": elements ", shape_string(first, t.rank), " and ",
            shape_string(second, t.rank), " share an address");
    // Interleaved axes may still keep every element apart: look.
    require(rows <= kMaxRowsCheckedExactly, clash,
            ": its axes interleave, which is checked element by element only up to ",
            kMaxRowsCheckedExactly, " rows");
    const std::optional<RowClash> found = clashing_rows(t, row);
    require(!found, clash, ": elements ",
            found ? element_string(t, found->first_row, found->distance) : "", " and ",
            found ? element_string(t, found->second_row, 0) : "", " share an address");
    return;
  }
}

std::int32_t checked_int32_product(const char* call, const char* what, std::int64_t a,
                                   std::int64_t b) {
  std::int64_t product = 0;
  const bool overflow = __builtin_mul_overflow(a, b, &product);
  require(!overflow && product >= 0 && product <= kInt32Max, call, ": ", what, " = ", a, " x ", b,
          " overflows int32");
  return static_cast<std::int32_t>(product);
}

std::int32_t checked_int32(const char* call, const char* what, std::int64_t value) {
  require(value >= 0 && value <= kInt32Max, call, ": ", what, " = ", value,
          " is outside [0, 2^31)");
  return static_cast<std::int32_t>(value);
}

void check_offsets(const char* call, const char* name, const IndexView& v, std::int64_t count,
                   std::int64_t total, OffsetsEnd end) {
  require(v.at(0) == 0, call, ": ", name, "[0] = ", v.at(0), " must be 0");
  for (std::int64_t i = 1; i <= count; ++i)
    require(v.at(i) >= v.at(i - 1), call, ": ", name, "[", i, "] = ", v.at(i), " is less than ",
            name, "[", i - 1, "] = ", v.at(i - 1));
  if (end == OffsetsEnd::kExact)
    require(v.at(count) == total, call, ": ", name, "[", count, "] = ", v.at(count),
            " must equal the token count ", total);
  else
    require(v.at(count) <= total, call, ": ", name, "[", count, "] = ", v.at(count),
            " exceeds the token count ", total);
}

void check_length(const char* call, const char* name, std::int64_t index, std::int64_t value,
                  std::int64_t capacity, const char* capacity_what) {
  require(value >= 0 && value <= capacity, call, ": ", name, "[", index, "] = ", value,
          " is outside [0, ", capacity, "] (", capacity_what, ")");
}

void check_page_table(const char* call, const char* name, const IndexView& table,
                      std::span<const std::int32_t> kv_lens, std::int32_t page_size,
                      std::int64_t num_pages) {
  for (std::size_t b = 0; b < kv_lens.size(); ++b) {
    const std::int64_t used = (std::int64_t{kv_lens[b]} + page_size - 1) / page_size;
    require(used <= table.dim(1), call, ": sequence ", b, " needs ", used, " pages for ",
            kv_lens[b], " keys but ", name, " has ", table.dim(1), " columns");
    for (std::int64_t i = 0; i < used; ++i) {
      const std::int64_t page = table.at(static_cast<std::int64_t>(b), i);
      require(page >= 0 && page < num_pages, call, ": ", name, "[", b, "][", i, "] = ", page,
              " is outside [0, ", num_pages, ")");
    }
  }
}

void check_slots(const char* call, const char* name, const IndexView& v, std::int64_t count,
                 std::int64_t num_slots) {
  for (std::int64_t i = 0; i < count; ++i)
    require(v.at(i) == -1 || (v.at(i) >= 0 && v.at(i) < num_slots), call, ": ", name, "[", i,
            "] = ", v.at(i), " is outside [0, ", num_slots, ") and not -1");
}

void check_unique_slots(const char* call, const char* name, std::span<const std::int64_t> slots) {
  std::vector<std::int64_t> used;
  used.reserve(slots.size());
  for (std::int64_t s : slots)
    if (s != -1) used.push_back(s);
  std::sort(used.begin(), used.end());
  const auto repeated = std::adjacent_find(used.begin(), used.end());
  require(repeated == used.end(), call, ": ", name, ": slot ",
          repeated == used.end() ? 0 : *repeated, " appears more than once");
}

void check_pairs(const char* call, const char* name, const IndexView& v, std::int64_t src_limit,
                 std::int64_t dst_limit) {
  for (std::int64_t i = 0; i < v.dim(0); ++i)
    for (std::int64_t col = 0; col < 2; ++col) {
      const std::int64_t limit = col == 0 ? src_limit : dst_limit;
      require(v.at(i, col) >= 0 && v.at(i, col) < limit, call, ": ", name, "[", i, "][", col,
              "] = ", v.at(i, col), " is outside [0, ", limit, ")");
    }
}

void check_position_rows(const char* call, const char* name, std::int64_t rows,
                         std::int64_t needed) {
  require(rows >= needed, call, ": ", name, " has ", rows, " rows but position ", needed - 1,
          " is used");
}

void check_finite(const char* call, const char* name, float value) {
  require(std::isfinite(value), call, ": ", name, " = ", value, " must be finite");
}

void check_positive(const char* call, const char* name, float value) {
  require(std::isfinite(value) && value > 0.0f, call, ": ", name, " = ", value,
          " must be finite and > 0");
}

}  // namespace checks
}  // namespace pagedattn::ops
