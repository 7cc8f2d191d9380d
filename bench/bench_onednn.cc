// The model's products against oneDNN's matmul (Debian libdnnl-dev, built
// only where CMake finds it): issue 37 asks to measure a well-kept library
// before choosing hand-written kernels. Each case is one product
// y[rows][out] = x[rows][in] w[out][in]^T on the process's OpenMP threads
// (oneDNN's CPU engine runs on the same libgomp), alternated in one run:
//   path 0: linear() on f32 weights (in place at 1 row, dot_tiles to 32,
//           above them oneDNN since linear() adopted it, OpenBLAS with
//           PAGEDATTN_ONEDNN=0: the presets and F32 GGUF tensors);
//   path 1: oneDNN f32 matmul, its weights reordered once into the layout it
//           asks for (format_tag::any), as a load would;
//   path 2: linear() on BF16 weights in place with bf16 products
//           (bf16_batches: dot_tiles on AVX512-BF16 from 9 rows; below, f32
//           products on the widened weights);
//   path 3: oneDNN bf16 matmul (x converted to bf16 in each call, timed;
//           weights bf16 in its layout; f32 output);
//   path 4: oneDNN f32 matmul on the weights as they are, [out][in] rows (a
//           block just dequantised, as prefill's quantised products make);
//   path 5: the same with the row count given at run time
//           (DNNL_RUNTIME_DIM_VAL): one primitive for every count, as a
//           step's changing batch would need.
// Shapes: SmolLM2-135M's gate|up (3072 x 576) and down (576 x 1536), Llama
// 3.2 1B's fused gate|up (16384 x 2048) and down (2048 x 8192).
#include <benchmark/benchmark.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <dnnl.hpp>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/dot_tiles.h"
#include "engine/gemm.h"

namespace {

using dnnl::memory;
using pagedattn::engine::WeightFormat;

std::vector<float> random_values(std::size_t n, unsigned seed) {
  std::vector<float> v(n);
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  for (auto& x : v) x = value(rng);
  return v;
}

// Round to nearest even bf16 (the values are finite).
std::vector<std::uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<std::uint16_t> out(v.size());
  for (std::size_t i = 0; i < v.size(); ++i) {
    std::uint32_t bits;
    std::memcpy(&bits, &v[i], sizeof bits);
    bits += 0x7fffu + ((bits >> 16) & 1u);
    out[i] = static_cast<std::uint16_t>(bits >> 16);
  }
  return out;
}

// One oneDNN matmul, set up outside the timing: x's and y's f32 buffers,
// weights in oneDNN's chosen layout of `type`, x converted to `type` first
// when that is not f32.
class OneDnnProduct {
 public:
  OneDnnProduct(std::int32_t rows, std::int32_t in, std::int32_t out, const std::vector<float>& w,
                memory::data_type type, float* x, float* y, bool packed = true,
                bool runtime_rows = false)
      : engine_(dnnl::engine::kind::cpu, 0), stream_(engine_) {
    const memory::dims src_dims{rows, in}, w_dims{in, out}, dst_dims{rows, out};
    const memory::desc x_f32(src_dims, memory::data_type::f32, memory::format_tag::ab);
    const memory::desc x_typed(src_dims, type, memory::format_tag::ab);
    const memory::desc w_any(w_dims, type,
                             packed ? memory::format_tag::any : memory::format_tag::ba);
    const memory::desc y_f32(dst_dims, memory::data_type::f32, memory::format_tag::ab);
    // Rows given at run time: one primitive for every row count.
    const memory::dim any_rows = DNNL_RUNTIME_DIM_VAL;
    const memory::desc x_runtime({any_rows, in}, type, memory::dims{in, 1});
    const memory::desc y_runtime({any_rows, out}, memory::data_type::f32, memory::dims{out, 1});
    const dnnl::matmul::primitive_desc pd(runtime_rows
                                              ? dnnl::matmul::desc(x_runtime, w_any, y_runtime)
                                              : dnnl::matmul::desc(x_typed, w_any, y_f32),
                                          engine_);
    matmul_ = dnnl::matmul(pd);
    // w[out][in] row-major is the in x out matrix in format "ba".
    const memory::desc w_user(w_dims, memory::data_type::f32, memory::format_tag::ba);
    memory user(w_user, engine_, const_cast<float*>(w.data()));
    weights_ = memory(pd.weights_desc(), engine_);
    dnnl::reorder(user, weights_).execute(stream_, user, weights_);
    x_f32_ = memory(x_f32, engine_, x);
    y_ = memory(y_f32, engine_, y);
    if (type != memory::data_type::f32) {
      x_typed_ = memory(x_typed, engine_);
      convert_ = dnnl::reorder(x_f32_, x_typed_);
    }
    stream_.wait();
  }

  void run() {
    if (convert_) convert_.execute(stream_, x_f32_, x_typed_);
    matmul_.execute(stream_, {{DNNL_ARG_SRC, convert_ ? x_typed_ : x_f32_},
                              {DNNL_ARG_WEIGHTS, weights_},
                              {DNNL_ARG_DST, y_}});
    stream_.wait();
  }

 private:
  dnnl::engine engine_;
  dnnl::stream stream_;
  dnnl::matmul matmul_;
  dnnl::reorder convert_;
  memory weights_, x_f32_, x_typed_, y_;
};

void BM_Product(benchmark::State& state) {
  const auto out = static_cast<std::int32_t>(state.range(0));
  const auto in = static_cast<std::int32_t>(state.range(1));
  const auto rows = static_cast<std::int32_t>(state.range(2));
  const auto path = state.range(3);
  if (path == 2 && rows >= pagedattn::engine::kBf16MinRows &&
      !pagedattn::engine::dot_tiles_bf16_available())
    return state.SkipWithError("no AVX512-BF16 here");
  const std::vector<float> w = random_values(std::size_t(out) * in, 1);
  std::vector<float> x = random_values(std::size_t(rows) * in, 2);
  std::vector<float> y(std::size_t(rows) * out);
  const std::vector<std::uint16_t> w_bf16 = to_bf16(w);
  pagedattn::engine::use_single_threaded_blas();
  pagedattn::engine::LinearScratch scratch;
  pagedattn::engine::LinearArgs args{x.data(), rows, in, nullptr, out, y.data(), false, false};
  if (path == 0) args.w = w.data();
  if (path == 2) {
    args.w = w_bf16.data();
    args.w_format = WeightFormat::kBF16;
    args.bf16_batches = true;
  }
  std::unique_ptr<OneDnnProduct> onednn;
  if (path == 1 || path == 3 || path == 4 || path == 5)
    onednn = std::make_unique<OneDnnProduct>(
        rows, in, out, w, path == 3 ? memory::data_type::bf16 : memory::data_type::f32, x.data(),
        y.data(), path < 4, path == 5);
  for (auto _ : state) {
    if (onednn)
      onednn->run();
    else
      pagedattn::engine::linear(args, scratch);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  // Each path's output against f32 linear()'s, relative to its largest value.
  std::vector<float> ref(y.size());
  pagedattn::engine::LinearArgs f32_args = args;
  f32_args.w = w.data();
  f32_args.w_format = WeightFormat::kF32;
  f32_args.bf16_batches = false;
  f32_args.y = ref.data();
  pagedattn::engine::linear(f32_args, scratch);
  double largest = 0.0, error = 0.0;
  for (std::size_t i = 0; i < y.size(); ++i) {
    largest = std::max(largest, double(std::abs(ref[i])));
    error = std::max(error, double(std::abs(y[i] - ref[i])));
  }
  state.counters["rel_err"] = error / largest;
  state.counters["GFLOP/s"] = benchmark::Counter(2.0 * rows * out * in * 1e-9,
                                                 benchmark::Counter::kIsIterationInvariantRate);
  state.counters["threads"] = omp_get_max_threads();
  static const char* const kPaths[] = {"linear f32",
                                       "oneDNN f32",
                                       "linear bf16 weights",
                                       "oneDNN bf16",
                                       "oneDNN f32 row-major weights",
                                       "oneDNN f32 row-major weights, rows at run time"};
  state.SetLabel(kPaths[path]);
}

void Shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"out", "in", "rows", "path"});
  const std::int64_t shapes[][2] = {{3072, 576}, {576, 1536}, {16384, 2048}, {2048, 8192}};
  for (const auto& s : shapes)
    for (const std::int64_t rows : {1, 8, 32, 512, 2048}) {
      if (s[0] * s[1] >= (1 << 24) && rows > 512) continue;  // 1B's prefill at 512 rows is enough
      for (const std::int64_t path : {0, 1, 2, 3, 4, 5}) b->Args({s[0], s[1], rows, path});
    }
  b->Unit(benchmark::kMicrosecond)->UseRealTime();  // the threads' wall time
}
BENCHMARK(BM_Product)->Apply(Shapes);

}  // namespace

BENCHMARK_MAIN();
