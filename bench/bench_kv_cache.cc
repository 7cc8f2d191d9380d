// Benchmarks of the KV-cache manager (PagedKVCache), issue "foundation":
//
//   * decode step: begin_forward + end_forward appending 1 token to each of
//     `batch` sequences of 4,096 tokens (target: < 100 us for 256 x 4,096,
//     page 16, on the 2-core benchmark machine);
//   * prefill step: begin_forward + end_forward for new sequences;
//   * fork_sequence of a long sequence: metadata only (fork at a page
//     boundary) or with the one partially filled page copied.
//
// Every timed operation is paired with a same-process baseline (memcpy of the
// same number of bytes between two private buffers, under the same cache
// conditions), reported as the counter x_memcpy = operation / memcpy.
//
// Storage has a Llama-3-8B-like shape (32 layers, 8 KV heads, head_dim 128,
// f16, HND): 128 KiB per token over all layers, 2 MiB per 16-token page. The
// storage is an anonymous MAP_NORESERVE mapping, so the 128 GiB that 256
// sequences of 4,096 tokens address cost no RAM: plans never touch K/V bytes.
// Only copied pages become resident (BM_ForkFirstTouch: 512 MiB; the whole
// program peaks at about 0.7 GiB).
//
// Timing is manual (UseManualTime): only the operation itself is timed with
// steady_clock; the bookkeeping that keeps the state steady between
// iterations (pop_n, remove_sequence, cache flushes, madvise) is not.
// BM_ClockNow reports the cost of one clock read (the floor of the method).
#include <benchmark/benchmark.h>
#include <sys/mman.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"

namespace {

using pagedattn::BatchPlan;
using pagedattn::KVCacheConfig;
using pagedattn::PagedKVCache;
using pagedattn::SeqId;
using Clock = std::chrono::steady_clock;

// These benchmarks time the manager's metadata only: no K/V is written, so
// every layer is declared appended for end_forward (untimed where timed).
void mark_all_layers(PagedKVCache& cache) {
  for (std::int32_t l = 0; l < cache.config().num_layers; ++l) cache.mark_layer_appended(l);
}
void end_metadata_step(PagedKVCache& cache) {
  mark_all_layers(cache);
  cache.end_forward();
}

double seconds_between(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// Llama-3-8B-like K/V storage.
KVCacheConfig model_config(std::int32_t page_size, std::int64_t num_pages) {
  KVCacheConfig c;
  c.num_layers = 32;
  c.num_qo_heads = 32;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.kv_dtype = pagedattn::DType::kF16;
  c.layout = pagedattn::KVLayout::kHND;
  return c;
}

template <typename T>
std::size_t vector_bytes(const std::vector<T>& v) {
  return v.size() * sizeof(T);
}

// Bytes of every array of a plan: what any builder that materialises the
// plan must at least write.
std::size_t plan_bytes(const BatchPlan& p) {
  return vector_bytes(p.seq_ids) + vector_bytes(p.qo_indptr) + vector_bytes(p.kv_indptr) +
         vector_bytes(p.kv_indices) + vector_bytes(p.kv_last_page_len) + vector_bytes(p.kv_lens) +
         vector_bytes(p.kv_sink_lens) + vector_bytes(p.kv_gap_lens) + vector_bytes(p.positions) +
         vector_bytes(p.slot_mapping);
}

// Page-aligned anonymous memory (so it can be evicted with madvise, like the
// cache's own storage).
class MappedBuffer {
 public:
  explicit MappedBuffer(std::size_t bytes) : bytes_(bytes < 4096 ? 4096 : bytes) {
    void* p = mmap(nullptr, bytes_, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) throw std::bad_alloc();
    data_ = static_cast<std::byte*>(p);
  }
  ~MappedBuffer() { munmap(data_, bytes_); }
  MappedBuffer(const MappedBuffer&) = delete;
  MappedBuffer& operator=(const MappedBuffer&) = delete;

  std::byte* data() const { return data_; }
  // Drops the pages: the next touch faults in fresh zeroed memory.
  void evict() { madvise(data_, bytes_, MADV_DONTNEED); }

 private:
  std::size_t bytes_;
  std::byte* data_ = nullptr;
};

// The same-process baseline: memcpy of `bytes` between two private buffers.
class MemcpyBaseline {
 public:
  explicit MemcpyBaseline(std::size_t bytes) : bytes_(bytes), src_(bytes), dst_(bytes) {
    std::memset(src_.data(), 0x5a, bytes_);
    std::memset(dst_.data(), 0, bytes_);
  }
  double run() {
    benchmark::DoNotOptimize(src_.data());
    const auto t0 = Clock::now();
    std::memcpy(dst_.data(), src_.data(), bytes_);
    benchmark::ClobberMemory();
    const auto t1 = Clock::now();
    benchmark::DoNotOptimize(dst_.data());
    return seconds_between(t0, t1);
  }
  void evict_destination() { dst_.evict(); }

 private:
  std::size_t bytes_;
  MappedBuffer src_;
  MappedBuffer dst_;
};

// Evicts the caches (L3 is 32 MiB on the benchmark machine) by a
// read-modify-write of every line of a 64 MiB buffer (plain stores: glibc's
// large memset uses non-temporal stores that would not evict anything).
void flush_caches() {
  static std::vector<unsigned char> buffer(std::size_t{64} << 20, 0);
  for (std::size_t i = 0; i < buffer.size(); i += 64)
    buffer[i] = static_cast<unsigned char>(buffer[i] + 1);
  benchmark::DoNotOptimize(buffer.data());
  benchmark::ClobberMemory();
}

// Byte range of page `page`'s K (or V) data in one layer.
struct PageBytes {
  std::byte* k;
  std::byte* v;
  std::size_t k_bytes;
  std::size_t v_bytes;
};

PageBytes page_bytes_in_layer(const PagedKVCache& cache, std::int32_t layer, std::int32_t page) {
  const pagedattn::PagedKVStorage s = cache.layer_storage(layer);
  const auto elem = static_cast<std::int64_t>(pagedattn::dtype_size(s.dtype));
  return {static_cast<std::byte*>(s.k_data) + s.k_offset(page, 0, 0) * elem,
          static_cast<std::byte*>(s.v_data) + s.v_offset(page, 0, 0) * elem,
          static_cast<std::size_t>(s.k_page_stride * elem),
          static_cast<std::size_t>(s.v_page_stride * elem)};
}

// Writes `value` into every byte of `page`, every layer (what a kernel's
// K/V append would have left there).
void fill_page(const PagedKVCache& cache, std::int32_t page, int value) {
  for (std::int32_t l = 0; l < cache.config().num_layers; ++l) {
    const PageBytes b = page_bytes_in_layer(cache, l, page);
    std::memset(b.k, value, b.k_bytes);
    std::memset(b.v, value, b.v_bytes);
  }
}

// --- machine floor -------------------------------------------------------------

// Cost of one steady_clock::now() (vDSO), the resolution floor of the manual
// timings below.
void BM_ClockNow(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Clock::now());
}
BENCHMARK(BM_ClockNow);

// memcpy bandwidth between two warm buffers of `bytes`: 256 KiB (the decode
// plan at page 16, fits L2), 2 MiB (one 16-token page over all layers, L3),
// 256 MiB (DRAM).
void BM_Memcpy(benchmark::State& state) {
  const auto bytes = static_cast<std::size_t>(state.range(0));
  MemcpyBaseline copy(bytes);
  copy.run();
  double total = 0;
  for (auto _ : state) {
    const double t = copy.run();
    state.SetIterationTime(t);
    total += t;
  }
  state.counters["GB/s"] =
      static_cast<double>(bytes) * static_cast<double>(state.iterations()) / total / 1e9;
}
BENCHMARK(BM_Memcpy)
    ->ArgName("bytes")
    ->Arg(256 << 10)
    ->Arg(2 << 20)
    ->Arg(256 << 20)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// Times of one begin_forward + end_forward (the manual iteration time) and
// of the same-process memcpy baseline, summed over a benchmark's iterations.
struct StepTimes {
  double begin = 0, end = 0, copy = 0;

  void time_step(benchmark::State& state, PagedKVCache& cache, std::span<const SeqId> ids,
                 std::span<const std::int64_t> lens) {
    const auto t0 = Clock::now();
    const BatchPlan& plan = cache.begin_forward(ids, lens);
    benchmark::DoNotOptimize(plan.slot_mapping.data());
    const auto t1 = Clock::now();
    mark_all_layers(cache);
    const auto t1_end = Clock::now();
    cache.end_forward();
    const auto t2 = Clock::now();
    state.SetIterationTime(seconds_between(t0, t1) + seconds_between(t1_end, t2));
    begin += seconds_between(t0, t1);
    end += seconds_between(t1_end, t2);
  }
  double step() const { return begin + end; }
  // The counters every step benchmark reports (per-iteration means).
  void report(benchmark::State& state, double entries, std::size_t plan_bytes) const {
    const auto n = static_cast<double>(state.iterations());
    state.counters["begin_us"] = begin / n * 1e6;
    state.counters["end_us"] = end / n * 1e6;
    state.counters["entries"] = entries;
    state.counters["plan_KiB"] = static_cast<double>(plan_bytes) / 1024.0;
    state.counters["memcpy_us"] = copy / n * 1e6;
    state.counters["x_memcpy"] = step() / copy;
  }
};

// --- decode step -------------------------------------------------------------

constexpr std::int64_t kDecodeContext = 4096;

// One decode step: begin_forward + end_forward appending 1 token to each of
// `batch` sequences that hold 4,095 tokens (so the step's plan has 4,096 keys
// per sequence), then pop_n(1) untimed to keep the state steady.
// Args: batch, page_size,
//   new_page: 0 = the new token lands in an existing page (15 steps of 16 at
//             page 16), 1 = every sequence starts a new page (they hold 4,096
//             tokens, the step takes one page each: the 1-in-16 step),
//   cold:     1 = CPU caches flushed before the step and before the baseline
//             (in a server the attention kernels run between two plans).
// At page 1 every step takes a page per sequence whatever new_page says.
void BM_DecodeStep(benchmark::State& state) {
  const auto batch = static_cast<std::int64_t>(state.range(0));
  const auto page_size = static_cast<std::int32_t>(state.range(1));
  const bool new_page = state.range(2) != 0;
  const bool cold = state.range(3) != 0;
  const std::int64_t prefix = new_page ? kDecodeContext : kDecodeContext - 1;

  PagedKVCache cache(model_config(page_size, batch * (prefix / page_size + 2) + 16));
  std::vector<SeqId> ids(static_cast<std::size_t>(batch));
  std::iota(ids.begin(), ids.end(), SeqId{0});
  for (SeqId id : ids) cache.add_sequence(id);
  {
    const std::vector<std::int64_t> prefill(ids.size(), prefix);
    cache.begin_forward(ids, prefill);
    end_metadata_step(cache);
  }
  const std::vector<std::int64_t> ones(ids.size(), 1);

  // Untimed warm-up step: sizes the plan's vectors (kept between steps).
  const BatchPlan& first = cache.begin_forward(ids, ones);
  const auto entries = static_cast<double>(first.kv_indices.size());
  const std::size_t bytes = plan_bytes(first);
  end_metadata_step(cache);
  for (SeqId id : ids) cache.pop_n(id, 1);
  MemcpyBaseline baseline(bytes);
  baseline.run();

  StepTimes t;
  for (auto _ : state) {
    if (cold) flush_caches();
    t.time_step(state, cache, ids, ones);
    for (SeqId id : ids) cache.pop_n(id, 1);
    if (cold) flush_caches();
    t.copy += baseline.run();
  }
  const auto n = static_cast<double>(state.iterations());
  t.report(state, entries, bytes);
  state.counters["Gentries/s"] = entries * n / t.step() / 1e9;
  state.counters["x_100us"] = t.step() / n / 100e-6;
}
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"batch", "page", "new_page", "cold"})
    ->Args({32, 16, 0, 0})
    ->Args({128, 16, 0, 0})
    ->Args({256, 16, 0, 0})
    ->Args({256, 16, 1, 0})
    ->Args({32, 1, 0, 0})
    ->Args({128, 1, 0, 0})
    ->Args({256, 1, 0, 0})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);
// Cold caches: each iteration also writes 2 x 64 MiB, so cap the iterations.
BENCHMARK(BM_DecodeStep)
    ->ArgNames({"batch", "page", "new_page", "cold"})
    ->Args({256, 16, 0, 1})
    ->Args({256, 16, 1, 1})
    ->Iterations(200)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// --- prefill step --------------------------------------------------------------

// One prefill step: `num_seqs` new (empty) sequences each appending `tokens`
// in one begin_forward + end_forward. add_sequence before and
// remove_sequence after are untimed. Args: num_seqs, tokens, page_size.
void BM_PrefillStep(benchmark::State& state) {
  const auto num_seqs = static_cast<std::int64_t>(state.range(0));
  const auto tokens = static_cast<std::int64_t>(state.range(1));
  const auto page_size = static_cast<std::int32_t>(state.range(2));
  const std::int64_t pages_each = (tokens + page_size - 1) / page_size;

  PagedKVCache cache(model_config(page_size, num_seqs * pages_each + 16));
  std::vector<SeqId> ids(static_cast<std::size_t>(num_seqs));
  std::iota(ids.begin(), ids.end(), SeqId{1000});
  const std::vector<std::int64_t> lens(ids.size(), tokens);

  for (SeqId id : ids) cache.add_sequence(id);
  const BatchPlan& first = cache.begin_forward(ids, lens);
  const auto entries = static_cast<double>(first.kv_indices.size());
  const std::size_t bytes = plan_bytes(first);
  end_metadata_step(cache);
  for (SeqId id : ids) cache.remove_sequence(id);
  MemcpyBaseline baseline(bytes);
  baseline.run();

  StepTimes t;
  for (auto _ : state) {
    for (SeqId id : ids) cache.add_sequence(id);
    t.time_step(state, cache, ids, lens);
    for (SeqId id : ids) cache.remove_sequence(id);
    t.copy += baseline.run();
  }
  const auto n = static_cast<double>(state.iterations());
  const auto total_tokens = static_cast<double>(num_seqs * tokens);
  t.report(state, entries, bytes);
  state.counters["ns/token"] = t.step() / n / total_tokens * 1e9;
}
BENCHMARK(BM_PrefillStep)
    ->ArgNames({"seqs", "tokens", "page"})
    ->Args({64, 512, 16})
    ->Args({16, 2048, 16})
    ->Args({4, 8192, 16})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

// --- fork ----------------------------------------------------------------------

constexpr std::int32_t kForkPageSize = 16;

// Builds a parent of `len` tokens (page 16) and writes data into its page
// at token `fork_pos` when that page would be copied by a fork there.
void make_fork_parent(PagedKVCache& cache, SeqId parent, std::int64_t len, std::int64_t fork_pos) {
  cache.add_sequence(parent);
  const SeqId ids[] = {parent};
  const std::int64_t lens[] = {len};
  cache.begin_forward(ids, lens);
  end_metadata_step(cache);
  if (fork_pos % kForkPageSize != 0)
    fill_page(cache,
              cache.sequence_pages(parent)[static_cast<std::size_t>(fork_pos / kForkPageSize)],
              0x3c);
}

// fork_sequence of a parent holding `len` tokens (page 16) into a child whose
// pages are resident (the pool hands the page the previous child returned
// straight back); remove_sequence of the child is untimed. Args: len, mode:
//   0: fork all `len` tokens (len % 16 == 0): pages shared, metadata only;
//   1: fork the first len - 1 tokens: 15 slots of the last page copied;
//   2: fork the first len - 8 tokens (mid-page): 8 slots copied.
// The parent's page at the fork point holds written data (as after decode).
void BM_Fork(benchmark::State& state) {
  const auto len = static_cast<std::int64_t>(state.range(0));
  const auto mode = state.range(1);
  const std::int64_t fork_pos = mode == 0 ? len : mode == 2 ? len - 8 : len - 1;

  PagedKVCache cache(model_config(kForkPageSize, len / kForkPageSize + 8));
  const SeqId parent = 0, child = 1;
  make_fork_parent(cache, parent, len, fork_pos);
  const std::int64_t shared_pages = fork_pos / kForkPageSize;
  const std::int64_t copied_slots = fork_pos % kForkPageSize;
  const std::int64_t copied_bytes = copied_slots * cache.bytes_per_page() / kForkPageSize;
  // Baseline: memcpy of the copied bytes, or of the shared page ids (int32)
  // when nothing is copied.
  const std::size_t baseline_bytes =
      copied_slots > 0 ? static_cast<std::size_t>(copied_bytes)
                       : static_cast<std::size_t>(shared_pages) * sizeof(std::int32_t);
  MemcpyBaseline baseline(baseline_bytes);
  baseline.run();
  cache.fork_sequence(parent, child, fork_pos);  // warm-up: makes the child's page resident
  cache.remove_sequence(child);

  double t_fork = 0, t_copy = 0;
  for (auto _ : state) {
    const auto t0 = Clock::now();
    cache.fork_sequence(parent, child, fork_pos);
    const auto t1 = Clock::now();
    state.SetIterationTime(seconds_between(t0, t1));
    t_fork += seconds_between(t0, t1);
    cache.remove_sequence(child);
    t_copy += baseline.run();
  }
  const auto n = static_cast<double>(state.iterations());
  state.counters["shared_pages"] = static_cast<double>(shared_pages);
  state.counters["copied_KiB"] = static_cast<double>(copied_bytes) / 1024.0;
  if (copied_slots > 0)
    state.counters["copy_GB/s"] = static_cast<double>(copied_bytes) * n / t_fork / 1e9;
  else  // metadata only: the whole cost per shared page (fixed part included)
    state.counters["ns/shared_page"] = t_fork / n / static_cast<double>(shared_pages) * 1e9;
  state.counters["memcpy_us"] = t_copy / n * 1e6;
  state.counters["x_memcpy"] = t_fork / t_copy;
}
BENCHMARK(BM_Fork)
    ->ArgNames({"len", "mode"})
    ->ArgsProduct({{1024, 4096, 16384, 32768}, {0, 1, 2}})
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

std::int64_t resident_bytes() {
  std::ifstream in("/proc/self/statm");
  std::int64_t size = 0, resident = 0;
  in >> size >> resident;
  return resident * 4096;
}

constexpr int kFirstTouchForks = 256;

// First use of a page: fork_sequence(parent of 32,768 tokens, at 32,767) into
// pages never touched before. Each iteration forks a new child that is kept,
// so the pool hands out a fresh page every time (256 forks, 512 MiB).
// Arg thp: 1 = the storage as the library maps it (MADV_HUGEPAGE: 2 MiB
// pages, so the first copy into a group of 64 cache pages faults in and
// zeroes a 2 MiB huge page in each of the 64 K/V regions, the next 63 copies
// fault nothing); 0 = the benchmark applies MADV_NOHUGEPAGE to the storage
// first (4 KiB faults on every copy). The baseline memcpy also writes into
// freshly evicted (4 KiB) memory. Counters: first_us / first_RSS_MiB = the
// very first fork, max_us = the slowest, RSS_MiB/fork = mean resident growth.
void BM_ForkFirstTouch(benchmark::State& state) {
  const bool thp = state.range(0) != 0;
  constexpr std::int64_t kLen = 32768, kForkPos = kLen - 1;
  PagedKVCache cache(model_config(kForkPageSize, kLen / kForkPageSize + kFirstTouchForks + 8));
  if (!thp)
    madvise(cache.layer_storage(0).k_data, static_cast<std::size_t>(cache.storage_bytes()),
            MADV_NOHUGEPAGE);
  const SeqId parent = 0;
  make_fork_parent(cache, parent, kLen, kForkPos);
  const std::int64_t copied_bytes =
      (kForkPos % kForkPageSize) * cache.bytes_per_page() / kForkPageSize;
  MemcpyBaseline baseline(static_cast<std::size_t>(copied_bytes));

  double t_fork = 0, t_copy = 0, t_max = 0, t_first = 0;
  std::int64_t rss_first = 0;
  const std::int64_t rss_start = resident_bytes();
  SeqId child = 1;
  for (auto _ : state) {
    const std::int64_t rss0 = child == 1 ? resident_bytes() : 0;
    const auto t0 = Clock::now();
    cache.fork_sequence(parent, child, kForkPos);
    const auto t1 = Clock::now();
    const double t = seconds_between(t0, t1);
    state.SetIterationTime(t);
    t_fork += t;
    t_max = t > t_max ? t : t_max;
    if (child == 1) {
      t_first = t;
      rss_first = resident_bytes() - rss0;
    }
    ++child;
    baseline.evict_destination();
    t_copy += baseline.run();
  }
  const std::int64_t rss_end = resident_bytes();
  for (SeqId c = 1; c < child; ++c) cache.remove_sequence(c);
  const auto n = static_cast<double>(state.iterations());
  state.counters["copied_KiB"] = static_cast<double>(copied_bytes) / 1024.0;
  state.counters["first_us"] = t_first * 1e6;
  state.counters["max_us"] = t_max * 1e6;
  state.counters["first_RSS_MiB"] = static_cast<double>(rss_first) / (1 << 20);
  state.counters["RSS_MiB/fork"] = static_cast<double>(rss_end - rss_start) / n / (1 << 20);
  state.counters["memcpy_us"] = t_copy / n * 1e6;
  state.counters["x_memcpy"] = t_fork / t_copy;
}
BENCHMARK(BM_ForkFirstTouch)
    ->ArgName("thp")
    ->Arg(1)
    ->Arg(0)
    ->Iterations(kFirstTouchForks)
    ->UseManualTime()
    ->Unit(benchmark::kMicrosecond);

std::string read_first_line(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::AddCustomContext("loadavg_at_start", read_first_line("/proc/loadavg"));
  benchmark::AddCustomContext(
      "kv_shape", "32 layers, 8 KV heads, head_dim 128, f16, HND (128 KiB per token, all layers)");
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  std::printf("loadavg_at_end: %s\n", read_first_line("/proc/loadavg").c_str());
  return 0;
}
