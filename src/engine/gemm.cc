#include "gemm.h"

#include <cblas.h>

#include <algorithm>
#include <cstring>

namespace pagedattn::engine {
namespace {

void sgemm_rows(const LinearArgs& a, const float* x, std::int32_t rows, float* y) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, a.out, a.in, 1.0f, x, a.in, a.w, a.in,
              a.accumulate ? 1.0f : 0.0f, y, a.out);
}

}  // namespace

void linear(const LinearArgs& a, std::vector<float>& scratch) {
  if (a.rows == 0) return;
  if (!a.deterministic) return sgemm_rows(a, a.x, a.rows, a.y);
  constexpr std::int32_t kBlock = kDeterministicRowBlock;
  const std::int32_t full = a.rows / kBlock * kBlock;
  for (std::int32_t r = 0; r < full; r += kBlock)
    sgemm_rows(a, a.x + std::size_t(r) * a.in, kBlock, a.y + std::size_t(r) * a.out);
  const std::int32_t tail = a.rows - full;
  if (tail == 0) return;
  // The tail runs as a whole block padded with zero rows.
  const std::size_t x_size = std::size_t(kBlock) * a.in, y_size = std::size_t(kBlock) * a.out;
  scratch.assign(x_size + y_size, 0.0f);
  float* xs = scratch.data();
  float* ys = scratch.data() + x_size;
  std::memcpy(xs, a.x + std::size_t(full) * a.in, std::size_t(tail) * a.in * sizeof(float));
  if (a.accumulate)
    std::memcpy(ys, a.y + std::size_t(full) * a.out, std::size_t(tail) * a.out * sizeof(float));
  sgemm_rows(a, xs, kBlock, ys);
  std::memcpy(a.y + std::size_t(full) * a.out, ys, std::size_t(tail) * a.out * sizeof(float));
}

}  // namespace pagedattn::engine
