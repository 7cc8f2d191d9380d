// Matrix products of the built-in model through BLAS (cblas_sgemm).
#pragma once

#include <cstdint>
#include <vector>

namespace pagedattn::engine {

// Rows per BLAS call in deterministic mode: every call has the same shape,
// so a row's result does not depend on how many rows the batch has.
inline constexpr std::int32_t kDeterministicRowBlock = 16;

struct LinearArgs {
  const float* x = nullptr;  // [rows][in]
  std::int32_t rows = 0;
  std::int32_t in = 0;
  const float* w = nullptr;  // [out][in] (a PyTorch Linear weight)
  std::int32_t out = 0;
  float* y = nullptr;        // [rows][out]
  bool accumulate = false;   // y += x w^T instead of y = x w^T
  bool deterministic = false;
};

// y (+)= x w^T. `scratch` holds the padded last block in deterministic mode.
void linear(const LinearArgs& args, std::vector<float>& scratch);

}  // namespace pagedattn::engine
