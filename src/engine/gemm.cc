#include "gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <mutex>

namespace pagedattn::engine {
namespace {

// One thread pool for the whole engine: BLAS runs single-threaded inside
// OpenMP threads (two spinning pools on the same cores slow each other down
// by an order of magnitude).
void use_single_threaded_blas() {
  static std::once_flag once;
  std::call_once(once, [] { openblas_set_num_threads(1); });
}

// y[rows][out] (+)= x w^T, the output columns split across OpenMP threads.
// The split depends only on `out`, so every element is computed the same
// way whatever `rows` is.
void sgemm_rows(const LinearArgs& a, const float* x, std::int32_t rows, float* y) {
  constexpr std::int32_t kColumnAlign = 64;
  const std::int64_t work = std::int64_t{rows} * a.out * a.in;
  const std::int32_t threads = work < (1 << 20) ? 1 : omp_get_max_threads();
  const std::int32_t per = (a.out + threads * kColumnAlign - 1) / (threads * kColumnAlign) * kColumnAlign;
#pragma omp parallel for schedule(static) num_threads(threads)
  for (std::int32_t t = 0; t < threads; ++t) {
    const std::int32_t begin = t * per, cols = std::min(a.out, begin + per) - begin;
    if (cols <= 0) continue;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, a.in, 1.0f, x, a.in,
                a.w + std::size_t(begin) * a.in, a.in, a.accumulate ? 1.0f : 0.0f, y + begin, a.out);
  }
}

}  // namespace

void linear(const LinearArgs& a, std::vector<float>& scratch) {
  if (a.rows == 0) return;
  use_single_threaded_blas();
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
