// Matrix products of the built-in model: single-threaded BLAS (cblas_sgemm)
// calls on fixed-shape tiles, spread over OpenMP threads.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/dot_tiles.h"
#include "engine/quant_kernels.h"

namespace pagedattn::engine {

// Deterministic mode with f32 weights (quantised and 16-bit weights: dot_tiles,
// whose rows do not depend on the batch) tiles y into kRowBlock x kColumnBlock pieces, one
// single-threaded BLAS call each, all of the same shape: row blocks start at
// multiples of kRowBlock (the last one padded with zero rows), column blocks
// at multiples of kColumnBlock of the weight's output dimension. Rows are
// the call's m dimension (BLAS's vector lanes, computed alike), and a
// column's place in its call depends only on the model's shape, so an
// output element does not depend on the batch, its row's place in it, or the
// thread count (the tests check this on the machine they run on).
inline constexpr std::int32_t kRowBlock = 16;
inline constexpr std::int32_t kColumnBlock = 128;

// How a product with quantised weights takes its activations.
//   kF32: exact f32 x (up to f32 summation order).
//   kInt8: x rounded to int8 per 32 values (quantize_activations_q8) on
//     integer dot products: dot_tiles' int8 tiles (DotTilesArgs::int8;
//     AVX512-VNNI, AVX-VNNI or AVX2, int8_tiles()) from
//     int8_tile_min_rows() rows where dot_tiles_int8_available(); the
//     in-place kernels' (QuantProductArgs::int8_x) below that or, without
//     the tiles, up to kInt8DirectRows rows, larger batches then running
//     the f32 (or bf16) batch paths (int8_in_place).
//   kDefault: kInt8 when int8_activations_default() is true, else kF32.
// Deterministic mode always runs kF32.
enum class Activations : std::uint8_t { kDefault, kF32, kInt8 };

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
  // Quantised weights, not deterministic: how x enters the product.
  // kDefault follows int8_activations_default().
  Activations activations = Activations::kDefault;
  // Not deterministic, batches of at least kBf16MinRows rows (not those
  // kInt8 takes), `in` a multiple of 32: x and the (dequantised) weights
  // rounded to bf16 on AVX512-BF16 dot products where
  // dot_tiles_bf16_available() (dot_tiles; oneDNN's bf16 matmul from
  // kOneDnnBf16MinRows rows), else f32. Also on when the innermost
  // ScopedActivations asks for it.
  bool bf16_batches = false;
  // Where the batch takes the int8 tiles (takes_int8_tiles): x's rows
  // already rounded (quantize_int8_rows; at least `rows` of `in`), which
  // every thread reads instead of rounding all of them for itself. Ignored
  // on every other path.
  const Int8Rows* x_int8 = nullptr;
};

// Quantised and 16-bit weights: the batches that run the in-place kernels
// of quant_kernels.h, whose rows are independent: one row (quantised) or up
// to kSixteenBitDirectRows (F16 / BF16). Other batches run dot_tiles
// (dot_tiles.h): up to kRegisterRows rows decode the weights in registers
// into one chain per (row, column), as the in-place kernels do but without
// their second decode of the rows left over from a tile of 4, and from 2
// rows (quantised) or 3 (16-bit, which widen in one instruction) they
// measured faster in a decode step (docs/benchmarks.md, "A few rows in
// registers"); the in-place K-quant kernels, which multiply the integer
// quants into x, stay faster at one row. Larger batches dequantise a few
// columns at a time into L1 once per kDotTileRows rows and read x in place,
// where BLAS would pack x again for every column block ("Batched
// products"); batches of more than kDotTileRows dequantise column blocks of
// blas_block_columns(in) to f32 and go through BLAS (the weights are then
// read once per block, not per row). Deterministic mode runs dot_tiles at
// every size: its bits do not depend on the batch either.
inline constexpr std::int32_t kSixteenBitDirectRows = 2;
constexpr bool quant_batch_in_place(std::int32_t rows, WeightFormat format) {
  return rows <= (is_sixteen_bit(format) ? kSixteenBitDirectRows : 1);
}
// bf16_batches takes batches of at least this many rows: smaller ones are
// bound by reading the weights more than by arithmetic.
inline constexpr std::int32_t kBf16MinRows = 9;
// ... and from this many rows (prefill chunks) on oneDNN's bf16 matmul where
// onednn_bf16_products(), on AMX tiles where the CPU has them, unless a
// timing chose otherwise (Bf16Routes): on Zen 4 the weights' rounding into
// oneDNN's blocks costs more below it than its kernel saves over dot_tiles'
// bf16 tiles on AVX512-BF16 (docs/benchmarks.md, "oneDNN's matmul against
// the model's products").
inline constexpr std::int32_t kOneDnnBf16MinRows = 512;

// The route of a batch that may take bf16 products (bf16_batches or the
// scope, at least kBf16MinRows rows, `in` a multiple of 32,
// dot_tiles_bf16_available()): the f32 route (bf16 not worth it there),
// dot_tiles' bf16 tiles, or oneDNN's bf16 matmul (where
// onednn_bf16_products(); else the tiles).
enum class Bf16Route : std::uint8_t { kF32, kTiles, kOneDnn };
const char* bf16_route_name(Bf16Route route);  // "f32", "bf16 tiles", "oneDNN bf16"
// The routes by batch rows: route[i] from kBf16RouteRows[i] rows on, route[0]
// below the first too. What takes the least time depends on the CPU (AMX's
// tiles make oneDNN's matmul the fastest from a few dozen rows; on a Xeon
// the bf16 tiles were slower than f32 at 16-256 rows), so an engine with
// bf16 products times them once (bf16_route_timing, step_activations.h)
// and sets them.
inline constexpr std::array<std::int32_t, 4> kBf16RouteRows = {16, 64, 256, 512};
struct Bf16Routes {
  std::array<Bf16Route, kBf16RouteRows.size()> route{};
  friend bool operator==(const Bf16Routes&, const Bf16Routes&) = default;
};
// The routes before any timing: the tiles below kOneDnnBf16MinRows,
// oneDNN from it.
Bf16Routes fixed_bf16_routes();
// The routes linear() takes now, and their setter (an engine's timing,
// tests; not while a product runs).
Bf16Routes bf16_routes();
void set_bf16_routes(const Bf16Routes& routes);
// The route of a batch of `rows` rows under bf16_routes().
Bf16Route bf16_route(std::int32_t rows);
// F32 weights outside deterministic mode (the presets, F32 GGUF tensors):
// one row (of a multiple of 32 weights) runs the in-place kernel, which
// reads each weight once where BLAS would first copy it into its packed
// layout (as much time as the product itself at a few rows); batches of up
// to kF32TileRows rows run dot_tiles, which reads them in place too; larger
// ones BLAS. The limits are where dot_tiles stops beating the others on
// Llama 3.2 1B's shapes (docs/benchmarks.md, "f32 weights in batches":
// BLAS wins again at 64 rows).
inline constexpr std::int32_t kF32DirectRows = 1;
inline constexpr std::int32_t kF32TileRows = 32;
// Int8 activations without the int8 tiles: batches of at most this many
// rows run the in-place kernels. Alone on a matrix in cache they beat
// dequantise + BLAS to a few dozen rows, but in a whole serving run larger
// batches lost to BLAS (docs/models.md, int8 activations); larger batches
// take the f32 batch paths.
inline constexpr std::int32_t kInt8DirectRows = 8;
// With the int8 tiles of `kind` (outer products, no pass of reductions per
// block): the fewest rows of `format` weights they take, below which the
// in-place int8 kernels run. In a decode step of 2 sequences (weights
// streaming from memory over both threads, docs/benchmarks.md, "Two-row
// int8 batches on the tiles"), the tiles ran SmolLM2's Q4_1 and Q5_0 layers
// faster than the in-place kernels on every kind (VNNI 512- and 256-bit,
// AVX2), its Q8_0 LM head slower: Q8_0, whose in-place kernel does the
// least per byte, starts at 3 rows.
constexpr std::int32_t int8_tile_min_rows(WeightFormat format, Int8Tiles /*kind*/) {
  return format == WeightFormat::kQ8_0 ? 3 : 2;
}
// The most rows the int8 tiles take on AVX2's vpmaddubsw (Int8Tiles::kAvx2,
// three instructions where VNNI takes one): larger batches take the f32
// batch paths, whose dequantise + oneDNN f32 matmul measured faster there
// from about 128 rows (docs/benchmarks.md, "Int8 tiles on AVX2 and
// AVX-VNNI"); the VNNI and AMX tiles take every batch.
inline constexpr std::int32_t kInt8Avx2TileRows = kDotTileRows;
constexpr bool int8_tiles_take(std::int32_t rows, Int8Tiles kind) {
  return kind == Int8Tiles::kAmxInt8 || kind == Int8Tiles::kAvx512Vnni ||
         kind == Int8Tiles::kAvxVnni || (kind == Int8Tiles::kAvx2 && rows <= kInt8Avx2TileRows);
}
// Whether an int8 batch of `rows` against `format` weights runs the
// in-place int8 kernels, given the int8 tiles there are (int8_tiles()).
constexpr bool int8_in_place(std::int32_t rows, WeightFormat format, Int8Tiles kind) {
  return kind == Int8Tiles::kNone ? rows <= kInt8DirectRows
                                  : rows < int8_tile_min_rows(format, kind);
}

// Whether linear() runs a batch of `rows` against `format` weights on the
// int8 tiles, on this thread now (ScopedActivations, the default): where a
// caller may round x once for all threads (LinearArgs::x_int8).
bool takes_int8_tiles(std::int32_t rows, WeightFormat format, bool deterministic,
                      Activations activations = Activations::kDefault);

// kDefault's choice: false (f32 x) unless the environment variable
// PAGEDATTN_INT8_ACTIVATIONS is "1" when first asked, or
// set_int8_activations_default(true) was called. Off by default: on
// SmolLM2-135M's Q4_1 file int8 x moves logits by up to ~4 (top-1 agreement
// with f32 x ~0.9 on text; docs/models.md), which the model tests' 1e-4
// checks of in-place against widened weights do not allow.
bool int8_activations_default();
void set_int8_activations_default(bool int8);

// What kDefault means on this thread now: kInt8 or kF32.
Activations default_activations();

// Whether the innermost ScopedActivations on this thread asks for bf16
// batch products (LinearArgs::bf16_batches); false outside any.
bool default_bf16_batches();

// While it lives, linear() calls on this thread that leave activations at
// kDefault take `activations` when that is not kDefault, and take bf16
// batch products when bf16_batches (a model's forward pass:
// ForwardBatch::int8_activations, ::bf16_products); scopes nest.
class ScopedActivations {
 public:
  explicit ScopedActivations(Activations activations, bool bf16_batches = false);
  ~ScopedActivations();
  ScopedActivations(const ScopedActivations&) = delete;
  ScopedActivations& operator=(const ScopedActivations&) = delete;

 private:
  Activations previous_;
  bool previous_bf16_;
};

// `f` made to run with the calling thread's choice of activations on
// whichever thread calls it: for work handed to other threads (a team, a
// region), which would otherwise take their own thread's defaults, and so
// route one product differently on each.
template <typename F>
auto with_callers_activations(F f) {
  return [activations = default_activations(), bf16 = default_bf16_batches(),
          f = std::move(f)](auto&&... args) {
    const ScopedActivations same(activations, bf16);
    return f(std::forward<decltype(args)>(args)...);
  };
}

// How the products outside deterministic mode share their output between
// threads: column_parts contiguous column ranges, whole multiples of
// kColumnGranule columns as even as those allow, times row_parts row ranges,
// one task per thread. Fixed 128-column blocks would leave most of 16
// threads idle on a 576- or 768-wide output (5 or 6 blocks) and split 576
// columns 384 / 192 between two.
struct WorkSplit {
  std::int32_t column_parts = 1, row_parts = 1;
  std::int32_t column_granule = 16;  // kColumnGranule, or finer (split_columns)
  std::int32_t tasks() const { return column_parts * row_parts; }
};
inline constexpr std::int32_t kColumnGranule = 16;
// Rows are split only when columns run out (fewer column granules than
// threads) and only into ranges of at least this many rows.
inline constexpr std::int32_t kRowGranule = 8;

// A prefill product with quantised weights dequantises this many bytes of
// f32 weights per BLAS call: BLAS packs all of x (a chunk's rows) again in
// every call, so blocks wider than kColumnBlock pack it fewer times
// (docs/benchmarks.md, "Prefill's weight blocks").
inline constexpr std::int64_t kBlasBlockBytes = std::int64_t{4} << 20;
// Columns per such call for `in` inputs: whole kColumnGranules, at least
// kColumnBlock.
std::int32_t blas_block_columns(std::int32_t in);

// The split of a rows x out product over at most `threads` tasks; rows stay
// whole unless split_rows.
WorkSplit split_work(std::int32_t rows, std::int32_t out, int threads, bool split_rows);

// The column split of the kernels that take any column range at the same
// cost per column (the in-place kernels, dot_tiles' f32 and bf16 tiles; the
// int8 tiles, whose partial group costs a whole one, take split_groups):
// whole rows, and the granule of 16, 8 or 4 columns that makes the widest
// part narrowest (the larger on a tie), so that a small model's outputs
// keep many threads even: 576 columns over 16 threads go 36 to each, where
// 16-column granules give parts of 48 and 32 and the widest sets the
// product's time.
WorkSplit split_columns(std::int32_t out, int threads);

// [begin, end) of part `part` of `parts` over `count` items, in whole
// multiples of `granule` (the last part ends at count); empty when there are
// fewer granules than parts.
struct IndexRange {
  std::int32_t begin = 0, end = 0;
};
IndexRange part_range(std::int32_t count, std::int32_t parts, std::int32_t part,
                      std::int32_t granule);

// The int8 tiles' split of a rows x out product over `threads`: whole
// groups of `group` columns (the tiles' width: a range's partial group costs
// a whole one, so a 16th of 576 columns, 36, cost three), per_thread =
// groups / threads consecutive ones to each thread, and the `left` groups
// over. Where they are at most half the threads (SmolLM2's 36 groups of 576
// columns over 16 threads leave 4), each left-over group's rows are cut
// between the floor(threads / left) or more threads that take it, so that
// every thread does per_thread groups and a few rows of one more, not some
// of them a whole group more while the rest wait; else the first `left`
// threads take one whole group each. A column's result does not depend on
// the rows beside it (dot_tiles), so the split changes no bits.
struct GroupSplit {
  struct Piece {
    IndexRange columns, rows;
    bool empty() const { return columns.begin == columns.end || rows.begin == rows.end; }
  };
  std::int32_t out = 0, rows = 0, threads = 1, group = 1;
  std::int32_t groups = 0, per_thread = 0, left = 0;
  bool rows_cut = false;  // the left-over groups' rows cut between threads
  // Thread t's per_thread whole groups (the last may end at out).
  IndexRange columns(std::int32_t t) const;
  // Thread t's share of the left-over groups: one group, all of its rows or
  // (rows_cut) a range of them; empty where t takes none.
  Piece tail(std::int32_t t) const;
};
// InvalidArgument unless out, rows >= 0 and threads, group >= 1.
GroupSplit split_groups(std::int32_t out, std::int32_t rows, std::int32_t threads,
                        std::int32_t group);

// Chunk `chunk` of `chunks` of a thread's column range `cols`: widths in
// whole multiples of `granule` from cols.begin (the kernel's column group,
// so that the chunks make the groups one call would), the last ones shorter
// or empty. A decode product's threads share their ranges' chunks
// (core::for_each_chunk_shared, kChunksPerPart each).
inline constexpr std::int32_t kChunksPerPart = 4;
IndexRange chunk_range(IndexRange cols, std::int32_t chunks, std::int32_t chunk,
                       std::int32_t granule);

// The product of columns [cols.begin, cols.end) of `a`'s output alone: its
// weight rows there and y's columns there (the row stride kept), for one
// thread's share of a product in a core::SoloScope. Deterministic mode gives
// those columns the bits of the whole product when cols.begin is a multiple
// of kColumnBlock (f32 weights' BLAS tiles start there; dot_tiles computes
// a column alike in any range). cols within [0, a.out), not checked.
LinearArgs column_range(const LinearArgs& a, IndexRange cols);

// Buffers reused across calls: the zero-padded last row block of x, and per
// thread a dequantised weight block (or deterministic mode's output tile).
struct LinearScratch {
  std::vector<float> padded_x;
  std::vector<core::CacheLineVector<float>> weight_blocks;  // dot_tiles' groups, BLAS's blocks
  // oneDNN's bf16 products: x, and per thread a block of weights, as bf16 bits.
  core::CacheLineVector<std::uint16_t> x_bf16;
  std::vector<core::CacheLineVector<std::uint16_t>> bf16_blocks;
};

// Sizes `scratch` for linear() calls inside a team (core/team.h) of
// omp_get_max_threads() threads: their threads share it and cannot resize
// it. Call it before the team starts (linear() outside a team sizes it
// itself).
void size_for_team(LinearScratch& scratch);

// Makes OpenBLAS run single-threaded (its own thread pool would fight the
// OpenMP threads that call it). Cheap; call it before a batch of linear()s.
// A no-op with another BLAS.
void use_single_threaded_blas();
// OpenBLAS's thread count (0 with another BLAS) and its setter (a no-op
// with another BLAS); for tests that play a user who changed it.
int blas_threads();
void set_blas_threads(int threads);
// The kernels OpenBLAS chose for this CPU when it loaded (its core name,
// e.g. "Cooperlake"; OPENBLAS_CORETYPE overrides the choice), or "" with
// another BLAS. Batches of more than kDotTileRows rows (prefill) run on
// them: a build older than the CPU may fall back to far slower ones.
std::string blas_kernels();
// pagedattn::blas_core_instead_of_fallback's decision on given facts (for
// tests): `kernels` as blas_kernels() says, `user_choice` the
// OPENBLAS_CORETYPE the user set (null when unset).
std::string blas_core_for(const std::string& kernels, const char* user_choice, bool avx512,
                          bool avx2_fma);

// y (+)= x w^T. With ldy > out, y is a column range of a wider output (a
// fused projection whose parts have different weight formats); the other
// columns are not touched. InvalidArgument when ldy is neither 0 nor >= out.
// Inside a team (core/team.h) every thread of it calls linear() with the
// same arguments, each computes its share, and they meet at a barrier at
// the end; size_for_team(scratch) first, and check ldy before: nothing may
// throw inside a team.
void linear(const LinearArgs& args, LinearScratch& scratch);
// linear() with a batch that may take bf16 products sent down `route`
// whatever bf16_routes() says (the routes' timing).
void linear_on_bf16_route(const LinearArgs& args, LinearScratch& scratch, Bf16Route route);

}  // namespace pagedattn::engine
