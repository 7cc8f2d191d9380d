// An owned weight matrix [out][in] in one of linear()'s formats: f32, or the
// GGUF block formats the quantised kernels read in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "core/huge_page_vector.h"
#include "engine/gemm.h"
#include "pagedattn/gguf_types.h"

namespace pagedattn::engine {

// The format the model keeps a GGUF matrix of `type` and rows of `in`
// weights in, read in place by the kernels: the quantised types, and F16 /
// BF16 rows of whole 32-weight blocks (widened in registers); nullopt for
// the rest, which it widens to f32 at load (F32, and 16-bit rows of other
// lengths).
std::optional<WeightFormat> in_place_format(GgufType type, std::int64_t in);

class WeightMatrix {
 public:
  WeightMatrix() = default;
  // [out][in] f32 values.
  static WeightMatrix f32(std::vector<float> values, std::int32_t out, std::int32_t in);
  // `out` rows of weight_row_bytes(format, in) bytes each, copied.
  static WeightMatrix rows(WeightFormat format, std::span<const std::byte> bytes, std::int32_t out,
                           std::int32_t in);

  WeightFormat format() const { return format_; }
  std::int32_t out() const { return out_; }
  std::int32_t in() const { return in_; }
  bool empty() const { return out_ == 0; }
  const void* data() const { return bytes_.data(); }
  std::int64_t bytes() const { return std::ssize(bytes_); }

  // Appends the rows of `other` (same format and in): fuses q/k/v or gate/up.
  void append_rows(const WeightMatrix& other);
  // Rows [row_begin, row_begin + rows) and input columns [col_begin,
  // col_begin + cols) as a new matrix (a tensor-parallel shard). A
  // quantised format's columns must start and end on
  // weight_format_block(format()) boundaries (32 or 256 weights):
  // InvalidArgument naming `what` otherwise. F16 / BF16 columns off those
  // boundaries come back widened to f32 (exactly, as such rows are at load).
  WeightMatrix slice(std::int32_t row_begin, std::int32_t rows, std::int32_t col_begin,
                     std::int32_t cols, const char* what) const;
  // dst[in] = row `row` as f32 (an embedding lookup).
  void row_to_f32(std::int32_t row, float* dst) const;

 private:
  WeightMatrix widened_slice(std::int32_t row_begin, std::int32_t rows, std::int32_t col_begin,
                             std::int32_t cols) const;

  WeightFormat format_ = WeightFormat::kF32;
  std::int32_t out_ = 0, in_ = 0;
  core::HugePageVector<std::byte> bytes_;  // streamed every step: on huge pages
};

}  // namespace pagedattn::engine
