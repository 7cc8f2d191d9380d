#include "machine_probes.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <fstream>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace pagedattn::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kReadBlock = 256;  // bytes per unrolled read-loop trip
constexpr int kFmaChains = 12;           // independent accumulators per thread

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int resolve_threads(int threads) { return threads > 0 ? threads : std::max(1, omp_get_max_threads()); }

// Where a consumer can park results so that no probe loop is optimised away.
std::atomic<std::uint64_t> g_sink{0};

// --- read kernels ---------------------------------------------------------------

// Eight independent 256-bit XOR chains (1-cycle latency): the loop is bound by
// the loads alone.
__attribute__((target("avx2"), noinline)) std::uint64_t read_avx2(const std::byte* p,
                                                                   std::size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
          a7 = a0;
  const std::byte* end = p + bytes / kReadBlock * kReadBlock;
  for (; p < end; p += kReadBlock) {
    const auto* v = reinterpret_cast<const __m256i*>(p);
    a0 = _mm256_xor_si256(a0, _mm256_load_si256(v + 0));
    a1 = _mm256_xor_si256(a1, _mm256_load_si256(v + 1));
    a2 = _mm256_xor_si256(a2, _mm256_load_si256(v + 2));
    a3 = _mm256_xor_si256(a3, _mm256_load_si256(v + 3));
    a4 = _mm256_xor_si256(a4, _mm256_load_si256(v + 4));
    a5 = _mm256_xor_si256(a5, _mm256_load_si256(v + 5));
    a6 = _mm256_xor_si256(a6, _mm256_load_si256(v + 6));
    a7 = _mm256_xor_si256(a7, _mm256_load_si256(v + 7));
  }
  a0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)),
                        _mm256_xor_si256(_mm256_xor_si256(a4, a5), _mm256_xor_si256(a6, a7)));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

__attribute__((noinline)) std::uint64_t read_scalar(const std::byte* p, std::size_t bytes) {
  std::uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  const auto* w = reinterpret_cast<const std::uint64_t*>(p);
  const std::size_t n = bytes / kReadBlock * kReadBlock / sizeof(std::uint64_t);
  for (std::size_t i = 0; i < n; i += 4) {
    a0 ^= w[i];
    a1 ^= w[i + 1];
    a2 ^= w[i + 2];
    a3 ^= w[i + 3];
  }
  return a0 ^ a1 ^ a2 ^ a3;
}

// --- FMA kernels ----------------------------------------------------------------

// 12 chains x 8 lanes x 2 FLOP per trip. Each chain converges to c / (1 - m)
// = 1 (no overflow, no denormals). The empty asm ties every accumulator to a
// register each trip, so the compiler can neither spill nor fold the chains.
__attribute__((target("avx2,fma"), noinline)) float fma_avx2(std::int64_t iterations) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a0 = _mm256_set1_ps(0.5f), a1 = _mm256_set1_ps(0.6f), a2 = _mm256_set1_ps(0.7f),
         a3 = _mm256_set1_ps(0.8f), a4 = _mm256_set1_ps(0.9f), a5 = _mm256_set1_ps(1.1f),
         a6 = _mm256_set1_ps(1.2f), a7 = _mm256_set1_ps(1.3f), a8 = _mm256_set1_ps(1.4f),
         a9 = _mm256_set1_ps(1.5f), a10 = _mm256_set1_ps(1.6f), a11 = _mm256_set1_ps(1.7f);
  for (std::int64_t i = 0; i < iterations; ++i) {
    a0 = _mm256_fmadd_ps(a0, m, c);
    a1 = _mm256_fmadd_ps(a1, m, c);
    a2 = _mm256_fmadd_ps(a2, m, c);
    a3 = _mm256_fmadd_ps(a3, m, c);
    a4 = _mm256_fmadd_ps(a4, m, c);
    a5 = _mm256_fmadd_ps(a5, m, c);
    a6 = _mm256_fmadd_ps(a6, m, c);
    a7 = _mm256_fmadd_ps(a7, m, c);
    a8 = _mm256_fmadd_ps(a8, m, c);
    a9 = _mm256_fmadd_ps(a9, m, c);
    a10 = _mm256_fmadd_ps(a10, m, c);
    a11 = _mm256_fmadd_ps(a11, m, c);
    asm volatile(""
                 : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                   "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  const __m256 s = _mm256_add_ps(
      _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)),
                    _mm256_add_ps(_mm256_add_ps(a4, a5), _mm256_add_ps(a6, a7))),
      _mm256_add_ps(_mm256_add_ps(a8, a9), _mm256_add_ps(a10, a11)));
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, s);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

// Scalar fallback: multiply + add (2 FLOP) per chain per trip.
__attribute__((noinline)) float fma_scalar(std::int64_t iterations) {
  const float m = 0.999999f, c = 1e-6f;
  float a[kFmaChains];
  for (int j = 0; j < kFmaChains; ++j) a[j] = 0.5f + 0.1f * float(j);
  float a0 = a[0], a1 = a[1], a2 = a[2], a3 = a[3], a4 = a[4], a5 = a[5], a6 = a[6], a7 = a[7],
        a8 = a[8], a9 = a[9], a10 = a[10], a11 = a[11];
  for (std::int64_t i = 0; i < iterations; ++i) {
    a0 = a0 * m + c;
    a1 = a1 * m + c;
    a2 = a2 * m + c;
    a3 = a3 * m + c;
    a4 = a4 * m + c;
    a5 = a5 * m + c;
    a6 = a6 * m + c;
    a7 = a7 * m + c;
    a8 = a8 * m + c;
    a9 = a9 * m + c;
    a10 = a10 * m + c;
    a11 = a11 * m + c;
    asm volatile(""
                 : "+x"(a0), "+x"(a1), "+x"(a2), "+x"(a3), "+x"(a4), "+x"(a5), "+x"(a6),
                   "+x"(a7), "+x"(a8), "+x"(a9), "+x"(a10), "+x"(a11));
  }
  return a0 + a1 + a2 + a3 + a4 + a5 + a6 + a7 + a8 + a9 + a10 + a11;
}

}  // namespace

// --- HugeBuffer -------------------------------------------------------------------

HugeBuffer::HugeBuffer(std::size_t bytes) {
  bytes_ = std::max(kHugePage, (bytes + kHugePage - 1) / kHugePage * kHugePage);
  // Over-map by one huge page so the start can be 2 MiB aligned.
  const std::size_t mapped = bytes_ + kHugePage;
  void* p = mmap(nullptr, mapped, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) throw std::bad_alloc();
  const auto base = reinterpret_cast<std::uintptr_t>(p);
  const std::uintptr_t aligned = (base + kHugePage - 1) / kHugePage * kHugePage;
  if (aligned > base) munmap(p, aligned - base);
  const std::size_t tail = base + mapped - (aligned + bytes_);
  if (tail > 0) munmap(reinterpret_cast<void*>(aligned + bytes_), tail);
  data_ = reinterpret_cast<std::byte*>(aligned);
  madvise(data_, bytes_, MADV_HUGEPAGE);  // best effort: THP may be off
}

HugeBuffer::~HugeBuffer() {
  if (data_) munmap(data_, bytes_);
}

HugeBuffer::HugeBuffer(HugeBuffer&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)), bytes_(std::exchange(other.bytes_, 0)) {}

HugeBuffer& HugeBuffer::operator=(HugeBuffer&& other) noexcept {
  if (this != &other) {
    if (data_) munmap(data_, bytes_);
    data_ = std::exchange(other.data_, nullptr);
    bytes_ = std::exchange(other.bytes_, 0);
  }
  return *this;
}

// --- probes -------------------------------------------------------------------------

bool cpu_has_avx2() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2");
}

bool cpu_has_avx2_fma() { return cpu_has_avx2() && __builtin_cpu_supports("fma"); }

void touch_parallel(std::byte* p, std::size_t bytes) {
  const int threads = resolve_threads(0);
#pragma omp parallel num_threads(threads)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t n = static_cast<std::size_t>(omp_get_num_threads());
    const std::size_t begin = bytes * t / n, end = bytes * (t + 1) / n;
    std::memset(p + begin, 0x5a, end - begin);
  }
}

double read_pass_seconds(const std::byte* p, std::size_t bytes, int threads) {
  threads = resolve_threads(threads);
  const bool avx2 = cpu_has_avx2();
  std::uint64_t sink = 0;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
  {
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t n = static_cast<std::size_t>(omp_get_num_threads());
    // Slices on 256-byte boundaries (the buffer is 2 MiB aligned).
    const std::size_t blocks = bytes / kReadBlock;
    const std::size_t begin = blocks * t / n * kReadBlock, end = blocks * (t + 1) / n * kReadBlock;
    sink ^= avx2 ? read_avx2(p + begin, end - begin) : read_scalar(p + begin, end - begin);
  }
  const double s = seconds_since(t0);
  g_sink.fetch_xor(sink, std::memory_order_relaxed);
  return s;
}

double read_runs_pass_seconds(const std::byte* p, std::size_t bytes, std::size_t run_bytes, int threads) {
  threads = resolve_threads(threads);
  run_bytes = std::max(kReadBlock, run_bytes / kReadBlock * kReadBlock);
  const std::size_t runs = bytes / run_bytes;
  // The same shuffled order every pass (seeded), made before the clock starts.
  std::vector<std::uint32_t> order(runs);
  for (std::size_t i = 0; i < runs; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(2026));
  const bool avx2 = cpu_has_avx2();
  std::uint64_t sink = 0;
  const auto t0 = Clock::now();
#pragma omp parallel for num_threads(threads) schedule(static, 1) reduction(^ : sink)
  for (std::size_t i = 0; i < runs; ++i) {
    const std::byte* run = p + std::size_t(order[i]) * run_bytes;
    sink ^= avx2 ? read_avx2(run, run_bytes) : read_scalar(run, run_bytes);
  }
  const double s = seconds_since(t0);
  g_sink.fetch_xor(sink, std::memory_order_relaxed);
  return s;
}

ReadBandwidthResult measure_read_bandwidth(std::size_t bytes, int passes, int threads) {
  ReadBandwidthResult r;
  r.threads = resolve_threads(threads);
  r.passes = std::max(1, passes);
  r.isa = cpu_has_avx2() ? "avx2" : "scalar";
  HugeBuffer buf(bytes);
  const CpuSample s0 = sample_cpu();
  r.bytes = bytes / kReadBlock * kReadBlock;
  touch_parallel(buf.data(), buf.size());
  read_pass_seconds(buf.data(), r.bytes, r.threads);  // warm-up (TLB, threads, clocks)
  double best = 0.0, sum = 0.0;
  for (int i = 0; i < r.passes; ++i) {
    const double gbps = double(r.bytes) / read_pass_seconds(buf.data(), r.bytes, r.threads) / 1e9;
    best = std::max(best, gbps);
    sum += gbps;
  }
  r.best_gbps = best;
  r.mean_gbps = sum / r.passes;
  r.other_cores = other_cores_between(s0, sample_cpu());
  return r;
}

double fma_pass_flops_per_thread(std::int64_t iterations) {
  const double lanes = cpu_has_avx2_fma() ? 8.0 : 1.0;
  return double(iterations) * kFmaChains * lanes * 2.0;
}

double fma_pass_seconds(std::int64_t iterations, int threads) {
  threads = resolve_threads(threads);
  const bool avx2 = cpu_has_avx2_fma();
  float sink = 0.0f;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += avx2 ? fma_avx2(iterations) : fma_scalar(iterations);
  const double s = seconds_since(t0);
  g_sink.fetch_add(static_cast<std::uint64_t>(sink), std::memory_order_relaxed);
  return s;
}

FmaPeakResult measure_fma_peak(double seconds_per_pass, int passes, int threads) {
  FmaPeakResult r;
  r.threads = resolve_threads(threads);
  r.passes = std::max(1, passes);
  r.accumulators = kFmaChains;
  r.isa = cpu_has_avx2_fma() ? "avx2+fma" : "scalar";
  const CpuSample s0 = sample_cpu();
  // Calibrate: grow a pass until it takes >= 10 ms, then scale to the target.
  std::int64_t iterations = 1 << 16;
  double s = fma_pass_seconds(iterations, r.threads);
  while (s < 0.01) {
    iterations *= 4;
    s = fma_pass_seconds(iterations, r.threads);
  }
  iterations = std::max<std::int64_t>(1, std::int64_t(double(iterations) * seconds_per_pass / s));
  double best = 0.0, sum = 0.0;
  for (int i = 0; i < r.passes; ++i) {
    const double gflops =
        fma_pass_flops_per_thread(iterations) * r.threads / fma_pass_seconds(iterations, r.threads) / 1e9;
    best = std::max(best, gflops);
    sum += gflops;
  }
  r.best_gflops = best;
  r.mean_gflops = sum / r.passes;
  r.other_cores = other_cores_between(s0, sample_cpu());
  return r;
}

namespace {

constexpr double kQuietCores = 0.1;
constexpr int kProbeAttempts = 3;

// Best of up to kProbeAttempts measurements, stopping at the first quiet one.
template <class Result, class Measure, class Value>
Result best_quiet_measurement(Measure measure, Value value) {
  Result best = measure();
  for (int attempt = 1; attempt < kProbeAttempts && best.other_cores > kQuietCores; ++attempt) {
    wait_for_quiet(30.0, kQuietCores);
    Result again = measure();
    if (value(again) >= value(best) || again.other_cores <= kQuietCores) best = std::move(again);
  }
  return best;
}

}  // namespace

const ReadBandwidthResult& machine_read_bandwidth() {
  static const ReadBandwidthResult r = best_quiet_measurement<ReadBandwidthResult>(
      [] { return measure_read_bandwidth(); }, [](const ReadBandwidthResult& x) { return x.best_gbps; });
  return r;
}

const FmaPeakResult& machine_fma_peak() {
  static const FmaPeakResult r = best_quiet_measurement<FmaPeakResult>(
      [] { return measure_fma_peak(); }, [](const FmaPeakResult& x) { return x.best_gflops; });
  return r;
}

bool wait_for_quiet(double limit_seconds, double max_other_cores) {
  const auto t0 = Clock::now();
  while (seconds_since(t0) < limit_seconds) {
    const CpuSample a = sample_cpu();
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (other_cores_between(a, sample_cpu()) < max_other_cores) return true;
  }
  return false;
}

CpuSample sample_cpu() {
  CpuSample s;
  s.wall_seconds = std::chrono::duration<double>(Clock::now().time_since_epoch()).count();
  {
    std::ifstream f("/proc/stat");
    std::string cpu;
    std::int64_t user = 0, nice = 0, system = 0, idle = 0, iowait = 0, irq = 0, softirq = 0, steal = 0;
    if (f >> cpu >> user >> nice >> system >> idle >> iowait >> irq >> softirq >> steal && cpu == "cpu") {
      s.busy_ticks = user + nice + system + irq + softirq;
      s.steal_ticks = steal;
    }
  }
  {
    // Fields 14 and 15 (utime, stime) follow the parenthesised command name.
    std::ifstream f("/proc/self/stat");
    std::string line;
    std::getline(f, line);
    const std::size_t close = line.rfind(')');
    if (close != std::string::npos) {
      std::istringstream rest(line.substr(close + 2));
      std::string field;
      std::int64_t utime = 0, stime = 0;
      for (int i = 3; i <= 13; ++i) rest >> field;
      if (rest >> utime >> stime) s.self_ticks = utime + stime;
    }
  }
  return s;
}

double other_cores_between(const CpuSample& a, const CpuSample& b) {
  const double wall = b.wall_seconds - a.wall_seconds;
  const double hz = double(sysconf(_SC_CLK_TCK));
  if (wall <= 0.0 || hz <= 0.0) return 0.0;
  const double others = double((b.busy_ticks - a.busy_ticks) - (b.self_ticks - a.self_ticks)) +
                        double(b.steal_ticks - a.steal_ticks);
  return std::max(0.0, others / hz / wall);
}

std::size_t l3_cache_bytes(std::size_t fallback) {
  // sysfs describes what this (virtual) machine exposes; sysconf may report
  // the host's figure instead.
  for (int index = 0; index < 8; ++index) {
    const std::string dir = "/sys/devices/system/cpu/cpu0/cache/index" + std::to_string(index) + "/";
    std::ifstream level_file(dir + "level"), size_file(dir + "size");
    int level = 0;
    std::string size;
    if (!(level_file >> level) || !(size_file >> size) || level != 3 || size.empty()) continue;
    std::size_t multiplier = 1;
    if (size.back() == 'K') multiplier = std::size_t{1} << 10;
    if (size.back() == 'M') multiplier = std::size_t{1} << 20;
    if (multiplier != 1) size.pop_back();
    try {
      return std::stoull(size) * multiplier;
    } catch (...) {
      continue;
    }
  }
  return fallback;
}

}  // namespace pagedattn::bench
