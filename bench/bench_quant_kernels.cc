// The in-place quantised-weight kernels (src/engine/quant_kernels.h) on one
// thread: Q8_0 / Q4_0 / Q4_1 / Q5_0 / Q5_1 and the K-quants Q4_K / Q5_K / Q6_K, next to
// f32 weights through linear() (BLAS) on one thread, at the shapes of a decode step
// (1 row) and of small batches (4, 8 rows). BM_LayerProducts and
// BM_TeamBarrier alone run on the step's threads: a decode step's products,
// one region each or one for all; a team's barrier, its own or OpenMP's.
//
//   ns/row: time per weight row (one output column), per call.
//   bytes_per_second: weight bytes read per second.
//
// "hot" runs one matrix again and again (576 x 1536 lives in L2/L3 of most
// CPUs, 2048 x 8192 in a large L3); "cold" rotates over copies spanning
// 256 MiB, so the weights stream from memory, next to BM_ReadBandwidth (one
// thread reading 256 MiB) for this machine's bound. The CPU is named in the
// context ("cpu", /proc/cpuinfo's model name, what lscpu prints).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <cstdint>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/huge_page_vector.h"
#include "core/team.h"
#include "engine/dot_tiles.h"
#include "engine/gemm.h"
#include "engine/quant_kernels.h"
#include "pagedattn/dtype.h"

namespace {

using pagedattn::engine::WeightFormat;

int step_threads = 1;  // OMP_NUM_THREADS (all CPUs by default), for BM_LayerProducts

constexpr std::size_t kColdBytes = std::size_t{256} << 20;

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

// `copies` matrices of random quants with small f16 scales, back to back.
std::vector<std::uint8_t> random_matrices(WeightFormat f, std::int32_t out, std::int32_t in,
                                          std::size_t copies) {
  const std::size_t bytes =
      std::size_t(out) * std::size_t(pagedattn::engine::weight_row_bytes(f, in));
  std::vector<std::uint8_t> w(bytes * copies);
  std::mt19937 rng(1);
  for (std::size_t i = 0; i < w.size(); i += 4) {  // 32 random bits at a time
    const std::uint32_t bits = rng();
    std::memcpy(&w[i], &bits, std::min<std::size_t>(4, w.size() - i));
  }
  if (f == WeightFormat::kF32) {
    std::uniform_real_distribution<float> value(-0.05f, 0.05f);
    for (std::size_t i = 0; i < w.size(); i += 4) {
      const float v = value(rng);
      std::memcpy(&w[i], &v, 4);
    }
    return w;
  }
  if (f == WeightFormat::kF16) {
    std::uniform_real_distribution<float> value(-0.05f, 0.05f);
    for (std::size_t i = 0; i < w.size(); i += 2) {
      const std::uint16_t v = pagedattn::float_to_f16_bits(value(rng));
      std::memcpy(&w[i], &v, 2);
    }
    return w;
  }
  const std::uint16_t scale = pagedattn::float_to_f16_bits(0.01f);
  const std::size_t block = std::size_t(pagedattn::engine::weight_block_bytes(f));
  for (std::size_t at = 0; at < w.size(); at += block) {
    const std::size_t d = f == WeightFormat::kQ6_K ? 208 : 0;
    std::memcpy(&w[at + d], &scale, 2);
    if (f == WeightFormat::kQ4_1 || f == WeightFormat::kQ5_1 || f == WeightFormat::kQ4_K ||
        f == WeightFormat::kQ5_K)
      std::memcpy(&w[at + 2], &scale, 2);
  }
  return w;
}

// Args: out, in, rows, cold (0 hot, 1 cold, 2 cold on huge pages: the
// copies in a core::HugePageVector, as the model keeps its weights), int8
// (0 / 1: QuantProductArgs::int8_x; x86 AVX2 and up).
void BM_QuantProduct(benchmark::State& state, WeightFormat f) {
  const auto out = static_cast<std::int32_t>(state.range(0));
  const auto in = static_cast<std::int32_t>(state.range(1));
  const auto rows = static_cast<std::int32_t>(state.range(2));
  const bool cold = state.range(3) != 0, int8 = state.range(4) != 0;
  const std::size_t bytes =
      std::size_t(out) * std::size_t(pagedattn::engine::weight_row_bytes(f, in));
  const std::size_t copies = cold ? (kColdBytes + bytes - 1) / bytes : 1;
  const auto w = random_matrices(f, out, in, copies);
  const bool huge_pages = state.range(3) == 2;
  pagedattn::core::HugePageVector<std::uint8_t> on_huge_pages;
  if (huge_pages) on_huge_pages.assign(w.begin(), w.end());
  const std::uint8_t* weights = huge_pages ? on_huge_pages.data() : w.data();
  std::vector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  pagedattn::engine::use_single_threaded_blas();
  pagedattn::engine::LinearScratch scratch;
  std::size_t copy = 0;
  for (auto _ : state) {
    const std::uint8_t* m = weights + copy * bytes;
    if (f == WeightFormat::kF32)
      pagedattn::engine::linear({x.data(), rows, in, m, out, y.data(), false, false, f}, scratch);
    else
      pagedattn::engine::quant_product({x.data(), rows, in, m, f, y.data(), out, false, int8}, 0,
                                       out);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
    copy = copy + 1 == copies ? 0 : copy + 1;
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(bytes));
  state.counters["ns/row"] =
      benchmark::Counter(double(out) * 1e-9, benchmark::Counter::kIsIterationInvariantRate |
                                                 benchmark::Counter::kInvert);
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) + (cold ? " cold" : " hot") +
                 (huge_pages ? " huge pages" : "") + (int8 ? " int8 x" : ""));
}

// One thread reading kColdBytes: the bound of the cold cases.
void BM_ReadBandwidth(benchmark::State& state) {
  std::vector<std::uint64_t> buffer(kColdBytes / 8, 1);
  for (auto _ : state) {
    std::uint64_t sum = 0;
    for (const std::uint64_t v : buffer) sum += v;
    benchmark::DoNotOptimize(sum);
  }
  state.SetBytesProcessed(std::int64_t(state.iterations()) * std::int64_t(kColdBytes));
}
BENCHMARK(BM_ReadBandwidth)->Unit(benchmark::kMillisecond);

// lm_head: SmolLM2's LM head, 576 inputs, which no K-quant row can hold.
void AddShapes(benchmark::internal::Benchmark* b, std::int64_t int8, bool lm_head) {
  b->ArgNames({"out", "in", "rows", "cold", "int8"});
  for (const std::int64_t rows : {1, 4, 8}) b->Args({576, 1536, rows, 0, int8});
  for (const std::int64_t rows : {1, 4}) b->Args({2048, 8192, rows, 0, int8});
  for (const std::int64_t cold : {1, 2}) {
    b->Args({2048, 8192, 1, cold, int8});
    b->Args({8192, 2048, 1, cold, int8});
    if (lm_head) b->Args({49152, 576, 1, cold, int8});  // short rows, streamed
  }
  b->Unit(benchmark::kMicrosecond);
}
void Shapes(benchmark::internal::Benchmark* b) {
  AddShapes(b, 0, true);
}
void Int8Shapes(benchmark::internal::Benchmark* b) {
  AddShapes(b, 0, true);
  AddShapes(b, 1, true);
}
void KQuantShapes(benchmark::internal::Benchmark* b) {
  AddShapes(b, 0, false);
  AddShapes(b, 1, false);
}

// Batches, one thread, us per product. Args: out, in, rows, path: 0
// linear() on f32 x (dot_tiles up to kDotTileRows rows, then dequantise +
// BLAS), 1 the in-place kernels on int8 x (kInt8DirectRows keeps them to 8
// rows in linear()), 2 linear() with bf16_batches (dot_tiles on bf16 where
// the CPU has AVX512-BF16; skipped elsewhere); 3 the in-place kernels and 4
// dot_tiles, both on f32 x, for the few rows where linear() chooses between
// them (quant_batch_in_place); 5 linear() on int8 x (Activations::kInt8:
// the in-place int8 kernels up to kInt8DirectRows, the int8 tiles above
// where the CPU has them, int8_tiles(); skipped elsewhere), 6 the int8 tiles
// themselves, for the few rows where linear() chooses between them and the
// in-place int8 kernels (path 1).
void BM_Batch(benchmark::State& state, WeightFormat f) {
  const auto out = static_cast<std::int32_t>(state.range(0));
  const auto in = static_cast<std::int32_t>(state.range(1));
  const auto rows = static_cast<std::int32_t>(state.range(2));
  const auto path = state.range(3);
  if (path == 2 && !pagedattn::engine::dot_tiles_bf16_available())
    return state.SkipWithError("no AVX512-BF16 here");
  if ((path == 5 || path == 6) && !pagedattn::engine::dot_tiles_int8_available())
    return state.SkipWithError("no int8 tiles here");
  const auto w = random_matrices(f, out, in, 1);
  // On cache lines, as the model's activations are (a vector's rows of
  // 2,048 floats would each start 16 bytes into a line).
  pagedattn::core::CacheLineVector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  pagedattn::engine::use_single_threaded_blas();
  pagedattn::engine::LinearScratch scratch;
  pagedattn::core::CacheLineVector<float> tiles;
  pagedattn::engine::LinearArgs args{x.data(), rows, in, w.data(), out, y.data(), false, false, f};
  args.bf16_batches = path == 2;
  if (path == 5) args.activations = pagedattn::engine::Activations::kInt8;
  for (auto _ : state) {
    if (path == 3)
      pagedattn::engine::quant_product(
          {x.data(), rows, in, w.data(), f, y.data(), out, false, false}, 0, out);
    else if (path == 4 || path == 6)
      pagedattn::engine::dot_tiles(
          {x.data(), rows, in, w.data(), f, y.data(), out, false, false, path == 6}, 0, out, tiles);
    else if (path == 1)
      pagedattn::engine::quant_product(
          {x.data(), rows, in, w.data(), f, y.data(), out, false, true}, 0, out);
    else
      pagedattn::engine::linear(args, scratch);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["us/row"] =
      benchmark::Counter(double(rows) * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                  benchmark::Counter::kInvert);
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * out * in * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  static const char* const kPaths[] = {" linear f32 x",    " in place int8 x", " linear bf16",
                                       " in place f32 x",  " dot_tiles f32 x", " linear int8 x",
                                       " dot_tiles int8 x"};
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) + kPaths[path]);
}

// The int8 tiles of one kind (Int8Tiles: 1 AVX2, 2 AVX-VNNI, 3
// AVX512-VNNI, 4 AMX-INT8; skipped where the CPU does not run it), one
// thread, weights in cache: the kinds' multiply rates against each other
// in one run, at decode's and prefill's row counts. Args: out, in, rows,
// kind. The x rows are rounded once beforehand, as a step's norm rounds
// them (LinearArgs::x_int8).
void BM_Int8TileKind(benchmark::State& state, WeightFormat f) {
  const auto out = static_cast<std::int32_t>(state.range(0));
  const auto in = static_cast<std::int32_t>(state.range(1));
  const auto rows = static_cast<std::int32_t>(state.range(2));
  const auto kind = static_cast<pagedattn::engine::Int8Tiles>(state.range(3));
  if (!pagedattn::engine::int8_tiles_runnable(kind))
    return state.SkipWithError("this CPU does not run these int8 tiles");
  const auto w = random_matrices(f, out, in, 1);
  pagedattn::core::CacheLineVector<float> x(std::size_t(rows) * in), y(std::size_t(rows) * out);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  pagedattn::engine::Int8Rows x8;
  x8.resize(rows, in);
  pagedattn::engine::quantize_int8_rows(x.data(), 0, rows, x8);
  pagedattn::engine::DotTilesArgs args{x.data(), rows, in, w.data(), f, y.data(), out, false};
  args.int8 = true;
  args.x_rows = &x8;
  pagedattn::core::CacheLineVector<float> scratch;
  for (auto _ : state) {
    pagedattn::engine::dot_tiles_int8(args, 0, out, scratch, kind);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GOP/s"] = benchmark::Counter(2.0 * rows * out * in * 1e-9,
                                               benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) + " " +
                 pagedattn::engine::int8_tiles_name(kind));
}
// SmolLM2's down projection (576 x 1536) and Llama 3.2 1B's (2048 x 8192)
// from a decode step's 2 rows to a prefill chunk's 512, on AVX512-VNNI and
// AMX-INT8.
void TileKindShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "kind"});
  for (const std::int64_t rows : {2, 4, 8, 12, 16, 32, 64, 128, 512})
    for (const auto& [out, in] : {std::pair<std::int64_t, std::int64_t>{576, 1536}, {2048, 8192}})
      for (const pagedattn::engine::Int8Tiles kind :
           {pagedattn::engine::Int8Tiles::kAvx512Vnni, pagedattn::engine::Int8Tiles::kAmxInt8})
        b->Args({out, in, rows, static_cast<std::int64_t>(kind)});
  b->Unit(benchmark::kMicrosecond);
}

// A decode step's layer products on the step's threads (OMP_NUM_THREADS,
// all CPUs by default): SmolLM2-135M's four products per layer (qkv 960 x
// 576, o 576 x 576, gate_up 3072 x 576, down 576 x 1536) over 30 layers of
// their own weights (66 MB of Q4_1, streamed as in a step). Args: rows,
// one_region: 0 a parallel region per product (linear() outside a team), 1
// the 120 in one team (core/team.h, as the model's layers run them: a
// barrier after each product): what opening a region per product costs
// against the barrier that any form needs.
void BM_LayerProducts(benchmark::State& state, WeightFormat f) {
  const auto rows = static_cast<std::int32_t>(state.range(0));
  const bool one_region = state.range(1) != 0;
  struct Shape {
    std::int32_t out, in;
  };
  constexpr Shape kShapes[] = {{960, 576}, {576, 576}, {3072, 576}, {576, 1536}};
  constexpr int kLayers = 30;
  std::vector<std::vector<std::uint8_t>> w;
  std::int64_t bytes = 0;
  for (int layer = 0; layer < kLayers; ++layer)
    for (const Shape& s : kShapes) {
      w.push_back(random_matrices(f, s.out, s.in, 1));
      bytes += std::int64_t(w.back().size());
    }
  std::vector<float> x(std::size_t(rows) * 1536), y(std::size_t(rows) * 3072);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  pagedattn::engine::LinearScratch scratch;
  const auto product = [&](std::size_t m) -> pagedattn::engine::LinearArgs {
    const Shape& s = kShapes[m % 4];
    return {x.data(), rows, s.in, w[m].data(), s.out, y.data(), false, false, f};
  };
  omp_set_num_threads(step_threads);
  if (one_region) pagedattn::engine::size_for_team(scratch);
  for (auto _ : state) {
    pagedattn::core::run_in_team(one_region, [&] {
      for (std::size_t m = 0; m < w.size(); ++m) pagedattn::engine::linear(product(m), scratch);
    });
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["threads"] = step_threads;
  omp_set_num_threads(1);
  state.SetBytesProcessed(std::int64_t(state.iterations()) * bytes);
  state.counters["us/product"] =
      benchmark::Counter(double(w.size()) * 1e-6, benchmark::Counter::kIsIterationInvariantRate |
                                                      benchmark::Counter::kInvert);
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) +
                 (one_region ? " one team" : " a region per product"));
}

// A team's barrier alone, us per piece: 300 pieces (about a SmolLM2 decode
// step's) of one trivial task per thread in one team on the step's threads,
// each a barrier after, with the team's own barrier (own 1,
// core::detail::SpinBarrier) or OpenMP's (own 0).
void BM_TeamBarrier(benchmark::State& state) {
  const bool own = state.range(0) != 0;
  constexpr int kPieces = 300;
  std::vector<pagedattn::core::CacheLineVector<float>> slots{std::size_t(step_threads)};
  for (auto& slot : slots) slot.resize(16);
  omp_set_num_threads(step_threads);
  pagedattn::core::set_team_barrier(own);
  for (auto _ : state) {
    pagedattn::core::run_in_team(true, [&] {
      for (int piece = 0; piece < kPieces; ++piece)
        pagedattn::core::for_each_task(step_threads,
                                       [&](std::int32_t t) { slots[std::size_t(t)][0] += 1.0f; });
    });
  }
  pagedattn::core::set_team_barrier(true);
  omp_set_num_threads(1);
  state.counters["threads"] = step_threads;
  state.counters["us/piece"] = benchmark::Counter(
      kPieces * 1e-6, benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
  state.SetLabel(own ? "own barrier" : "OpenMP's barrier");
}

// The operands of the int8 tile benchmarks below, from their args (out,
// in, rows, threads, a switch): random `f` weights [out][in], x [rows][in]
// in [-1, 1), y, and x's rows rounded once.
struct Int8Operands {
  std::int32_t out, in, rows, threads;
  bool on;  // the benchmark's switch
  std::vector<std::uint8_t> w;
  pagedattn::core::CacheLineVector<float> x, y;
  pagedattn::engine::Int8Rows rounded;
  Int8Operands(const benchmark::State& state, WeightFormat f)
      : out(static_cast<std::int32_t>(state.range(0))),
        in(static_cast<std::int32_t>(state.range(1))),
        rows(static_cast<std::int32_t>(state.range(2))),
        threads(static_cast<std::int32_t>(state.range(3))),
        on(state.range(4) != 0),
        w(random_matrices(f, out, in, 1)),
        x(std::size_t(rows) * std::size_t(in)),
        y(std::size_t(rows) * std::size_t(out)) {
    std::mt19937 rng(2);
    std::uniform_real_distribution<float> value(-1.0f, 1.0f);
    for (auto& v : x) v = value(rng);
    rounded.resize(rows, in);
    pagedattn::engine::quantize_int8_rows(x.data(), 0, rows, rounded);
  }
};

// One thread's share of a product split over `threads` (out / threads
// columns) on the int8 tiles, us per share: the thread rounding every row
// of x itself (once 0: what each thread of the product did until x was
// rounded once for all), or reading rows rounded once (once 1,
// DotTilesArgs::x_rows) plus its 1 / threads of the rounding
// (quantize_int8_rows), as a step's norm splits it. Args: out, in, rows,
// threads, once. On 2 cores it times what one of 16 threads does.
void BM_Int8ThreadShare(benchmark::State& state, WeightFormat f) {
  if (!pagedattn::engine::dot_tiles_int8_available())
    return state.SkipWithError("no int8 tiles here");
  Int8Operands o(state, f);
  const std::int32_t out = o.out, in = o.in, rows = o.rows, threads = o.threads;
  const bool once = o.on;
  pagedattn::core::CacheLineVector<float> tiles;
  pagedattn::engine::DotTilesArgs args{o.x.data(), rows, in, o.w.data(), f, o.y.data(), out, false};
  args.int8 = true;
  if (once) args.x_rows = &o.rounded;
  const std::int32_t share = out / threads / 4 * 4, my_rows = (rows + threads - 1) / threads;
  for (auto _ : state) {
    if (once)
      pagedattn::engine::quantize_int8_rows(o.x.data(), 0, std::min(my_rows, rows), o.rounded);
    pagedattn::engine::dot_tiles(args, 0, share, tiles);
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) +
                 (once ? " x rounded once" : " x rounded by the thread"));
}

// What the busiest of `threads` threads does in an int8 product on the
// tiles, us, x rounded once (as a step's norm rounds it): the split into
// column ranges of 4-column granules that linear() made until the tiles'
// groups were split whole (cut 0: a 16th of 576 columns is 36, two groups
// and a 4-column one that costs a whole group), or split_groups() (cut 1:
// whole groups, the left-over groups' rows cut between threads). On one
// core it times one thread's share of a many-core step. Args: out, in,
// rows, threads, cut.
void BM_Int8BusiestThread(benchmark::State& state, WeightFormat f) {
  using pagedattn::engine::IndexRange;
  if (!pagedattn::engine::dot_tiles_int8_available())
    return state.SkipWithError("no int8 tiles here");
  Int8Operands o(state, f);
  const std::int32_t out = o.out, in = o.in, rows = o.rows, threads = o.threads;
  const bool cut = o.on;
  pagedattn::engine::DotTilesArgs args{nullptr, rows, in, o.w.data(), f, o.y.data(), out, false};
  args.int8 = true;
  args.x_rows = &o.rounded;
  const std::int32_t group =
      pagedattn::engine::int8_tile_group_columns(pagedattn::engine::int8_tiles());
  // The busiest thread's pieces: (columns, first row, rows).
  struct Piece {
    IndexRange columns;
    std::int32_t first, rows;
  };
  std::vector<Piece> busiest;
  if (cut) {
    const auto split = pagedattn::engine::split_groups(out, rows, threads, group);
    busiest.push_back({split.columns(0), 0, rows});
    const auto tail = split.tail(0);
    if (!tail.empty())
      busiest.push_back({tail.columns, tail.rows.begin, tail.rows.end - tail.rows.begin});
  } else {  // the widest part, cut into chunks of whole groups from its start
    const auto split = pagedattn::engine::split_columns(out, threads);
    IndexRange widest;
    for (std::int32_t t = 0; t < split.column_parts; ++t) {
      const IndexRange p =
          pagedattn::engine::part_range(out, split.column_parts, t, split.column_granule);
      if ((p.end - p.begin + group - 1) / group > (widest.end - widest.begin + group - 1) / group)
        widest = p;
    }
    busiest.push_back({widest, 0, rows});
  }
  pagedattn::core::CacheLineVector<float> tiles;
  for (auto _ : state) {
    for (const Piece& p : busiest) {
      pagedattn::engine::DotTilesArgs part = args;
      part.rows = p.rows;
      part.x_rows_first = p.first;
      part.y = o.y.data() + std::size_t(p.first) * out;
      pagedattn::engine::dot_tiles(part, p.columns.begin, p.columns.end, tiles);
    }
    benchmark::DoNotOptimize(o.y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) +
                 (cut ? " whole groups, left-over rows cut" : " 4-column granules"));
}

// What one thread of `threads` does in a SmolLM2 layer's four int8
// products (q/k/v 960 x 576, o 576 x 576, gate/up 3,072 x 576, down 576 x
// 1,536) as linear() splits and chunks them in a team (split_groups, then
// kChunksPerPart chunks of whole groups and the left-over rows), us per
// layer, x rounded once, the weights cold: each iteration the next of
// enough copies of the layer to span kColdBytes. next 1: each chunk asks for
// the first group of the thread's next chunk while its last group computes
// (DotTilesArgs::next_first); 0: not. Args: rows, threads, next.
void BM_Int8LayerShare(benchmark::State& state, WeightFormat f) {
  using pagedattn::engine::IndexRange;
  if (!pagedattn::engine::dot_tiles_int8_available())
    return state.SkipWithError("no int8 tiles here");
  const auto rows = static_cast<std::int32_t>(state.range(0));
  const auto threads = static_cast<std::int32_t>(state.range(1));
  const bool next = state.range(2) != 0;
  struct Product {
    std::int32_t out, in;
    std::size_t bytes;  // one copy's
    std::vector<std::uint8_t> w;
  };
  std::vector<Product> products = {
      {960, 576, 0, {}}, {576, 576, 0, {}}, {3072, 576, 0, {}}, {576, 1536, 0, {}}};
  std::size_t layer_bytes = 0;
  for (Product& p : products) {
    p.bytes = std::size_t(p.out) * std::size_t(pagedattn::engine::weight_row_bytes(f, p.in));
    layer_bytes += p.bytes;
  }
  const std::size_t copies = (kColdBytes + layer_bytes - 1) / layer_bytes;
  for (Product& p : products) p.w = random_matrices(f, p.out, p.in, copies);
  pagedattn::core::CacheLineVector<float> x(std::size_t(rows) * 1536), y(std::size_t(rows) * 3072);
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& v : x) v = value(rng);
  pagedattn::engine::Int8Rows rounded576, rounded1536;
  rounded576.resize(rows, 576);
  rounded1536.resize(rows, 1536);
  pagedattn::engine::quantize_int8_rows(x.data(), 0, rows, rounded576);
  pagedattn::engine::quantize_int8_rows(x.data(), 0, rows, rounded1536);
  const std::int32_t group =
      pagedattn::engine::int8_tile_group_columns(pagedattn::engine::int8_tiles());
  pagedattn::core::CacheLineVector<float> tiles;
  std::size_t copy = 0;
  const auto pieces_of = [&](const Product& p) {
    const auto split = pagedattn::engine::split_groups(p.out, rows, threads, group);
    std::vector<pagedattn::engine::GroupSplit::Piece> pieces;
    for (std::int32_t c = 0; c < pagedattn::engine::kChunksPerPart; ++c)
      pieces.push_back({pagedattn::engine::chunk_range(
                            split.columns(0), pagedattn::engine::kChunksPerPart, c, split.group),
                        {0, rows}});
    pieces.push_back(split.tail(0));
    std::erase_if(pieces, [](const auto& piece) { return piece.empty(); });
    return pieces;
  };
  for (auto _ : state) {
    for (const Product& p : products) {
      pagedattn::engine::DotTilesArgs args{nullptr, rows,     p.in,  p.w.data() + copy * p.bytes,
                                           f,       y.data(), p.out, false};
      args.int8 = true;
      args.x_rows = p.in == 576 ? &rounded576 : &rounded1536;
      const auto pieces = pieces_of(p);
      for (std::size_t i = 0; i < pieces.size(); ++i) {
        pagedattn::engine::DotTilesArgs part = args;
        const auto& piece = pieces[i];
        part.rows = piece.rows.end - piece.rows.begin;
        part.x_rows_first = piece.rows.begin;
        part.y = y.data() + std::size_t(piece.rows.begin) * p.out;
        if (next && i + 1 < pieces.size()) {
          part.next_first = pieces[i + 1].columns.begin;
          part.next_count = pieces[i + 1].columns.end - pieces[i + 1].columns.begin;
        }
        pagedattn::engine::dot_tiles(part, piece.columns.begin, piece.columns.end, tiles);
      }
    }
    copy = (copy + 1) % copies;
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.SetLabel(std::string(pagedattn::engine::weight_format_name(f)) +
                 (next ? " next chunk's first group asked for" : " not asked for"));
}

void LayerShareShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"rows", "threads", "next"});
  for (const std::int64_t threads : {2, 16})
    for (const std::int64_t rows : {12, 32})
      for (const std::int64_t next : {0, 1}) b->Args({rows, threads, next});
  b->Unit(benchmark::kMicrosecond);
}

// SmolLM2's o (576 x 576) and down (576 x 1536) products, whose 36 groups
// of 16 columns leave 4 over at 8, 16 and 32 threads.
void BusiestThreadShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "threads", "cut"});
  for (const std::int64_t threads : {8, 16, 32})
    for (const std::int64_t rows : {4, 12, 32})
      for (const std::int64_t in : {576, 1536})
        for (const std::int64_t cut : {0, 1}) b->Args({576, in, rows, threads, cut});
  b->Unit(benchmark::kMicrosecond);
}

// SmolLM2's layer products at 32 and 64 rows: a 16th of their columns.
void ThreadShareShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "threads", "once"});
  // 12 rows: the alpaca-like workload's mean decode step (64 requests).
  for (const std::int64_t rows : {12, 32, 64})
    for (const std::int64_t once : {0, 1}) {
      b->Args({960, 576, rows, 16, once});   // q, k, v
      b->Args({576, 576, rows, 16, once});   // o
      b->Args({3072, 576, rows, 16, once});  // gate, up
      b->Args({576, 1536, rows, 16, once});  // down
    }
  b->Unit(benchmark::kMicrosecond);
}

// SmolLM2's down projection (576 x 1536) and, for the 32-weight formats
// (the K-quants need whole 256-weight rows), its gate and up (1536 x 576).
void AddBatchShapes(benchmark::internal::Benchmark* b, bool k_quant) {
  b->ArgNames({"out", "in", "rows", "path"});
  const auto add = [&](std::int64_t rows, std::int64_t path) {
    b->Args({576, 1536, rows, path});
    if (!k_quant) b->Args({1536, 576, rows, path});
  };
  for (const std::int64_t rows : {1, 2, 3, 4, 5, 6, 8})
    for (const std::int64_t path : {3, 4, 1, 6}) add(rows, path);
  for (const std::int64_t rows : {16, 32, 64, 128})
    for (const std::int64_t path : {0, 1, 2, 5}) add(rows, path);
  // Prefill chunks; the in-place kernels never take one.
  for (const std::int64_t rows : {256, 512})
    for (const std::int64_t path : {0, 2}) add(rows, path);
  for (const std::int64_t path : {0, 2, 4, 5}) add(2048, path);
  for (const std::int64_t rows : {64, 128}) add(rows, 4);
  b->Unit(benchmark::kMicrosecond);
}
void BatchShapes(benchmark::internal::Benchmark* b) {
  AddBatchShapes(b, false);
  // SmolLM2's tied LM head (its Q8_0 embedding) at 32 rows: weights streamed.
  for (const std::int64_t path : {0, 5}) b->Args({49152, 576, 32, path});
}
void KBatchShapes(benchmark::internal::Benchmark* b) {
  AddBatchShapes(b, true);
  // An LM head in Q6_K (a Q4_K_M file's output.weight: SmolLM2's vocabulary,
  // a 2,048-wide model) at 32 rows: weights streamed from memory once.
  for (const std::int64_t path : {0, 2, 5}) b->Args({49152, 2048, 32, path});
}

// Float weights (f32: the presets, F32 GGUF tensors; f16: F16 GGUF tensors)
// in decode's batches: the in-place kernels (path 3) against dot_tiles (4)
// at 1-8 rows, linear() (0) against dot_tiles at 9-64, on Llama 3.2 1B's
// attention, fused gate|up and down shapes.
void FloatBatchShapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "path"});
  const auto add = [&](std::int64_t rows, std::int64_t path) {
    b->Args({2048, 2048, rows, path});
    b->Args({16384, 2048, rows, path});
    b->Args({2048, 8192, rows, path});
  };
  for (const std::int64_t rows : {1, 2, 3, 4, 6, 8})
    for (const std::int64_t path : {3, 4}) add(rows, path);
  for (const std::int64_t rows : {9, 16, 32, 64})
    for (const std::int64_t path : {0, 4}) add(rows, path);
  b->Unit(benchmark::kMillisecond);
}
BENCHMARK_CAPTURE(BM_QuantProduct, f32, WeightFormat::kF32)->Apply(Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q8_0, WeightFormat::kQ8_0)->Apply(Int8Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q4_0, WeightFormat::kQ4_0)->Apply(Int8Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q4_1, WeightFormat::kQ4_1)->Apply(Int8Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q5_0, WeightFormat::kQ5_0)->Apply(Int8Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q5_1, WeightFormat::kQ5_1)->Apply(Int8Shapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q4_k, WeightFormat::kQ4_K)->Apply(KQuantShapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q5_k, WeightFormat::kQ5_K)->Apply(KQuantShapes);
BENCHMARK_CAPTURE(BM_QuantProduct, q6_k, WeightFormat::kQ6_K)->Apply(KQuantShapes);
BENCHMARK_CAPTURE(BM_LayerProducts, q4_1, WeightFormat::kQ4_1)
    ->ArgNames({"rows", "one_region"})
    ->ArgsProduct({{1, 2, 4, 16, 32}, {0, 1}})
    ->Unit(benchmark::kMillisecond);
BENCHMARK(BM_TeamBarrier)->ArgName("own")->Arg(0)->Arg(1)->Unit(benchmark::kMicrosecond);
BENCHMARK_CAPTURE(BM_Int8ThreadShare, q4_1, WeightFormat::kQ4_1)->Apply(ThreadShareShapes);
BENCHMARK_CAPTURE(BM_Int8ThreadShare, q5_0, WeightFormat::kQ5_0)->Apply(ThreadShareShapes);
BENCHMARK_CAPTURE(BM_Int8BusiestThread, q4_1, WeightFormat::kQ4_1)->Apply(BusiestThreadShapes);
BENCHMARK_CAPTURE(BM_Int8LayerShare, q4_1, WeightFormat::kQ4_1)->Apply(LayerShareShapes);
BENCHMARK_CAPTURE(BM_Int8LayerShare, q5_0, WeightFormat::kQ5_0)->Apply(LayerShareShapes);
BENCHMARK_CAPTURE(BM_Int8BusiestThread, q5_0, WeightFormat::kQ5_0)->Apply(BusiestThreadShapes);
BENCHMARK_CAPTURE(BM_Int8TileKind, q4_1, WeightFormat::kQ4_1)->Apply(TileKindShapes);
BENCHMARK_CAPTURE(BM_Int8TileKind, q5_0, WeightFormat::kQ5_0)->Apply(TileKindShapes);
BENCHMARK_CAPTURE(BM_Int8TileKind, q8_0, WeightFormat::kQ8_0)->Apply(TileKindShapes);
BENCHMARK_CAPTURE(BM_Int8TileKind, q4_k, WeightFormat::kQ4_K)->Apply(TileKindShapes);
BENCHMARK_CAPTURE(BM_Int8TileKind, q6_k, WeightFormat::kQ6_K)->Apply(TileKindShapes);
BENCHMARK_CAPTURE(BM_Batch, f32, WeightFormat::kF32)->Apply(FloatBatchShapes);
BENCHMARK_CAPTURE(BM_Batch, f16, WeightFormat::kF16)->Apply(FloatBatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q8_0, WeightFormat::kQ8_0)->Apply(BatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q5_0, WeightFormat::kQ5_0)->Apply(BatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q4_0, WeightFormat::kQ4_0)->Apply(BatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q4_1, WeightFormat::kQ4_1)->Apply(BatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q4_k, WeightFormat::kQ4_K)->Apply(KBatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q5_k, WeightFormat::kQ5_K)->Apply(KBatchShapes);
BENCHMARK_CAPTURE(BM_Batch, q6_k, WeightFormat::kQ6_K)->Apply(KBatchShapes);

}  // namespace

int main(int argc, char** argv) {
  step_threads = omp_get_max_threads();
  omp_set_num_threads(1);  // f32 through linear(): one thread, like the quantised kernels
  benchmark::AddCustomContext("cpu", cpu_model());
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
