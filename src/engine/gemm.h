// Matrix products of the built-in model: single-threaded BLAS (cblas_sgemm)
// calls on fixed-shape tiles, spread over OpenMP threads.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/quant_kernels.h"

namespace pagedattn::engine {

// Deterministic mode tiles y into kRowBlock x kColumnBlock pieces, one
// single-threaded BLAS call each, all of the same shape: row blocks start at
// multiples of kRowBlock (the last one padded with zero rows), column blocks
// at multiples of kColumnBlock of the weight's output dimension. Rows are
// the call's m dimension (BLAS's vector lanes, computed alike), and a
// column's place in its call depends only on the model's shape, so an
// output element does not depend on the batch, its row's place in it, or the
// thread count (the tests check this on the machine they run on).
inline constexpr std::int32_t kRowBlock = 16;
inline constexpr std::int32_t kColumnBlock = 128;

struct LinearArgs {
  const float* x = nullptr;  // [rows][in]
  std::int32_t rows = 0;
  std::int32_t in = 0;
  const void* w = nullptr;  // [out] rows of `in` weights (a PyTorch Linear weight) in w_format
  std::int32_t out = 0;
  float* y = nullptr;       // [rows][ldy]: columns [0, out) of each row are written
  bool accumulate = false;  // y += x w^T instead of y = x w^T
  bool deterministic = false;
  WeightFormat w_format = WeightFormat::kF32;
  std::int32_t ldy = 0;  // row stride of y; 0: out
  // Opt-in (QuantProductArgs::int8_x): the in-place K-quant kernels take x
  // rounded to int8 per 32 values. Batches on the blocked path (more than
  // kQuantDirectRows rows, not deterministic) stay f32.
  bool int8_activations = false;
};

// Quantised weights: batches of at most this many rows (and every batch in
// deterministic mode) run the in-place kernels of quant_kernels.h, whose
// rows are independent; larger batches dequantise column blocks to f32 and
// go through BLAS (the weights are then read once per block, not per row).
inline constexpr std::int32_t kQuantDirectRows = 8;

// Buffers reused across calls: the zero-padded last row block of x, one
// output tile per thread and one dequantised weight block per thread.
struct LinearScratch {
  std::vector<float> padded_x;
  std::vector<std::vector<float>> tiles;
  std::vector<std::vector<float>> weight_blocks;
};

// Makes OpenBLAS run single-threaded (its own thread pool would fight the
// OpenMP threads that call it). Cheap; call it before a batch of linear()s.
// A no-op with another BLAS.
void use_single_threaded_blas();
// OpenBLAS's thread count (0 with another BLAS) and its setter (a no-op
// with another BLAS); for tests that play a user who changed it.
int blas_threads();
void set_blas_threads(int threads);

// y (+)= x w^T. With ldy > out, y is a column range of a wider output (a
// fused projection whose parts have different weight formats); the other
// columns are not touched. InvalidArgument when ldy is neither 0 nor >= out.
void linear(const LinearArgs& args, LinearScratch& scratch);

}  // namespace pagedattn::engine
