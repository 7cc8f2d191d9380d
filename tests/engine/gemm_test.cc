// The model's matrix products: close to a double-precision reference, and in
// deterministic mode bitwise the same for a row whatever its place in the
// batch, the batch size, OpenMP's thread count and OpenBLAS's own.
#include "engine/gemm.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "engine/counter_random.h"
#include "engine/dot_tiles.h"
#include "engine/onednn_matmul.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"

namespace pagedattn::engine {
namespace {

// 6 column blocks, the last one partial; 64 rows are enough work for threads.
constexpr std::int32_t kIn = 96, kOut = 700;

std::vector<float> values(std::size_t count, std::uint64_t stream) {
  std::vector<float> v(count);
  for (std::size_t i = 0; i < count; ++i)
    v[i] = static_cast<float>(2.0 * counter_uniform(7, stream, i) - 1.0);
  return v;
}

// kOut rows of kIn weights as Q8_0 blocks: fixed quants, f16 scale 2^-10.
std::vector<std::uint8_t> q8_weights() {
  std::vector<std::uint8_t> q8(std::size_t(kOut) * (kIn / 32) * 34);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<std::uint8_t>((i * 37) % 251);
  for (std::size_t b = 0; b < q8.size(); b += 34) {
    q8[b] = 0x00;
    q8[b + 1] = 0x14;
  }
  return q8;
}

struct Product {
  std::vector<float> w = values(std::size_t(kOut) * kIn, 1);
  std::vector<float> x = values(std::size_t(64) * kIn, 2);  // row r: x[r]
  std::vector<float> bias = values(std::size_t(64) * kOut, 3);
  std::vector<std::uint8_t> q8 = q8_weights();  // the same shape in Q8_0 blocks
  LinearScratch scratch;

  // Rows [first, first + rows) of x as one batch; y starts at bias when accumulating.
  std::vector<float> run(std::int32_t first, std::int32_t rows, bool accumulate,
                         bool deterministic) {
    std::vector<float> y(bias.begin() + std::size_t(first) * kOut,
                         bias.begin() + std::size_t(first + rows) * kOut);
    linear({x.data() + std::size_t(first) * kIn, rows, kIn, w.data(), kOut, y.data(), accumulate,
            deterministic},
           scratch);
    return y;
  }
};

// OpenBLAS's generic kernels ("Prescott", what a build older than the CPU
// model falls back to) are replaced by the widest ones the CPU runs, unless
// the user chose with OPENBLAS_CORETYPE; any other choice is OpenBLAS's own.
TEST(BlasCore, AFallbackToGenericKernelsAsksForTheCpusOwn) {
  EXPECT_EQ(blas_core_for("Prescott", nullptr, true, true), "SkylakeX");
  EXPECT_EQ(blas_core_for("Prescott", nullptr, false, true), "Haswell");
  EXPECT_EQ(blas_core_for("Prescott", nullptr, false, false), "");
  EXPECT_EQ(blas_core_for("Prescott", "Prescott", true, true), "");
  EXPECT_EQ(blas_core_for("Prescott", "", true, true), "");
  EXPECT_EQ(blas_core_for("Cooperlake", nullptr, true, true), "");
  EXPECT_EQ(blas_core_for("Zen", nullptr, false, true), "");
  EXPECT_EQ(blas_core_for("", nullptr, true, true), "");  // another BLAS
  // This process: OpenBLAS's choice stands unless it is the fallback.
  if (blas_kernels() != "Prescott") {
    EXPECT_EQ(pagedattn::blas_core_instead_of_fallback(), "");
  }
}

TEST(Linear, MatchesADoubleReference) {
  Product p;
  for (const bool deterministic : {false, true})
    for (const bool accumulate : {false, true}) {
      const std::vector<float> y = p.run(0, 37, accumulate, deterministic);
      for (std::int32_t r = 0; r < 37; ++r)
        for (std::int32_t c = 0; c < kOut; ++c) {
          double want = accumulate ? p.bias[std::size_t(r) * kOut + c] : 0.0;
          for (std::int32_t i = 0; i < kIn; ++i)
            want += double(p.x[std::size_t(r) * kIn + i]) * p.w[std::size_t(c) * kIn + i];
          ASSERT_NEAR(y[std::size_t(r) * kOut + c], want, 1e-4) << r << ", " << c;
        }
    }
}

TEST(Linear, DeterministicRowsDoNotDependOnBatchPlaceOrThreads) {
  Product p;
  const int saved_omp = omp_get_max_threads(), saved_blas = blas_threads();
  for (const bool accumulate : {false, true}) {
    omp_set_num_threads(1);
    set_blas_threads(1);
    std::vector<std::vector<float>> alone;  // each row as a batch of one
    for (std::int32_t r = 0; r < 64; ++r) alone.push_back(p.run(r, 1, accumulate, true));
    for (const int omp : {1, 2})
      for (const int blas : {1, 2}) {
        omp_set_num_threads(omp);
        set_blas_threads(blas);
        for (const auto& [first, rows] : {std::pair{0, 64}, {3, 40}, {5, 16}, {9, 17}, {20, 7}}) {
          const std::vector<float> y = p.run(first, rows, accumulate, true);
          for (std::int32_t r = 0; r < rows; ++r)
            ASSERT_EQ(std::memcmp(y.data() + std::size_t(r) * kOut,
                                  alone[std::size_t(first + r)].data(), kOut * sizeof(float)),
                      0)
                << "row " << first + r << " in a batch of " << rows << " from " << first << ", "
                << omp << " OpenMP and " << blas << " BLAS threads, accumulate " << accumulate;
        }
      }
  }
  omp_set_num_threads(saved_omp);
  set_blas_threads(std::max(1, saved_blas));
}

// ldy > out: y is a column range of a wider output. Every path (f32 fast and
// deterministic, quantised direct and blocked) writes exactly columns
// [0, out) of each row, with the values it writes into a y of its own
// (bit for bit: a product's arithmetic does not depend on where it is
// stored), and leaves the other columns alone.
TEST(Linear, LdyWritesAColumnRangeOfAWiderOutput) {
  Product p;
  const std::vector<std::uint8_t>& q8 = p.q8;
  constexpr std::int32_t kLdy = kOut + 13, kOffset = 5;
  for (const WeightFormat f : {WeightFormat::kF32, WeightFormat::kQ8_0})
    for (const bool deterministic : {false, true})
      for (const bool accumulate : {false, true})
        for (const Activations act : {Activations::kF32, Activations::kInt8})
          // quantised: direct (<= 8), int8 direct (<= 32) and blocked
          for (const std::int32_t rows : {1, 3, 20, 37}) {
            const void* w =
                f == WeightFormat::kF32 ? static_cast<const void*>(p.w.data()) : q8.data();
            std::vector<float> own(p.bias.begin(), p.bias.begin() + std::size_t(rows) * kOut);
            LinearArgs own_args{p.x.data(), rows,       kIn,           w, kOut,
                                own.data(), accumulate, deterministic, f};
            own_args.activations = act;
            linear(own_args, p.scratch);
            std::vector<float> wide(std::size_t(rows) * kLdy + kOffset, -3.0f);
            for (std::int32_t r = 0; r < rows; ++r)
              std::copy_n(p.bias.begin() + std::size_t(r) * kOut, kOut,
                          wide.begin() + kOffset + std::size_t(r) * kLdy);
            const std::vector<float> before = wide;
            LinearArgs args{p.x.data(), rows,          kIn, w, kOut, wide.data() + kOffset,
                            accumulate, deterministic, f};
            args.ldy = kLdy;
            args.activations = act;
            linear(args, p.scratch);
            for (std::int32_t r = 0; r < rows; ++r)
              for (std::int32_t c = -kOffset; c < kLdy - kOffset; ++c) {
                const std::size_t at = std::size_t(kOffset + r * kLdy + c);
                if (c >= 0 && c < kOut)
                  ASSERT_EQ(wide[at], own[std::size_t(r) * kOut + c])
                      << weight_format_name(f) << " deterministic " << deterministic << " rows "
                      << rows << " r " << r << " c " << c;
                else
                  ASSERT_EQ(wide[at], before[at]) << "column " << c << " of row " << r;
              }
          }
}

// The split outside deterministic mode: every column and row in exactly one
// task, column ranges in whole granules and as even as those allow, and
// threads kept busy while the output has tiles for them.
TEST(WorkSplit, CoversEveryColumnAndRowOnceAndKeepsThreadsBusy) {
  for (const int threads : {1, 2, 3, 5, 8, 16, 24, 64})
    for (const std::int32_t out : {1, 15, 16, 17, 192, 576, 700, 768, 49152})
      for (const std::int32_t rows : {1, 7, 8, 9, 64, 512})
        for (const bool split_rows : {false, true}) {
          const WorkSplit s = split_work(rows, out, threads, split_rows);
          SCOPED_TRACE(::testing::Message() << threads << " threads, " << rows << " x " << out
                                            << ", split rows " << split_rows);
          ASSERT_GE(s.column_parts, 1);
          ASSERT_GE(s.row_parts, 1);
          ASSERT_LE(s.tasks(), threads);
          if (!split_rows) {
            ASSERT_EQ(s.row_parts, 1);
          }
          std::int32_t next = 0, widest = 0, narrowest = out;
          for (std::int32_t p = 0; p < s.column_parts; ++p) {
            const IndexRange r = part_range(out, s.column_parts, p, kColumnGranule);
            ASSERT_EQ(r.begin, next) << "part " << p;
            ASSERT_LE(r.begin, r.end);
            if (r.end < out) {
              ASSERT_EQ(r.end % kColumnGranule, 0) << "part " << p;
            }
            if (p + 1 < s.column_parts) widest = std::max(widest, r.end - r.begin);
            if (p + 1 < s.column_parts) narrowest = std::min(narrowest, r.end - r.begin);
            next = r.end;
          }
          ASSERT_EQ(next, out);
          if (s.column_parts > 2) {
            ASSERT_LE(widest - narrowest, kColumnGranule);
          }
          next = 0;
          for (std::int32_t p = 0; p < s.row_parts; ++p) {
            const IndexRange r = part_range(rows, s.row_parts, p, kRowGranule);
            ASSERT_EQ(r.begin, next) << "row part " << p;
            next = r.end;
          }
          ASSERT_EQ(next, rows);
          const std::int64_t tiles = std::int64_t{(out + kColumnGranule - 1) / kColumnGranule} *
                                     (split_rows ? (rows + kRowGranule - 1) / kRowGranule : 1);
          EXPECT_GT(2 * s.tasks(), std::min<std::int64_t>(threads, tiles));
        }
}

// The decode kernels' column split: every column in exactly one part, parts
// in whole granules of 16, 8 or 4, no wider than whole 16-column granules
// would make the widest, and even where finer granules allow.
TEST(WorkSplit, ColumnsForTheDecodeKernelsAreAsEvenAsFinerGranulesAllow) {
  for (const int threads : {1, 2, 3, 5, 8, 12, 16, 24, 64})
    for (const std::int32_t out : {1, 4, 15, 16, 17, 48, 192, 576, 700, 960, 1536, 3072, 49152}) {
      SCOPED_TRACE(::testing::Message() << threads << " threads, " << out << " columns");
      const WorkSplit s = split_columns(out, threads);
      const WorkSplit coarse = split_work(1, out, threads, false);
      ASSERT_EQ(s.row_parts, 1);
      ASSERT_GE(s.column_parts, 1);
      ASSERT_LE(s.column_parts, threads);
      ASSERT_TRUE(s.column_granule == 16 || s.column_granule == 8 || s.column_granule == 4);
      const auto widest_of = [&](const WorkSplit& split) {
        std::int32_t next = 0, widest = 0;
        for (std::int32_t p = 0; p < split.column_parts; ++p) {
          const IndexRange r = part_range(out, split.column_parts, p, split.column_granule);
          EXPECT_EQ(r.begin, next) << "part " << p;
          EXPECT_LE(r.begin, r.end);
          if (r.end < out) {
            EXPECT_EQ(r.end % split.column_granule, 0) << "part " << p;
          }
          widest = std::max(widest, r.end - r.begin);
          next = r.end;
        }
        EXPECT_EQ(next, out);
        return widest;
      };
      const std::int32_t widest = widest_of(s);
      EXPECT_LE(widest, widest_of(coarse));
      // Within one 4-column granule of an even split.
      EXPECT_LE(widest, (out + s.column_parts - 1) / s.column_parts + 4);
    }
  // SmolLM2's attention output (576 columns) over 16 threads: 36 each.
  const WorkSplit smol = split_columns(576, 16);
  EXPECT_EQ(smol.column_parts, 16);
  for (std::int32_t p = 0; p < 16; ++p) {
    const IndexRange r = part_range(576, 16, p, smol.column_granule);
    EXPECT_EQ(r.end - r.begin, 36);
  }
  // Two threads keep whole 16-column granules: 288 each.
  EXPECT_EQ(split_columns(576, 2).column_granule, 16);
}

// Outside deterministic mode too, a product is the same up to f32 rounding
// whatever the thread count, for f32 weights (split by rows and columns)
// and quantised ones (in place and dequantised, split by columns).
TEST(Linear, MatchesADoubleReferenceOnAnyThreadCount) {
  Product p;
  const std::vector<std::uint8_t>& q8 = p.q8;
  std::vector<float> q8_values(std::size_t(kOut) * kIn);
  dequantize_weight_rows(q8.data(), WeightFormat::kQ8_0, kIn, 0, kOut, q8_values.data());
  const int saved = omp_get_max_threads();
  // (At most 3 threads: clang's OpenMP runtime keeps the descriptors of a
  // larger team past exit, which LeakSanitizer reports.) 16 columns: one
  // granule, so f32 batches above 8 rows split their rows instead.
  for (const bool onednn : {true, false})
    for (const int threads : {1, 2, 3})
      for (const std::int32_t out : {kOut, 16})
        for (const WeightFormat f : {WeightFormat::kF32, WeightFormat::kQ8_0})
          for (const std::int32_t rows : {1, 5, 37, 64})
            for (const bool accumulate : {false, true}) {
              omp_set_num_threads(threads);
              set_onednn_products(onednn);
              const bool f32 = f == WeightFormat::kF32;
              const float* w = f32 ? p.w.data() : q8_values.data();
              std::vector<float> y(p.bias.begin(), p.bias.begin() + std::size_t(rows) * kOut);
              LinearArgs args{p.x.data(), rows,
                              kIn,        f32 ? static_cast<const void*>(p.w.data()) : q8.data(),
                              out,        y.data(),
                              accumulate, false,
                              f};
              args.ldy = kOut;
              args.activations = Activations::kF32;
              linear(args, p.scratch);
              for (std::int32_t r = 0; r < rows; ++r)
                for (std::int32_t c = 0; c < out; ++c) {
                  double want = accumulate ? p.bias[std::size_t(r) * kOut + c] : 0.0;
                  for (std::int32_t i = 0; i < kIn; ++i)
                    want += double(p.x[std::size_t(r) * kIn + i]) * w[std::size_t(c) * kIn + i];
                  ASSERT_NEAR(y[std::size_t(r) * kOut + c], want, 1e-4)
                      << "oneDNN " << onednn << ", " << threads << " threads, " << out
                      << " columns, " << weight_format_name(f) << ", rows " << rows << ", r " << r
                      << ", c " << c;
                }
            }
  omp_set_num_threads(saved);
  set_onednn_products(true);
}

TEST(Linear, BlasBlocksAreWholeGranulesWithinTheirBytes) {
  for (const std::int32_t in : {32, 576, 1536, 4096, 8192, 32768, 1 << 20}) {
    const std::int32_t width = blas_block_columns(in);
    EXPECT_EQ(width % kColumnGranule, 0) << in;
    EXPECT_GE(width, kColumnBlock) << in;
    if (width > kColumnBlock) {
      EXPECT_LE(std::int64_t{width} * in * 4, kBlasBlockBytes) << in;
      EXPECT_GT(std::int64_t{width + kColumnGranule} * in * 4, kBlasBlockBytes) << in;
    }
  }
}

// Prefill's quantised products (more than kDotTileRows rows) dequantise
// blas_block_columns(in) columns per BLAS call: a product wider than two
// blocks, split over 1-3 threads whose ranges start and end inside blocks,
// matches a double product of the dequantised weights and writes only its
// columns of a wider y.
TEST(Linear, PrefillBlocksMatchADoubleReferenceOnAnyThreadCount) {
  constexpr std::int32_t in = 4096, rows = kDotTileRows + 9;
  const std::int32_t out = 2 * blas_block_columns(in) + 40, ldy = out + 13;
  ASSERT_GT(blas_block_columns(in), kColumnBlock);
  std::vector<std::uint8_t> q8(std::size_t(out) * (in / 32) * 34);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<std::uint8_t>((i * 53) % 241);
  for (std::size_t b = 0; b < q8.size(); b += 34) {
    q8[b] = 0x00;
    q8[b + 1] = 0x10;  // f16 2^-11
  }
  std::vector<float> w(std::size_t(out) * in);
  dequantize_weight_rows(q8.data(), WeightFormat::kQ8_0, in, 0, out, w.data());
  const std::vector<float> x = values(std::size_t(rows) * in, 4);
  const std::vector<float> y0 = values(std::size_t(rows) * ldy, 5);
  std::vector<double> exact(std::size_t(rows) * out);
  for (std::int32_t r = 0; r < rows; ++r)
    for (std::int32_t c = 0; c < out; ++c) {
      double sum = 0.0;
      for (std::int32_t i = 0; i < in; ++i)
        sum += double(x[std::size_t(r) * in + i]) * w[std::size_t(c) * in + i];
      exact[std::size_t(r) * out + c] = sum;
    }
  const int saved = omp_get_max_threads();
  LinearScratch scratch;
  for (const bool onednn : {true, false})
    for (const int threads : {1, 2, 3})
      for (const bool accumulate : {false, true}) {
        omp_set_num_threads(threads);
        set_onednn_products(onednn);
        std::vector<float> y = y0;
        LinearArgs args{x.data(), rows,       in,    q8.data(),          out,
                        y.data(), accumulate, false, WeightFormat::kQ8_0};
        args.ldy = ldy;
        args.activations = Activations::kF32;
        linear(args, scratch);
        for (std::int32_t r = 0; r < rows; ++r)
          for (std::int32_t c = 0; c < ldy; ++c) {
            const std::size_t at = std::size_t(r) * ldy + c;
            if (c >= out) {
              ASSERT_EQ(y[at], y0[at]) << "column " << c << " is past out";
              continue;
            }
            const double want = exact[std::size_t(r) * out + c] + (accumulate ? y0[at] : 0.0);
            ASSERT_NEAR(y[at], want, 2e-4)
                << "oneDNN " << onednn << ", " << threads << " threads, accumulate " << accumulate
                << ", r " << r << ", c " << c;
          }
      }
  omp_set_num_threads(saved);
  set_onednn_products(true);
}

// One oneDNN product against a double reference: |error| within a few f32
// roundings of the sum of |x w| terms, y's columns past cols untouched.
void expect_onednn_product(std::int32_t rows, std::int32_t in, std::int32_t cols, std::int32_t ldy,
                           bool accumulate, std::uint64_t seed) {
  const std::vector<float> x = values(std::size_t(rows) * in, seed);
  const std::vector<float> w = values(std::size_t(cols) * in, seed + 1);
  const std::vector<float> y0 = values(std::size_t(rows) * ldy, seed + 2);
  std::vector<float> y = y0;
  ASSERT_TRUE(onednn_sgemm(x.data(), rows, in, w.data(), cols, y.data(), ldy, accumulate));
  for (std::int32_t r = 0; r < rows; ++r)
    for (std::int32_t c = 0; c < ldy; ++c) {
      const std::size_t at = std::size_t(r) * ldy + c;
      if (c >= cols) {
        ASSERT_EQ(y[at], y0[at]) << "column " << c << " is past cols";
        continue;
      }
      double want = accumulate ? y0[at] : 0.0, magnitude = std::abs(want);
      for (std::int32_t i = 0; i < in; ++i) {
        const double term = double(x[std::size_t(r) * in + i]) * w[std::size_t(c) * in + i];
        want += term;
        magnitude += std::abs(term);
      }
      ASSERT_LE(std::abs(y[at] - want), 1e-6 * (in + 2) * magnitude + 1e-30)
          << rows << " x " << in << " x " << cols << ", ldy " << ldy << ", accumulate "
          << accumulate << ", r " << r << ", c " << c;
    }
}

// Shapes with odd tails in every dimension, more of them than a thread
// keeps primitives for (so some are made again), on one thread and on each
// thread of a parallel region at once; the caller's thread count is kept.
TEST(OneDnn, ProductsMatchADoubleReferenceInsideAndOutsideRegions) {
  if (!onednn_products()) GTEST_SKIP() << "this build has no oneDNN";
  struct Case {
    std::int32_t rows, in, cols, ldy;
    bool accumulate;
  };
  std::vector<Case> cases;
  for (const std::int32_t rows : {1, 7, 65, 130})
    for (const std::int32_t in : {1, 33, 96, 577})
      for (const std::int32_t cols : {1, 17, 129})
        cases.push_back({rows, in, cols, cols + (rows % 2) * 3, (in + cols) % 2 == 0});
  ASSERT_GT(cases.size(), kOneDnnShapesKept);
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  for (int round = 0; round < 2; ++round)
    for (std::size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      expect_onednn_product(c.rows, c.in, c.cols, c.ldy, c.accumulate, 10 + i);
      ASSERT_EQ(omp_get_max_threads(), 2);
    }
  bool all_ran = true;
#pragma omp parallel num_threads(3) reduction(&& : all_ran)
  for (std::size_t i = std::size_t(omp_get_thread_num()); i < cases.size(); i += 3) {
    const Case& c = cases[i];
    std::vector<float> x(std::size_t(c.rows) * c.in, 0.5f), w(std::size_t(c.cols) * c.in, 0.25f);
    std::vector<float> y(std::size_t(c.rows) * c.ldy, 1.0f);
    all_ran = all_ran &&
              onednn_sgemm(x.data(), c.rows, c.in, w.data(), c.cols, y.data(), c.ldy, c.accumulate);
    const float want = 0.125f * float(c.in) + (c.accumulate ? 1.0f : 0.0f);
    for (std::int32_t r = 0; r < c.rows; ++r)
      for (std::int32_t col = 0; col < c.cols; ++col)
        all_ran = all_ran && y[std::size_t(r) * c.ldy + col] == want;
  }
  EXPECT_TRUE(all_ran) << "a thread's product was wrong or did not run";
  omp_set_num_threads(saved);
}

TEST(OneDnn, SwitchedOffLeavesTheProductToTheCaller) {
  std::vector<float> x(4, 1.0f), w(4, 1.0f), y(1, 7.0f);
  const std::vector<std::uint16_t> x16(4, 0x3f80), w16(4, 0x3f80);  // bf16 ones
  set_onednn_products(false);
  EXPECT_FALSE(onednn_sgemm(x.data(), 1, 4, w.data(), 1, y.data(), 1, false));
  EXPECT_FALSE(onednn_bf16_gemm(x16.data(), 1, 4, w16.data(), 1, y.data(), 1, false));
  EXPECT_FALSE(onednn_bf16_products());
  EXPECT_EQ(y[0], 7.0f);
  EXPECT_EQ(onednn_kernels(), "");
  set_onednn_products(true);
}

// A shape oneDNN makes no primitive for (here a negative column count) is
// left to the caller, y untouched, call after call.
TEST(OneDnn, AShapeWithoutAPrimitiveIsLeftToTheCaller) {
  if (!onednn_products()) GTEST_SKIP() << "this build has no oneDNN";
  std::vector<float> x(4, 1.0f), w(4, 1.0f), y(1, 7.0f);
  for (int call = 0; call < 2; ++call) {
    EXPECT_FALSE(onednn_sgemm(x.data(), 1, 4, w.data(), -1, y.data(), 1, false)) << call;
    EXPECT_EQ(y[0], 7.0f) << call;
  }
  EXPECT_TRUE(onednn_sgemm(x.data(), 1, 4, w.data(), 1, y.data(), 1, false));
  EXPECT_EQ(y[0], 4.0f);
}

// bench-serve prints the version and the instructions oneDNN's kernels use.
TEST(OneDnn, NamesItsVersionAndInstructions) {
  if (!onednn_products()) GTEST_SKIP() << "this build has no oneDNN";
  const std::string name = onednn_kernels();
  EXPECT_EQ(name.rfind("oneDNN ", 0), 0u) << name;
  EXPECT_NE(name.find(" ("), std::string::npos) << name;
  EXPECT_EQ(name.back(), ')') << name;
  if (onednn_bf16_products()) {
    EXPECT_TRUE(name.find("bf16") != std::string::npos || name.find("amx") != std::string::npos)
        << name;
  }
}

TEST(Linear, RefusesAnLdyShorterThanOut) {
  Product p;
  std::vector<float> y(std::size_t(kOut) * 2);
  LinearArgs args{p.x.data(), 2, kIn, p.w.data(), kOut, y.data()};
  args.ldy = kOut - 1;
  try {
    linear(args, p.scratch);
    FAIL() << "ldy < out";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("ldy = 699"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace pagedattn::engine
