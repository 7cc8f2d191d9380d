// Peer-operator overhead: each adapter call next to the kernel calls it
// makes, on the same data (decode: one new token per sequence).
//
//   BM_OrtOverhead   ort::paged_attention (validation, block table -> CSR,
//                    slot computation, append_paged_kv, AttentionRunner::run)
//                    vs append_paged_kv + AttentionRunner::run with a CSR
//                    table and slots built once outside the timed loop
//   BM_VllmOverhead  vllm::forward_decode (flash layout) vs
//                    AttentionRunner::run on the same table
//
// The two calls of a pair alternate within each iteration; counters give
// the medians of adapter_us, direct_us and of the per-iteration difference
// overhead_us (validation + translation).
// Shape: Hq 32, Hkv 8, D 128, f16 activations and cache, block 16;
// arguments: sequences, keys per sequence.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/kv_ops.h"
#include "pagedattn/ops/ort.h"
#include "pagedattn/ops/vllm.h"

namespace {

using namespace pagedattn;
using ops::IndexView;
using ops::TensorView;

constexpr std::int32_t kHq = 32, kHkv = 8, kD = 128, kBlock = 16;

// One decode batch in ORT / vLLM form and in the kernels' form.
struct DecodeSetup {
  std::int32_t seqs, keys, max_blocks;
  std::int64_t num_blocks;
  std::vector<std::uint16_t> query, key, value, out, key_cache, value_cache;
  std::vector<std::int32_t> cu, past, block_table, seq_lens;
  // Kernel form.
  std::vector<std::int32_t> qo_indptr, kv_indptr, kv_indices, last_page_len, kv_lens;
  std::vector<std::int64_t> slots;

  DecodeSetup(std::int32_t s, std::int32_t k)
      : seqs(s), keys(k), max_blocks((k + kBlock - 1) / kBlock) {
    num_blocks = std::int64_t{seqs} * max_blocks;
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    auto fill = [&](std::vector<std::uint16_t>& v, std::size_t n) {
      v.resize(n);
      for (auto& x : v) x = float_to_f16_bits(normal(rng));
    };
    fill(query, std::size_t(seqs) * kHq * kD);
    fill(key, std::size_t(seqs) * kHkv * kD);
    fill(value, std::size_t(seqs) * kHkv * kD);
    fill(key_cache, std::size_t(num_blocks) * kBlock * kHkv * kD);
    fill(value_cache, key_cache.size());
    out.resize(query.size());
    std::vector<std::int32_t> ids(static_cast<std::size_t>(num_blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table = ids;
    qo_indptr = kv_indptr = cu = {0};
    for (std::int32_t b = 0; b < seqs; ++b) {
      cu.push_back(b + 1);
      qo_indptr.push_back(b + 1);
      past.push_back(keys - 1);
      seq_lens.push_back(keys);
      kv_lens.push_back(keys);
      kv_indptr.push_back(kv_indptr.back() + max_blocks);
      last_page_len.push_back(keys - (max_blocks - 1) * kBlock);
      const std::int32_t pos = keys - 1;
      slots.push_back(std::int64_t{block_table[std::size_t(b) * max_blocks + pos / kBlock]} *
                          kBlock +
                      pos % kBlock);
    }
    kv_indices = block_table;
  }

  PagedKVStorage storage() {
    return PagedKVStorage::dense(key_cache.data(), value_cache.data(), DType::kF16, KVLayout::kNHD,
                                 kBlock, kHkv, kD, kD, num_blocks);
  }
  AttentionParams kernel_params() {
    AttentionParams p;
    p.q = {query.data(), DType::kF16, kHq * kD, kD};
    p.o = {out.data(), DType::kF16, kHq * kD, kD};
    p.num_qo_heads = kHq;
    p.table = {seqs,
               kBlock,
               qo_indptr.data(),
               kv_indptr.data(),
               kv_indices.data(),
               last_page_len.data(),
               kv_lens.data(),
               nullptr,
               nullptr};
    p.kv = storage();
    return p;
  }
  ops::ort::PagedAttentionParams ort_params() {
    ops::ort::PagedAttentionParams p;
    p.query = TensorView::dense(query.data(), DType::kF16, {seqs, kHq * kD});
    p.key = TensorView::dense(key.data(), DType::kF16, {seqs, kHkv * kD});
    p.value = TensorView::dense(value.data(), DType::kF16, {seqs, kHkv * kD});
    p.key_cache = TensorView::dense(key_cache.data(), DType::kF16, {num_blocks, kBlock, kHkv * kD});
    p.value_cache =
        TensorView::dense(value_cache.data(), DType::kF16, {num_blocks, kBlock, kHkv * kD});
    p.cumulative_sequence_length = IndexView::dense(cu.data(), {seqs + 1});
    p.past_seqlens = IndexView::dense(past.data(), {seqs});
    p.block_table = IndexView::dense(block_table.data(), {seqs, max_blocks});
    p.output = TensorView::dense(out.data(), DType::kF16, {seqs, kHq * kD});
    p.num_heads = kHq;
    p.kv_num_heads = kHkv;
    return p;
  }
  ops::vllm::ForwardDecodeParams vllm_params() {
    ops::vllm::KVCaches kv{
        TensorView::dense(key_cache.data(), DType::kF16, {num_blocks, kBlock, kHkv, kD}),
        TensorView::dense(value_cache.data(), DType::kF16, {num_blocks, kBlock, kHkv, kD})};
    return {TensorView::dense(out.data(), DType::kF16, {seqs, kHq, kD}),
            TensorView::dense(query.data(), DType::kF16, {seqs, kHq, kD}),
            kv,
            IndexView::dense(block_table.data(), {seqs, max_blocks}),
            IndexView::dense(seq_lens.data(), {seqs}),
            keys,
            kHkv,
            1.0f / 11.3137085f,
            std::nullopt};
  }
};

using Clock = std::chrono::steady_clock;

double micros(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double, std::micro>(b - a).count();
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

// Times `adapter` and `direct` alternately each iteration (so load changes
// hit both alike); reports the adapter's time and the medians of both and of
// their per-iteration difference.
template <typename Adapter, typename Direct>
void run_pair(benchmark::State& state, const DecodeSetup& s, Adapter&& adapter, Direct&& direct) {
  std::vector<double> a_us, d_us, diff_us;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    adapter();
    const auto t1 = Clock::now();
    direct();
    const auto t2 = Clock::now();
    a_us.push_back(micros(t0, t1));
    d_us.push_back(micros(t1, t2));
    diff_us.push_back(a_us.back() - d_us.back());
    state.SetIterationTime(a_us.back() * 1e-6);
  }
  state.counters["seqs"] = s.seqs;
  state.counters["keys"] = s.keys;
  state.counters["adapter_us"] = median(a_us);
  state.counters["direct_us"] = median(d_us);
  state.counters["overhead_us"] = median(diff_us);
}

// ort::paged_attention vs append_paged_kv + AttentionRunner::run.
void BM_OrtOverhead(benchmark::State& state) {
  DecodeSetup s(static_cast<std::int32_t>(state.range(0)),
                static_cast<std::int32_t>(state.range(1)));
  const ops::ort::PagedAttentionParams p = s.ort_params();
  AttentionParams kp = s.kernel_params();
  kp.options.scale = 1.0f / 11.3137085f;
  const AppendParams append{{s.key.data(), DType::kF16, kHkv * kD, kD},
                            {s.value.data(), DType::kF16, kHkv * kD, kD},
                            s.slots.data(),
                            s.seqs,
                            kp.kv};
  AttentionRunner runner;
  run_pair(
      state, s, [&] { ops::ort::paged_attention(p); },
      [&] {
        append_paged_kv(append);
        runner.run(kp);
      });
}

// vllm::forward_decode vs AttentionRunner::run.
void BM_VllmOverhead(benchmark::State& state) {
  DecodeSetup s(static_cast<std::int32_t>(state.range(0)),
                static_cast<std::int32_t>(state.range(1)));
  const ops::vllm::ForwardDecodeParams p = s.vllm_params();
  AttentionParams kp = s.kernel_params();
  kp.options.scale = 1.0f / 11.3137085f;
  AttentionRunner runner;
  run_pair(
      state, s, [&] { ops::vllm::forward_decode(p); }, [&] { runner.run(kp); });
}

void shapes(benchmark::internal::Benchmark* b) {
  b->Args({1, 16})->Args({64, 16})->Args({16, 1024})->Args({64, 1024});
  b->UseManualTime()->Unit(benchmark::kMicrosecond);
}

BENCHMARK(BM_OrtOverhead)->Apply(shapes);
BENCHMARK(BM_VllmOverhead)->Apply(shapes);

}  // namespace

BENCHMARK_MAIN();
