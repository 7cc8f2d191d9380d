#include "gemm.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "core/env_switch.h"
#include "core/team.h"
#include "engine/dot_tiles.h"
#include "engine/onednn_matmul.h"
#include "kernels/cpu/convert.h"
#include "pagedattn/cpu_features.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"

// OpenBLAS's own controls, weak so that another CBLAS still links (the
// pointers are then null).
extern "C" {
void openblas_set_num_threads(int num_threads) __attribute__((weak));
int openblas_get_num_threads(void) __attribute__((weak));
char* openblas_get_corename(void) __attribute__((weak));
}

namespace pagedattn::engine {
namespace {

const float* f32_weights(const LinearArgs& a) {
  return static_cast<const float*>(a.w);
}

// y[rows][cols] (+)= x[rows][in] w[cols][in]^T with leading dimensions in / ldy.
void sgemm(const LinearArgs& a, const float* x, std::int32_t rows, const float* w,
           std::int32_t cols, float* y, std::int32_t ldy) {
  if (onednn_sgemm(x, rows, a.in, w, cols, y, ldy, a.accumulate)) return;
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

// Inside a team the other threads wait at the product's barrier whether or
// not they take a share, so there the kernels whose results do not depend
// on the split (in place, dot_tiles) split every product: a Q4_K_M file's
// Q6_K attn_v (192 x 576, 90 KB) ran on one thread while the rest waited.
bool others_wait_anyway() {
  return core::in_team();
}

bool worth_threads_quant(const LinearArgs& a) {
  return others_wait_anyway() ||
         std::int64_t{a.out} * weight_row_bytes(a.w_format, a.in) >= kQuantParallelBytes ||
         worth_threads(a);
}

std::int32_t threads_for(const LinearArgs& a) {
  return worth_threads(a) ? core::available_threads() : 1;
}

// LinearScratch::weight_blocks, one per thread, sized before the threads
// start: inside a team they share the vector, so size_for_team sized it.
void size_thread_blocks(LinearScratch& s) {
  if (!core::in_team()) size_for_team(s);
}
core::CacheLineVector<float>& thread_block(LinearScratch& s) {
  return s.weight_blocks[std::size_t(core::worker_index())];
}

// f(block) for `cols` cut at the multiples of `width`: a task that starts on
// a block boundary makes the same BLAS calls as one thread does (so one
// thread per process reproduces the calls of any column range starting on a
// multiple of kColumnBlock: the vocabulary-parallel LM head's f32 weights).
template <typename F>
void for_each_block(IndexRange cols, std::int32_t width, F&& f) {
  for (std::int32_t begin = cols.begin; begin < cols.end;) {
    const std::int32_t end = std::min(cols.end, (begin / width + 1) * width);
    f(IndexRange{begin, end});
    begin = end;
  }
}

// Each task BLAS calls on its rows and columns (a row's result may
// depend on the split: BLAS picks its kernels by shape).
void linear_fast(const LinearArgs& a) {
  const WorkSplit s = split_work(a.rows, a.out, threads_for(a), true);
  core::for_each_task(s.tasks(), [&](std::int32_t t) {
    const IndexRange cols = part_range(a.out, s.column_parts, t % s.column_parts, kColumnGranule);
    const IndexRange rows = part_range(a.rows, s.row_parts, t / s.column_parts, kRowGranule);
    if (rows.begin == rows.end) return;
    for_each_block(cols, kColumnBlock, [&](IndexRange block) {
      sgemm(a, a.x + std::size_t(rows.begin) * a.in, rows.end - rows.begin,
            f32_weights(a) + std::size_t(block.begin) * a.in, block.end - block.begin,
            a.y + std::size_t(rows.begin) * ldy(a) + block.begin, ldy(a));
    });
  });
}

// Quantised weights, few rows: the in-place kernels, one contiguous column
// range per thread (each call quantises x once on the int8 path). A row's
// result does not depend on the range (quant_product), so the split is free.
void linear_quant_direct(const LinearArgs& a, bool int8) {
  const QuantProductArgs q{a.x, a.rows, a.in, a.w, a.w_format, a.y, ldy(a), a.accumulate, int8};
  const int threads = worth_threads_quant(a) ? core::available_threads() : 1;
  const WorkSplit s = split_columns(a.out, threads);
  core::for_each_chunk_shared(s.tasks(), kChunksPerPart, [&](std::int32_t t, std::int32_t c) {
    const IndexRange part = part_range(a.out, s.column_parts, t, s.column_granule);
    const IndexRange cols = chunk_range(part, kChunksPerPart, c, s.column_granule);
    if (cols.begin < cols.end) quant_product(q, cols.begin, cols.end);
  });
}

// Quantised weights, many rows (prefill): each thread's columns dequantised
// into its f32 block, blas_block_columns(in) of them at a time, and one BLAS
// call for every row per block (the weights are read once; the rows stay
// whole so that no two threads dequantise the same block).
void linear_quant_blocked(const LinearArgs& a, LinearScratch& s) {
  const std::int32_t tasks = split_work(a.rows, a.out, threads_for(a), false).tasks();
  const std::int32_t width = blas_block_columns(a.in);
  size_thread_blocks(s);
  core::for_each_task(tasks, [&](std::int32_t t) {
    core::CacheLineVector<float>& w = thread_block(s);
    w.resize(std::size_t(width) * a.in);
    for_each_block(part_range(a.out, tasks, t, kColumnGranule), width, [&](IndexRange block) {
      const std::int32_t count = block.end - block.begin;
      dequantize_weight_rows(a.w, a.w_format, a.in, block.begin, count, w.data());
      sgemm(a, a.x, a.rows, w.data(), count, a.y + block.begin, ldy(a));
    });
  });
}

// Quantised weights, a few dozen rows (every batch in deterministic mode),
// or any weights on bf16 products: dot_tiles on one contiguous column range
// per thread (a row's result does not depend on the range).
// dot_tiles splits at a quarter of kParallelWork: its threads need no BLAS
// set-up, and a decode step's K and V projections (32 rows x 192 x 576)
// fall just below kParallelWork, which left the other threads waiting
// through them. Quantised weights of a few hundred kilobytes split whatever
// the rows, as in linear_quant_direct: one row is bound by reading them.
constexpr std::int64_t kTileParallelWork = kParallelWork / 4;

// d's columns `cols`, with the first of `next` (the columns the thread
// runs after them, if empty none) asked for while their last group computes
// (DotTilesArgs::next_first).
void dot_tiles_then(const DotTilesArgs& d, IndexRange cols, IndexRange next,
                    core::CacheLineVector<float>& scratch) {
  DotTilesArgs part = d;
  part.next_first = next.begin;
  part.next_count = next.end - next.begin;
  dot_tiles(part, cols.begin, cols.end, scratch);
}

// dot_tiles on rows [rows.begin, rows.end) of d alone, then `next`.
void dot_tiles_rows(const DotTilesArgs& d, GroupSplit::Piece piece, IndexRange next,
                    core::CacheLineVector<float>& scratch) {
  DotTilesArgs part = d;
  const auto first = std::size_t(piece.rows.begin);
  if (part.x != nullptr) part.x += first * std::size_t(d.in);
  part.y += first * std::size_t(d.ldy);
  part.rows = piece.rows.end - piece.rows.begin;
  part.x_rows_first += piece.rows.begin;
  dot_tiles_then(part, piece.columns, next, scratch);
}

// The columns of the first non-empty chunk after `chunk` of those
// chunk_of(c) gives for c < chunks; empty if none. A thread runs its own
// part's chunks in order, unless another took them first.
template <typename ChunkOf>
IndexRange next_chunk(std::int32_t chunk, std::int32_t chunks, const ChunkOf& chunk_of) {
  for (std::int32_t c = chunk + 1; c < chunks; ++c) {
    const IndexRange cols = chunk_of(c);
    if (cols.begin < cols.end) return cols;
  }
  return {};
}

void linear_tiled(const LinearArgs& a, LinearScratch& s, bool bf16, bool int8 = false) {
  const DotTilesArgs d{a.x,
                       a.rows,
                       a.in,
                       a.w,
                       a.w_format,
                       a.y,
                       ldy(a),
                       a.accumulate,
                       bf16,
                       int8,
                       int8 ? a.x_int8 : nullptr};
  const bool worth = others_wait_anyway() ||
                     std::int64_t{a.rows} * a.out * a.in >= kTileParallelWork ||
                     (a.w_format != WeightFormat::kF32 && worth_threads_quant(a));
  const int threads = worth ? core::available_threads() : 1;
  size_thread_blocks(s);
  if (int8) {  // whole groups of the tiles' 16 or 8 columns, left-over rows cut
    const GroupSplit split =
        split_groups(a.out, a.rows, threads, int8_tile_group_columns(int8_tiles()));
    const auto piece_of = [&](std::int32_t t, std::int32_t c) {
      return c < kChunksPerPart
                 ? GroupSplit::Piece{chunk_range(split.columns(t), kChunksPerPart, c, split.group),
                                     {0, a.rows}}
                 : split.tail(t);
    };
    core::for_each_chunk_shared(
        split.threads, kChunksPerPart + 1, [&](std::int32_t t, std::int32_t c) {
          const GroupSplit::Piece piece = piece_of(t, c);
          if (piece.empty()) return;
          const IndexRange next = next_chunk(c, kChunksPerPart + 1, [&](std::int32_t n) {
            const GroupSplit::Piece p = piece_of(t, n);
            return p.empty() ? IndexRange{} : p.columns;
          });
          dot_tiles_rows(d, piece, next, thread_block(s));
        });
    return;
  }
  const WorkSplit split = split_columns(a.out, threads);
  // Chunks in whole register tiles of 16 columns (f32 and bf16).
  core::for_each_chunk_shared(split.tasks(), kChunksPerPart, [&](std::int32_t t, std::int32_t c) {
    const IndexRange part = part_range(a.out, split.column_parts, t, split.column_granule);
    const auto chunk_of = [&](std::int32_t n) {
      return chunk_range(part, kChunksPerPart, n, kColumnGranule);
    };
    const IndexRange cols = chunk_of(c);
    if (cols.begin < cols.end)
      dot_tiles_then(d, cols, next_chunk(c, kChunksPerPart, chunk_of), thread_block(s));
  });
}

// Batches on bf16 products where oneDNN has bf16 kernels: x rounded to bf16
// once (its rows split over the threads), then each thread's columns a
// block at a time, one oneDNN bf16 matmul per block. A block oneDNN makes
// no primitive for runs dot_tiles, on the same bf16 roundings.
void round_x_to_bf16(const LinearArgs& a, std::int32_t tasks, LinearScratch& s) {
  core::on_one_thread([&] { s.x_bf16.resize(std::size_t(a.rows) * a.in); });
  core::for_each_task(tasks, [&](std::int32_t t) {
    const IndexRange rows = part_range(a.rows, tasks, t, 1);
    kernels::convert_row(a.x + std::size_t(rows.begin) * a.in, DType::kF32,
                         s.x_bf16.data() + std::size_t(rows.begin) * a.in, DType::kBF16,
                         std::int64_t(rows.end - rows.begin) * a.in, 1.0f);
  });
}

// Weight rows (columns of y) [block.begin, block.end) as bf16 bits: BF16
// weights in place; the others dequantised (f32: read) kBf16RoundRows rows
// at a time into `f32` and rounded into `rounded`.
constexpr std::int32_t kBf16RoundRows = 16;

const std::uint16_t* bf16_weight_block(const LinearArgs& a, IndexRange block,
                                       core::CacheLineVector<float>& f32,
                                       core::CacheLineVector<std::uint16_t>& rounded) {
  if (a.w_format == WeightFormat::kBF16)
    return static_cast<const std::uint16_t*>(a.w) + std::size_t(block.begin) * a.in;
  rounded.resize(std::size_t(block.end - block.begin) * a.in);
  if (a.w_format != WeightFormat::kF32) f32.resize(std::size_t(kBf16RoundRows) * a.in);
  for (std::int32_t row = block.begin; row < block.end; row += kBf16RoundRows) {
    const std::int32_t n = std::min(kBf16RoundRows, block.end - row);
    const float* values = f32_weights(a) + std::size_t(row) * a.in;
    if (a.w_format != WeightFormat::kF32) {
      dequantize_weight_rows(a.w, a.w_format, a.in, row, n, f32.data());
      values = f32.data();
    }
    kernels::convert_row(values, DType::kF32,
                         rounded.data() + std::size_t(row - block.begin) * a.in, DType::kBF16,
                         std::int64_t(n) * a.in, 1.0f);
  }
  return rounded.data();
}

void linear_bf16_blocked(const LinearArgs& a, LinearScratch& s) {
  const bool worth = std::int64_t{a.rows} * a.out * a.in >= kTileParallelWork;
  const std::int32_t tasks =
      split_work(a.rows, a.out, worth ? core::available_threads() : 1, false).tasks();
  const std::int32_t width = blas_block_columns(a.in);
  const DotTilesArgs tiles{a.x, a.rows, a.in,         a.w,  a.w_format,
                           a.y, ldy(a), a.accumulate, true, false};
  size_thread_blocks(s);
  round_x_to_bf16(a, tasks, s);
  core::for_each_task(tasks, [&](std::int32_t t) {
    core::CacheLineVector<float>& f32 = thread_block(s);
    core::CacheLineVector<std::uint16_t>& rounded =
        s.bf16_blocks[std::size_t(core::worker_index())];
    for_each_block(part_range(a.out, tasks, t, kColumnGranule), width, [&](IndexRange block) {
      const std::uint16_t* w = bf16_weight_block(a, block, f32, rounded);
      if (!onednn_bf16_gemm(s.x_bf16.data(), a.rows, a.in, w, block.end - block.begin,
                            a.y + block.begin, ldy(a), a.accumulate))
        dot_tiles(tiles, block.begin, block.end, f32);
    });
  });
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
  core::on_one_thread([&] {
    if (tail == 0) return;  // the last block padded with zero rows
    s.padded_x.assign(std::size_t(kRows) * a.in, 0.0f);
    std::memcpy(s.padded_x.data(), a.x + std::size_t(full_blocks) * kRows * a.in,
                std::size_t(tail) * a.in * sizeof(float));
  });
  size_thread_blocks(s);
  // Each tile's sums are fixed by its place alone, so any split of the tiles
  // over threads (a team's or a region's) gives the same bits.
  const std::int32_t tiles = row_blocks * col_blocks;
  const std::int32_t tasks = tiles > 1 ? std::min(tiles, threads_for(a)) : 1;
  core::for_each_task(tasks, [&](std::int32_t task) {
    core::CacheLineVector<float>& tile = thread_block(s);
    tile.resize(std::size_t(kRows) * kColumnBlock);
    const IndexRange mine = part_range(tiles, tasks, task, 1);
    for (std::int32_t t = mine.begin; t < mine.end; ++t) {
      const std::int32_t block = t / col_blocks, col = t % col_blocks * kColumnBlock;
      const std::int32_t row = block * kRows, rows = std::min(kRows, a.rows - row);
      const std::int32_t cols = std::min(kColumnBlock, a.out - col);
      const float* x = block < full_blocks ? a.x + std::size_t(row) * a.in : s.padded_x.data();
      sgemm_tile(a, x, f32_weights(a) + std::size_t(col) * a.in, cols, tile.data());
      for (std::int32_t r = 0; r < rows; ++r) {
        float* y = a.y + std::size_t(row + r) * ldy(a) + col;
        for (std::int32_t c = 0; c < cols; ++c)
          y[c] = (a.accumulate ? y[c] : 0.0f) + tile[std::size_t(c) * kRows + r];
      }
    }
  });
}

}  // namespace

std::int32_t blas_block_columns(std::int32_t in) {
  const std::int64_t fit = kBlasBlockBytes / (std::int64_t{in} * std::int64_t{sizeof(float)});
  return static_cast<std::int32_t>(
      std::max<std::int64_t>(kColumnBlock, fit / kColumnGranule * kColumnGranule));
}

WorkSplit split_work(std::int32_t rows, std::int32_t out, int threads, bool split_rows) {
  WorkSplit s;
  const std::int32_t granules = (out + kColumnGranule - 1) / kColumnGranule;
  s.column_parts = std::max(1, std::min(threads, granules));
  if (split_rows) {
    const std::int32_t row_granules = (rows + kRowGranule - 1) / kRowGranule;
    s.row_parts = std::max(1, std::min(threads / s.column_parts, row_granules));
  }
  return s;
}

WorkSplit split_columns(std::int32_t out, int threads) {
  WorkSplit best;
  std::int64_t narrowest = std::numeric_limits<std::int64_t>::max();
  for (const std::int32_t granule : {kColumnGranule, kColumnGranule / 2, kColumnGranule / 4}) {
    const std::int64_t units = (std::int64_t{out} + granule - 1) / granule;
    const auto parts = static_cast<std::int32_t>(
        std::max<std::int64_t>(1, std::min<std::int64_t>(threads, units)));
    const std::int64_t widest = (units + parts - 1) / parts * granule;
    if (widest < narrowest) {
      narrowest = widest;
      best.column_parts = parts;
      best.column_granule = granule;
    }
  }
  return best;
}

IndexRange part_range(std::int32_t count, std::int32_t parts, std::int32_t part,
                      std::int32_t granule) {
  const std::int64_t units = (std::int64_t{count} + granule - 1) / granule;
  const auto edge = [&](std::int32_t p) {
    return static_cast<std::int32_t>(std::min<std::int64_t>(count, units * p / parts * granule));
  };
  return {edge(part), edge(part + 1)};
}

GroupSplit split_groups(std::int32_t out, std::int32_t rows, std::int32_t threads,
                        std::int32_t group) {
  require(out >= 0 && rows >= 0 && threads >= 1 && group >= 1, "split_groups: out = ", out,
          ", rows = ", rows, ", threads = ", threads, ", group = ", group, " out of range");
  GroupSplit s{.out = out, .rows = rows, .threads = threads, .group = group};
  s.groups = (out + group - 1) / group;
  s.per_thread = s.groups / threads;
  s.left = s.groups % threads;
  s.rows_cut = s.left > 0 && 2 * s.left <= threads && rows >= 2;
  return s;
}

IndexRange GroupSplit::columns(std::int32_t t) const {
  const auto edge = [&](std::int64_t g) {
    return static_cast<std::int32_t>(std::min<std::int64_t>(out, g * group));
  };
  return {edge(std::int64_t{t} * per_thread), edge(std::int64_t{t + 1} * per_thread)};
}

GroupSplit::Piece GroupSplit::tail(std::int32_t t) const {
  const auto group_columns = [&](std::int32_t i) {
    const std::int32_t first = (per_thread * threads + i) * group;
    return IndexRange{first, std::min(out, first + group)};
  };
  if (!rows_cut) return t < left ? Piece{group_columns(t), {0, rows}} : Piece{};
  // Left-over group i goes to threads [first(i), first(i + 1)).
  const auto first = [&](std::int32_t i) {
    return static_cast<std::int32_t>(std::int64_t{threads} * i / left);
  };
  std::int32_t i = 0;
  while (first(i + 1) <= t) ++i;
  const std::int64_t k = first(i + 1) - first(i), j = t - first(i);
  return {group_columns(i),
          {static_cast<std::int32_t>(rows * j / k), static_cast<std::int32_t>(rows * (j + 1) / k)}};
}

IndexRange chunk_range(IndexRange cols, std::int32_t chunks, std::int32_t chunk,
                       std::int32_t granule) {
  const std::int64_t n = cols.end - cols.begin;
  const std::int64_t per = (n + chunks - 1) / chunks;
  const std::int64_t width = (per + granule - 1) / granule * granule;
  const auto edge = [&](std::int64_t c) {
    return static_cast<std::int32_t>(cols.begin + std::min(n, c * width));
  };
  return {edge(chunk), edge(chunk + 1)};
}

LinearArgs column_range(const LinearArgs& a, IndexRange cols) {
  LinearArgs part = a;
  part.w = static_cast<const std::byte*>(a.w) +
           std::size_t(cols.begin) * std::size_t(weight_row_bytes(a.w_format, a.in));
  part.out = cols.end - cols.begin;
  part.y = a.y + cols.begin;
  part.ldy = ldy(a);
  return part;
}

namespace {
core::EnvSwitch int8_default("PAGEDATTN_INT8_ACTIVATIONS", false);
}  // namespace

bool int8_activations_default() {
  return int8_default.on();
}

void set_int8_activations_default(bool int8) {
  int8_default.set(int8);
}

namespace {
thread_local Activations scoped_activations = Activations::kDefault;
thread_local bool scoped_bf16_batches = false;
}  // namespace

// The innermost ScopedActivations on this thread, else the process default.
Activations default_activations() {
  if (scoped_activations != Activations::kDefault) return scoped_activations;
  return int8_activations_default() ? Activations::kInt8 : Activations::kF32;
}

bool default_bf16_batches() {
  return scoped_bf16_batches;
}

ScopedActivations::ScopedActivations(Activations activations, bool bf16_batches)
    : previous_(scoped_activations), previous_bf16_(scoped_bf16_batches) {
  scoped_activations = activations;
  scoped_bf16_batches = bf16_batches;
}

ScopedActivations::~ScopedActivations() {
  scoped_activations = previous_;
  scoped_bf16_batches = previous_bf16_;
}

int blas_threads() {
  return openblas_get_num_threads ? openblas_get_num_threads() : 0;
}

std::string blas_kernels() {
  const char* name = openblas_get_corename ? openblas_get_corename() : nullptr;
  return name != nullptr ? name : "";
}

std::string blas_core_for(const std::string& kernels, const char* user_choice, bool avx512,
                          bool avx2_fma) {
  if (user_choice != nullptr || kernels != "Prescott") return "";
  if (avx512) return "SkylakeX";
  return avx2_fma ? "Haswell" : "";
}

void set_blas_threads(int threads) {
  if (openblas_set_num_threads) openblas_set_num_threads(threads);
}

void size_for_team(LinearScratch& scratch) {
  scratch.weight_blocks.resize(std::size_t(omp_get_max_threads()));
  scratch.bf16_blocks.resize(std::size_t(omp_get_max_threads()));
}

void use_single_threaded_blas() {
  if (blas_threads() > 1) set_blas_threads(1);
}

namespace {

// Whether a product takes int8 x at all: quantised weights (16-bit weights
// have no int8 kernels: they keep the f32 routes), not deterministic, and
// kInt8 asked for or the default on this thread.
bool int8_chosen(WeightFormat format, bool deterministic, Activations activations) {
  const Activations chosen =
      activations == Activations::kDefault ? default_activations() : activations;
  return !deterministic && chosen == Activations::kInt8 && has_int8_products(format);
}

}  // namespace

bool takes_int8_tiles(std::int32_t rows, WeightFormat format, bool deterministic,
                      Activations activations) {
  const Int8Tiles kind = int8_tiles();
  return int8_chosen(format, deterministic, activations) && kind != Int8Tiles::kNone &&
         !int8_in_place(rows, format, kind) && int8_tiles_take(rows, kind);
}

namespace {

// The routes linear() takes, 2 bits each (Bf16Route), set outside products.
std::uint32_t pack_routes(const Bf16Routes& r) {
  std::uint32_t bits = 0;
  for (std::size_t i = 0; i < r.route.size(); ++i) bits |= std::uint32_t(r.route[i]) << (2 * i);
  return bits;
}
std::atomic<std::uint32_t>& route_bits() {
  static std::atomic<std::uint32_t> bits{pack_routes(fixed_bf16_routes())};
  return bits;
}

// Whether a batch may take bf16 products (Bf16Route's conditions).
bool may_take_bf16(const LinearArgs& a) {
  return !a.deterministic && (a.bf16_batches || default_bf16_batches()) && a.rows >= kBf16MinRows &&
         a.in % kQuantBlock == 0 && dot_tiles_bf16_available();
}

void check_linear_args(const LinearArgs& a) {
  require(a.ldy == 0 || a.ldy >= a.out, "linear: ldy = ", a.ldy,
          " is neither 0 (y's rows are out = ", a.out, " long) nor >= out");
  require(a.x_int8 == nullptr || (a.x_int8->in == a.in && a.x_int8->rows >= a.rows),
          "linear: x_int8 holds ", a.x_int8 ? a.x_int8->rows : 0, " rows of ",
          a.x_int8 ? a.x_int8->in : 0, ", not ", a.rows, " of in = ", a.in);
}

// linear() with the batch's bf16 route decided (kF32 where it may not take bf16).
void linear_routed(const LinearArgs& a, LinearScratch& scratch, Bf16Route route) {
  if (a.rows == 0) return;
  const bool onednn = route == Bf16Route::kOneDnn && onednn_bf16_products();
  const bool tiles = route != Bf16Route::kF32 && !onednn;  // bf16 on dot_tiles
  if (a.w_format != WeightFormat::kF32) {
    if (int8_chosen(a.w_format, a.deterministic, a.activations) &&
        int8_in_place(a.rows, a.w_format, int8_tiles()))
      linear_quant_direct(a, true);
    else if (takes_int8_tiles(a.rows, a.w_format, a.deterministic, a.activations))
      linear_tiled(a, scratch, false, true);
    else if (a.deterministic)  // dot_tiles' bits do not depend on the batch at any size
      linear_tiled(a, scratch, false);
    else if (quant_batch_in_place(a.rows, a.w_format))
      linear_quant_direct(a, false);
    else if (onednn)
      linear_bf16_blocked(a, scratch);
    else if (tiles || a.rows <= kDotTileRows)
      linear_tiled(a, scratch, tiles);
    else
      linear_quant_blocked(a, scratch);
  } else if (a.deterministic) {
    linear_deterministic(a, scratch);
  } else if (a.rows <= kF32DirectRows && a.in % kQuantBlock == 0) {
    linear_quant_direct(a, false);
  } else if (onednn) {
    linear_bf16_blocked(a, scratch);
  } else if (tiles || (a.rows <= kF32TileRows && a.in % kQuantBlock == 0)) {
    linear_tiled(a, scratch, tiles);
  } else {
    linear_fast(a);
  }
}

}  // namespace

const char* bf16_route_name(Bf16Route route) {
  switch (route) {
    case Bf16Route::kTiles:
      return "bf16 tiles";
    case Bf16Route::kOneDnn:
      return "oneDNN bf16";
    case Bf16Route::kF32:
      break;
  }
  return "f32";
}

Bf16Routes fixed_bf16_routes() {
  Bf16Routes r;
  for (std::size_t i = 0; i < r.route.size(); ++i)
    r.route[i] = kBf16RouteRows[i] >= kOneDnnBf16MinRows ? Bf16Route::kOneDnn : Bf16Route::kTiles;
  return r;
}

Bf16Routes bf16_routes() {
  const std::uint32_t bits = route_bits().load(std::memory_order_relaxed);
  Bf16Routes r;
  for (std::size_t i = 0; i < r.route.size(); ++i)
    r.route[i] = static_cast<Bf16Route>((bits >> (2 * i)) & 3u);
  return r;
}

void set_bf16_routes(const Bf16Routes& routes) {
  route_bits().store(pack_routes(routes), std::memory_order_relaxed);
}

Bf16Route bf16_route(std::int32_t rows) {
  const Bf16Routes r = bf16_routes();
  std::size_t i = 0;
  while (i + 1 < kBf16RouteRows.size() && rows >= kBf16RouteRows[i + 1]) ++i;
  return r.route[i];
}

void linear(const LinearArgs& a, LinearScratch& scratch) {
  check_linear_args(a);
  linear_routed(a, scratch, may_take_bf16(a) ? bf16_route(a.rows) : Bf16Route::kF32);
}

void linear_on_bf16_route(const LinearArgs& a, LinearScratch& scratch, Bf16Route route) {
  check_linear_args(a);
  linear_routed(a, scratch, may_take_bf16(a) ? route : Bf16Route::kF32);
}

}  // namespace pagedattn::engine

namespace pagedattn {

std::string blas_core_instead_of_fallback() {
  const CpuFeatures f = cpu_features();
  // OpenBLAS's SkylakeX kernels use AVX512F, BW, DQ and VL.
  return engine::blas_core_for(engine::blas_kernels(), std::getenv("OPENBLAS_CORETYPE"),
                               f.avx512f && f.avx512bw && f.avx512dq && f.avx512vl,
                               f.avx2 && f.fma);
}

}  // namespace pagedattn
