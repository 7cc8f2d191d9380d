// Benchmarks of prefix caching and the host tier (docs/prefix_caching.md):
//
//   * match_prefix over a cached prompt of `pages` pages (page 16): the dry
//     run's cost per page (key hashing + table lookup + content compare);
//   * add_sequence_with_prefix sharing `pages` cached device pages;
//   * set_sequence_tokens publishing `pages` new pages;
//   * swap_out / swap_in of one sequence of `pages` pages, with a
//     Llama-3-8B-like page (32 layers, 8 KV heads, head_dim 128, f16: 2 MiB
//     per 16-token page): bytes/s, and x_memcpy = the swap's time over a
//     memcpy of the same bytes between two private buffers, timed in the
//     same iteration (interleaved, same cache state: sources cold).
//
// Timing is manual (UseManualTime): only the call itself is timed; the calls
// that restore the state between iterations are not.
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cstring>
#include <new>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace {

using pagedattn::KVCacheConfig;
using pagedattn::PagedKVCache;
using pagedattn::SeqId;
using Clock = std::chrono::steady_clock;

constexpr std::int32_t kPageSize = 16;

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

KVCacheConfig model_config(std::int64_t pages, std::int64_t host_pages) {
  KVCacheConfig c;
  c.num_layers = 32;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = kPageSize;
  c.num_pages = pages;
  c.host_num_pages = host_pages;
  c.kv_dtype = pagedattn::DType::kF16;
  c.enable_prefix_caching = true;
  return c;
}

std::vector<std::int32_t> prompt_of(std::int64_t pages) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(pages * kPageSize + 1));
  for (std::size_t i = 0; i < t.size(); ++i) t[i] = static_cast<std::int32_t>(i * 7919 % 32000);
  return t;
}

// Appends `tokens` to `id` in one metadata-only step (no K/V written).
void append(PagedKVCache& kv, SeqId id, std::int64_t tokens) {
  const std::vector<SeqId> ids = {id};
  const std::vector<std::int64_t> lens = {tokens};
  kv.begin_forward(ids, lens);
  for (std::int32_t l = 0; l < kv.config().num_layers; ++l) kv.mark_layer_appended(l);
  kv.end_forward();
}

// A cache whose index holds `pages` published pages of prompt_of(pages).
void publish_prompt(PagedKVCache& kv, std::int64_t pages) {
  const std::vector<std::int32_t> prompt = prompt_of(pages);
  kv.add_sequence(0);
  append(kv, 0, std::ssize(prompt));
  kv.set_sequence_tokens(0, prompt);
  kv.remove_sequence(0);
}

void BM_MatchPrefix(benchmark::State& state) {
  const std::int64_t pages = state.range(0);
  PagedKVCache kv(model_config(pages + 1, 0));
  publish_prompt(kv, pages);
  const std::vector<std::int32_t> prompt = prompt_of(pages);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(kv.match_prefix(prompt));
    const double t = seconds_since(t0);
    state.SetIterationTime(t);
    total += t;
  }
  state.counters["ns_per_page"] = total * 1e9 / static_cast<double>(pages * state.iterations());
}
BENCHMARK(BM_MatchPrefix)->ArgName("pages")->Arg(8)->Arg(256)->UseManualTime();

void BM_AddSequenceWithPrefix(benchmark::State& state) {
  const std::int64_t pages = state.range(0);
  PagedKVCache kv(model_config(pages + 1, 0));
  publish_prompt(kv, pages);
  const std::vector<std::int32_t> prompt = prompt_of(pages);
  double total = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    benchmark::DoNotOptimize(kv.add_sequence_with_prefix(1, prompt));
    const double t = seconds_since(t0);
    state.SetIterationTime(t);
    total += t;
    kv.remove_sequence(1);
  }
  state.counters["ns_per_page"] = total * 1e9 / static_cast<double>(pages * state.iterations());
}
BENCHMARK(BM_AddSequenceWithPrefix)->ArgName("pages")->Arg(8)->Arg(256)->UseManualTime();

void BM_SetSequenceTokens(benchmark::State& state) {
  const std::int64_t pages = state.range(0);
  PagedKVCache kv(model_config(pages + 1, 0));
  const std::vector<std::int32_t> prompt = prompt_of(pages);
  double total = 0;
  for (auto _ : state) {
    kv.add_sequence(1);
    append(kv, 1, std::ssize(prompt));
    const auto t0 = Clock::now();
    kv.set_sequence_tokens(1, prompt);
    const double t = seconds_since(t0);
    state.SetIterationTime(t);
    total += t;
    kv.remove_sequence(1);
    kv.reset_prefix_cache();
  }
  state.counters["ns_per_page"] = total * 1e9 / static_cast<double>(pages * state.iterations());
}
BENCHMARK(BM_SetSequenceTokens)->ArgName("pages")->Arg(8)->Arg(256)->UseManualTime();

// Private, pre-faulted memory for the memcpy baseline.
struct Buffer {
  explicit Buffer(std::size_t n) : bytes(n) {
    void* p = mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data = static_cast<std::byte*>(p);
    std::memset(data, 0x5a, n);
  }
  ~Buffer() { munmap(data, bytes); }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;
  std::size_t bytes;
  std::byte* data;
};

// Evicts the last-level cache (32 MiB on the benchmark machine) with a
// read-modify-write of every line of 64 MiB.
void flush_caches() {
  static std::vector<unsigned char> buffer(std::size_t{64} << 20, 0);
  for (std::size_t i = 0; i < buffer.size(); i += 64)
    buffer[i] = static_cast<unsigned char>(buffer[i] + 1);
  benchmark::DoNotOptimize(buffer.data());
  benchmark::ClobberMemory();
}

// swap_out (range(1) = 0) or swap_in (1) of a sequence of `pages` pages.
void BM_Swap(benchmark::State& state) {
  const std::int64_t pages = state.range(0);
  const bool swap_in = state.range(1) == 1;
  PagedKVCache kv(model_config(pages, pages));
  const auto bytes = static_cast<std::size_t>(pages * kv.bytes_per_page());
  Buffer src(bytes), dst(bytes);
  kv.add_sequence(1);
  append(kv, 1, pages * kPageSize);
  const std::vector<SeqId> one = {1};
  kv.swap_out(one);  // touches both tiers' pages once
  kv.swap_in(one);
  double swap_total = 0, memcpy_total = 0;
  for (auto _ : state) {
    if (swap_in) kv.swap_out(one);
    flush_caches();
    auto t0 = Clock::now();
    swap_in ? kv.swap_in(one) : kv.swap_out(one);
    const double t = seconds_since(t0);
    state.SetIterationTime(t);
    swap_total += t;
    if (!swap_in) kv.swap_in(one);
    flush_caches();
    t0 = Clock::now();
    std::memcpy(dst.data, src.data, bytes);
    benchmark::ClobberMemory();
    memcpy_total += seconds_since(t0);
  }
  const auto n = static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<std::int64_t>(bytes) * state.iterations());
  state.counters["memcpy_GB/s"] = static_cast<double>(bytes) * n / memcpy_total / 1e9;
  state.counters["x_memcpy"] = swap_total / memcpy_total;
}
BENCHMARK(BM_Swap)
    ->ArgNames({"pages", "in"})
    ->Args({8, 0})
    ->Args({8, 1})
    ->Args({64, 0})
    ->Args({64, 1})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
