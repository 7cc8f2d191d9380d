#include "gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "pagedattn/errors.h"

// OpenBLAS's own controls, weak so that another CBLAS still links (the
// pointers are then null).
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
}

namespace pagedattn::engine {
namespace {

const float* f32_weights(const LinearArgs& a) {
  return static_cast<const float*>(a.w);
}

// y[rows][cols] (+)= x[rows][in] w[cols][in]^T with leading dimensions in / ldy.
void sgemm(const LinearArgs& a, const float* x, std::int32_t rows, const float* w,
           std::int32_t cols, float* y, std::int32_t ldy) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, a.in, 1.0f, x, a.in, w, a.in,
              a.accumulate ? 1.0f : 0.0f, y, ldy);
}

// The row stride of y.
std::int32_t ldy(const LinearArgs& a) {
  return a.ldy == 0 ? a.out : a.ldy;
}

std::int32_t column_blocks(std::int32_t out) {
  return (out + kColumnBlock - 1) / kColumnBlock;
}

// Below this many multiply-adds a product runs on one thread: waking the
// others costs more than it saves, and much more on a loaded machine.
constexpr std::int64_t kParallelWork = std::int64_t{1} << 22;

bool worth_threads(const LinearArgs& a) {
  return std::int64_t{a.rows} * a.out * a.in >= kParallelWork;
}

// A decode step's quantised products are small (a 576 x 960 Q4_1 matrix is
// 0.35 MB) but bound by reading the weights, which every core adds to:
// split them once they hold a few hundred kilobytes.
constexpr std::int64_t kQuantParallelBytes = std::int64_t{1} << 17;

bool worth_threads_quant(const LinearArgs& a) {
  return std::int64_t{a.out} * weight_row_bytes(a.w_format, a.in) >= kQuantParallelBytes ||
         worth_threads(a);
}

// Every row in one call per column block (the results of a row may depend on
// the batch: BLAS picks its kernels by shape).
void linear_fast(const LinearArgs& a) {
  const std::int32_t blocks = column_blocks(a.out);
#pragma omp parallel for schedule(static) if (blocks > 1 && worth_threads(a))
  for (std::int32_t b = 0; b < blocks; ++b) {
    const std::int32_t col = b * kColumnBlock, cols = std::min(kColumnBlock, a.out - col);
    sgemm(a, a.x, a.rows, f32_weights(a) + std::size_t(col) * a.in, cols, a.y + col, ldy(a));
  }
}

// Quantised weights, few rows: the in-place kernels, one contiguous column
// range per thread (each call quantises x once on the int8 path, and 576
// columns split 288 / 288 rather than 3 / 2 blocks of 128). A row's result
// does not depend on the range (quant_product), so the split is free.
void linear_quant_direct(const LinearArgs& a, bool int8) {
  const QuantProductArgs q{a.x, a.rows, a.in, a.w, a.w_format, a.y, ldy(a), a.accumulate, int8};
  const int threads =
      column_blocks(a.out) > 1 && worth_threads_quant(a) ? omp_get_max_threads() : 1;
  if (threads == 1) return quant_product(q, 0, a.out);
#pragma omp parallel for schedule(static) num_threads(threads)
  for (int t = 0; t < threads; ++t)
    quant_product(q, static_cast<std::int32_t>(std::int64_t{a.out} * t / threads),
                  static_cast<std::int32_t>(std::int64_t{a.out} * (t + 1) / threads));
}

// Quantised weights, many rows: each column block dequantised once into a
// per-thread f32 block, then one BLAS call for every row.
void linear_quant_blocked(const LinearArgs& a, LinearScratch& s) {
  const int threads = omp_get_max_threads();
  s.weight_blocks.resize(std::size_t(threads));
  for (auto& block : s.weight_blocks) block.resize(std::size_t(kColumnBlock) * a.in);
  const std::int32_t blocks = column_blocks(a.out);
#pragma omp parallel for schedule(static) num_threads(threads) if (blocks > 1 && worth_threads(a))
  for (std::int32_t b = 0; b < blocks; ++b) {
    const std::int32_t col = b * kColumnBlock, cols = std::min(kColumnBlock, a.out - col);
    float* w = s.weight_blocks[std::size_t(omp_get_thread_num())].data();
    dequantize_weight_rows(a.w, a.w_format, a.in, col, cols, w);
    sgemm(a, a.x, a.rows, w, cols, a.y + col, ldy(a));
  }
}

// One kRowBlock x cols tile: tile[c][r] = x[r] . w[c]. The rows are BLAS's
// m dimension (its vector lanes) so a row's result does not depend on its
// place in the block; the columns (n) sit at fixed places in fixed blocks.
void sgemm_tile(const LinearArgs& a, const float* x, const float* w, std::int32_t cols,
                float* tile) {
  cblas_sgemm(CblasColMajor, CblasTrans, CblasNoTrans, kRowBlock, cols, a.in, 1.0f, x, a.in, w,
              a.in, 0.0f, tile, kRowBlock);
}

void linear_deterministic(const LinearArgs& a, LinearScratch& s) {
  constexpr std::int32_t kRows = kRowBlock;
  const std::int32_t full_blocks = a.rows / kRows, tail = a.rows % kRows;
  const std::int32_t row_blocks = full_blocks + (tail > 0 ? 1 : 0);
  const std::int32_t col_blocks = column_blocks(a.out);
  if (tail > 0) {  // the last block padded with zero rows
    s.padded_x.assign(std::size_t(kRows) * a.in, 0.0f);
    std::memcpy(s.padded_x.data(), a.x + std::size_t(full_blocks) * kRows * a.in,
                std::size_t(tail) * a.in * sizeof(float));
  }
  const int threads = omp_get_max_threads();
  s.tiles.resize(std::size_t(threads));
  for (auto& tile : s.tiles) tile.resize(std::size_t(kRows) * kColumnBlock);
  const std::int32_t tiles = row_blocks * col_blocks;
#pragma omp parallel for schedule(static) num_threads(threads) if (tiles > 1 && worth_threads(a))
  for (std::int32_t t = 0; t < tiles; ++t) {
    const std::int32_t block = t / col_blocks, col = t % col_blocks * kColumnBlock;
    const std::int32_t row = block * kRows, rows = std::min(kRows, a.rows - row);
    const std::int32_t cols = std::min(kColumnBlock, a.out - col);
    const float* x = block < full_blocks ? a.x + std::size_t(row) * a.in : s.padded_x.data();
    float* tile = s.tiles[std::size_t(omp_get_thread_num())].data();
    sgemm_tile(a, x, f32_weights(a) + std::size_t(col) * a.in, cols, tile);
    for (std::int32_t r = 0; r < rows; ++r) {
      float* y = a.y + std::size_t(row + r) * ldy(a) + col;
      for (std::int32_t c = 0; c < cols; ++c)
        y[c] = (a.accumulate ? y[c] : 0.0f) + tile[std::size_t(c) * kRows + r];
    }
  }
}

}  // namespace

namespace {
std::atomic<int> int8_default{-1};  // -1: not yet read from the environment
}  // namespace

bool int8_activations_default() {
  int v = int8_default.load(std::memory_order_relaxed);
  if (v < 0) {
    const char* int8 = std::getenv("PAGEDATTN_INT8_ACTIVATIONS");
    v = int8 != nullptr && std::strcmp(int8, "1") == 0 ? 1 : 0;
    int8_default.store(v, std::memory_order_relaxed);
  }
  return v == 1;
}

void set_int8_activations_default(bool int8) {
  int8_default.store(int8 ? 1 : 0, std::memory_order_relaxed);
}

int blas_threads() {
  return openblas_get_num_threads ? openblas_get_num_threads() : 0;
}

void set_blas_threads(int threads) {
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
}

void use_single_threaded_blas() {
  if (blas_threads() > 1) set_blas_threads(1);
}

void linear(const LinearArgs& a, LinearScratch& scratch) {
  require(a.ldy == 0 || a.ldy >= a.out, "linear: ldy = ", a.ldy,
          " is neither 0 (y's rows are out = ", a.out, " long) nor >= out");
  if (a.rows == 0) return;
  if (a.w_format != WeightFormat::kF32) {
    const bool int8 = !a.deterministic &&
                      (a.activations == Activations::kInt8 ||
                       (a.activations == Activations::kDefault && int8_activations_default()));
    if (int8 && a.rows <= kInt8DirectRows)
      linear_quant_direct(a, true);
    else if (a.deterministic || a.rows <= kQuantDirectRows)
      linear_quant_direct(a, false);
    else
      linear_quant_blocked(a, scratch);
  } else if (a.deterministic)
    linear_deterministic(a, scratch);
  else
    linear_fast(a);
}

}  // namespace pagedattn::engine
