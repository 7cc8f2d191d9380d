#include "engine/weight_matrix.h"

#include <cstring>

#include "pagedattn/errors.h"

namespace pagedattn::engine {

std::optional<WeightFormat> in_place_format(GgufType type, std::int64_t in) {
  switch (type) {
    case GgufType::kF16:
      return in % kQuantBlock == 0 ? std::optional(WeightFormat::kF16) : std::nullopt;
    case GgufType::kBF16:
      return in % kQuantBlock == 0 ? std::optional(WeightFormat::kBF16) : std::nullopt;
    case GgufType::kQ8_0:
      return WeightFormat::kQ8_0;
    case GgufType::kQ4_0:
      return WeightFormat::kQ4_0;
    case GgufType::kQ4_1:
      return WeightFormat::kQ4_1;
    case GgufType::kQ5_0:
      return WeightFormat::kQ5_0;
    case GgufType::kQ5_1:
      return WeightFormat::kQ5_1;
    case GgufType::kQ4_K:
      return WeightFormat::kQ4_K;
    case GgufType::kQ5_K:
      return WeightFormat::kQ5_K;
    case GgufType::kQ6_K:
      return WeightFormat::kQ6_K;
    default:
      return std::nullopt;
  }
}

WeightMatrix WeightMatrix::f32(std::vector<float> values, std::int32_t out, std::int32_t in) {
  require(std::ssize(values) == std::int64_t{out} * in, "WeightMatrix::f32: ", values.size(),
          " values for a ", out, " x ", in, " matrix");
  const auto* bytes = reinterpret_cast<const std::byte*>(values.data());
  return rows(WeightFormat::kF32, {bytes, values.size() * sizeof(float)}, out, in);
}

WeightMatrix WeightMatrix::rows(WeightFormat format, std::span<const std::byte> bytes,
                                std::int32_t out, std::int32_t in) {
  require(out >= 0 && in >= 1, "WeightMatrix: shape ", out, " x ", in, " is not valid");
  const std::int64_t want = std::int64_t{out} * weight_row_bytes(format, in);
  require(std::ssize(bytes) == want, "WeightMatrix: ", bytes.size(), " bytes for ", out,
          " rows of ", in, " ", weight_format_name(format), " weights, need ", want);
  WeightMatrix m;
  m.format_ = format;
  m.out_ = out;
  m.in_ = in;
  m.bytes_.assign(bytes.begin(), bytes.end());
  return m;
}

void WeightMatrix::append_rows(const WeightMatrix& other) {
  require(other.format_ == format_ && other.in_ == in_,
          "WeightMatrix::append_rows: ", weight_format_name(other.format_), " rows of ", other.in_,
          " onto ", weight_format_name(format_), " rows of ", in_);
  bytes_.insert(bytes_.end(), other.bytes_.begin(), other.bytes_.end());
  out_ += other.out_;
}

WeightMatrix WeightMatrix::slice(std::int32_t row_begin, std::int32_t rows, std::int32_t col_begin,
                                 std::int32_t cols, const char* what) const {
  require(row_begin >= 0 && rows >= 0 && std::int64_t{row_begin} + rows <= out_ && col_begin >= 0 &&
              cols >= 1 && std::int64_t{col_begin} + cols <= in_,
          "WeightMatrix::slice: rows [", row_begin, ", +", rows, ") and columns [", col_begin,
          ", +", cols, ") of ", what, " (", out_, " x ", in_, ") are out of range");
  const std::int32_t block = weight_format_block(format_);
  const bool whole_blocks = col_begin % block == 0 && cols % block == 0;
  if (!whole_blocks && is_sixteen_bit(format_))
    return widened_slice(row_begin, rows, col_begin, cols);  // exact, as at load
  require(whole_blocks, what, " is ", weight_format_name(format_),
          ": its tensor-parallel slice of columns [", col_begin, ", ", col_begin + cols,
          ") does not fall on ", block,
          "-weight block boundaries (choose a size that divides the dimension into whole blocks)");
  const std::int64_t row_bytes = weight_row_bytes(format_, in_);
  const std::int64_t skip = weight_row_bytes(format_, col_begin);
  const std::int64_t keep = weight_row_bytes(format_, cols);
  std::vector<std::byte> bytes(std::size_t(rows) * std::size_t(keep));
  for (std::int32_t r = 0; r < rows; ++r)
    std::memcpy(
        bytes.data() + std::size_t(r) * std::size_t(keep),
        bytes_.data() + std::size_t(row_begin + r) * std::size_t(row_bytes) + std::size_t(skip),
        std::size_t(keep));
  return WeightMatrix::rows(format_, bytes, rows, cols);
}

WeightMatrix WeightMatrix::widened_slice(std::int32_t row_begin, std::int32_t rows,
                                         std::int32_t col_begin, std::int32_t cols) const {
  std::vector<float> row(std::size_t(in_), 0.0f), values(std::size_t(rows) * std::size_t(cols));
  for (std::int32_t r = 0; r < rows; ++r) {
    row_to_f32(row_begin + r, row.data());
    std::memcpy(values.data() + std::size_t(r) * std::size_t(cols), row.data() + col_begin,
                std::size_t(cols) * sizeof(float));
  }
  return f32(std::move(values), rows, cols);
}

void WeightMatrix::row_to_f32(std::int32_t row, float* dst) const {
  require(row >= 0 && row < out_, "WeightMatrix::row_to_f32: row ", row, " outside [0, ", out_,
          ")");
  if (format_ == WeightFormat::kF32)
    std::memcpy(dst, bytes_.data() + std::size_t(row) * in_ * sizeof(float),
                std::size_t(in_) * sizeof(float));
  else
    dequantize_weight_rows(bytes_.data(), format_, in_, row, 1, dst);
}

}  // namespace pagedattn::engine
