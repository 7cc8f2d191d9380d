// Non-owning tensor views for the peer-compatible operators (ops/*.h): data,
// element type, shape and element strides, so each operator can check what
// its peer would (shapes, dtypes, contiguity) before touching anything.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>

#include "pagedattn/dtype.h"

namespace pagedattn::ops {

inline constexpr std::int32_t kMaxTensorRank = 4;

// Row-major strides (in elements) of a dense tensor of `shape`.
template <std::size_t N>
constexpr std::array<std::int64_t, N> dense_strides(const std::array<std::int64_t, N>& shape,
                                                    std::int32_t rank) {
  std::array<std::int64_t, N> strides{};
  std::int64_t stride = 1;
  for (std::int32_t d = rank - 1; d >= 0; --d) {
    strides[static_cast<std::size_t>(d)] = stride;
    stride *= shape[static_cast<std::size_t>(d)];
  }
  return strides;
}

// A float tensor (activations, caches, scales): f32 / f16 / bf16, or a KV
// storage type (fp8, int8) for caches.
struct TensorView {
  void* data = nullptr;
  DType dtype = DType::kF32;
  std::int32_t rank = 0;
  std::array<std::int64_t, kMaxTensorRank> shape{};
  std::array<std::int64_t, kMaxTensorRank> strides{};  // elements

  // A dense row-major tensor.
  static TensorView dense(void* data, DType dtype, std::initializer_list<std::int64_t> shape) {
    TensorView t;
    t.data = data;
    t.dtype = dtype;
    for (std::int64_t extent : shape) t.shape[static_cast<std::size_t>(t.rank++)] = extent;
    t.strides = dense_strides(t.shape, t.rank);
    return t;
  }
  constexpr std::int64_t dim(std::int32_t d) const { return shape[static_cast<std::size_t>(d)]; }
  constexpr std::int64_t stride(std::int32_t d) const {
    return strides[static_cast<std::size_t>(d)];
  }
};

enum class IndexType : std::uint8_t { kInt32 = 0, kInt64 = 1 };

// An integer tensor of rank 1 or 2 (lengths, offsets, page tables, slots).
struct IndexView {
  const void* data = nullptr;
  IndexType type = IndexType::kInt32;
  std::int32_t rank = 0;
  std::array<std::int64_t, 2> shape{};
  std::array<std::int64_t, 2> strides{};  // elements

  template <typename Int>
  static IndexView dense(const Int* data, std::initializer_list<std::int64_t> shape) {
    static_assert(sizeof(Int) == 4 || sizeof(Int) == 8, "int32 or int64 indices");
    IndexView v;
    v.data = data;
    v.type = sizeof(Int) == 4 ? IndexType::kInt32 : IndexType::kInt64;
    for (std::int64_t extent : shape) v.shape[static_cast<std::size_t>(v.rank++)] = extent;
    v.strides = dense_strides(v.shape, v.rank);
    return v;
  }
  constexpr std::int64_t dim(std::int32_t d) const { return shape[static_cast<std::size_t>(d)]; }
  // Element [i] of a rank-1 view, or [row][col] of a rank-2 view.
  std::int64_t at(std::int64_t i) const { return load(i * strides[0]); }
  std::int64_t at(std::int64_t row, std::int64_t col) const {
    return load(row * strides[0] + col * strides[1]);
  }

 private:
  std::int64_t load(std::int64_t offset) const {
    return type == IndexType::kInt32 ? static_cast<const std::int32_t*>(data)[offset]
                                     : static_cast<const std::int64_t*>(data)[offset];
  }
};

const char* index_type_name(IndexType type) noexcept;

}  // namespace pagedattn::ops
