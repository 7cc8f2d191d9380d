// GGUF loading (issue "Real models"): dequantisation throughput of each
// supported weight type on random blocks (single thread, one 4096-element
// row at a time, L1/L2-resident), and the whole test model opened and
// dequantised to f32 (GgufFile::open + read_model_config + dequantize of
// every tensor, OpenMP over rows), as the engine's load step would.
// The model is PAGEDATTN_TEST_MODEL, else ~/.cache/pagedattn/models/
// SmolLM2-135M-Instruct.Q4_1.gguf (scripts/get_test_model.sh); that case
// reports an error when the file is absent.
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/gguf.h"
#include "pagedattn/gguf_model.h"

namespace {

using pagedattn::GgufType;

constexpr std::int64_t kRow = 4096;
constexpr std::int64_t kRows = 64;

void BM_DequantizeRow(benchmark::State& state, GgufType type) {
  const pagedattn::GgufTypeInfo& info = pagedattn::gguf_type_info(type);
  const std::int64_t row_bytes = pagedattn::gguf_row_bytes(type, kRow);
  std::vector<std::uint8_t> bytes(static_cast<std::size_t>(row_bytes * kRows));
  std::mt19937 rng(1);
  for (auto& b : bytes) b = static_cast<std::uint8_t>(rng());
  // Finite scales: clear the top exponent bit of every f16 (a harmless
  // over-approximation of the scale fields; speed does not depend on it).
  if (info.block_size > 1)
    for (std::size_t i = 1; i < bytes.size(); i += 2) bytes[i] &= 0x3f;
  std::vector<float> out(kRow);
  std::int64_t r = 0;
  for (auto _ : state) {
    pagedattn::dequantize_row(type, bytes.data() + (r % kRows) * row_bytes, out.data(), kRow);
    benchmark::DoNotOptimize(out.data());
    ++r;
  }
  state.SetItemsProcessed(state.iterations() * kRow);
  state.SetBytesProcessed(state.iterations() * row_bytes);
}

std::string model_path() {
  if (const char* env = std::getenv("PAGEDATTN_TEST_MODEL")) return env;
  const char* home = std::getenv("HOME");
  return std::string(home ? home : ".") + "/.cache/pagedattn/models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

void BM_LoadAndDequantizeModel(benchmark::State& state) {
  const std::string path = model_path();
  std::int64_t elements = 0;
  for (auto _ : state) {
    try {
      const pagedattn::GgufFile file = pagedattn::GgufFile::open(path);
      const pagedattn::GgufModelConfig config = pagedattn::read_model_config(file);
      benchmark::DoNotOptimize(config.num_layers);
      elements = 0;
      for (const pagedattn::GgufTensor& t : file.tensors()) {
        const std::vector<float> values = file.dequantize(t);
        benchmark::DoNotOptimize(values.data());
        elements += t.element_count();
      }
    } catch (const std::exception& e) {
      state.SkipWithError(e.what());
      return;
    }
  }
  state.counters["parameters"] = static_cast<double>(elements);
  state.SetItemsProcessed(state.iterations() * elements);
}

BENCHMARK_CAPTURE(BM_DequantizeRow, F16, GgufType::kF16);
BENCHMARK_CAPTURE(BM_DequantizeRow, BF16, GgufType::kBF16);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q8_0, GgufType::kQ8_0);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q4_0, GgufType::kQ4_0);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q4_1, GgufType::kQ4_1);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q4_K, GgufType::kQ4_K);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q5_K, GgufType::kQ5_K);
BENCHMARK_CAPTURE(BM_DequantizeRow, Q6_K, GgufType::kQ6_K);
BENCHMARK(BM_LoadAndDequantizeModel)->Unit(benchmark::kMillisecond)->MinTime(2.0);

}  // namespace

BENCHMARK_MAIN();
