#include "machine_probes.h"

#include <immintrin.h>
#include <omp.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <new>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "kernels/cpu/amx_tile_config.h"

#include "pagedattn/errors.h"

namespace pagedattn::bench {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kHugePage = std::size_t{2} << 20;
constexpr std::size_t kReadBlock = 256;  // bytes per unrolled read-loop trip
constexpr int kChains = 12;              // independent accumulators per compute probe thread
constexpr int kStepsPerTrip = 2;         // steps of every chain per loop trip

double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

int resolve_threads(int threads) {
  return threads > 0 ? threads : std::max(1, omp_get_max_threads());
}

// Where a consumer can park results so that no probe loop is optimised away.
std::atomic<std::uint64_t> g_sink{0};

// --- read kernels ---------------------------------------------------------------

// Eight independent 256-bit XOR chains (1-cycle latency): the loop is bound by
// the loads alone. kPrefetch: each 256 bytes read, the 4 lines of `next` at
// the same offset are prefetched into L2 (prefetcht1, as the kernels do:
// prefetch.h), so a run's lines are in flight while the run before it is read.
// fma_rounds: each 256 bytes read also feed that many rounds of 8 FMAs (2 a
// line) on 8 independent f32 chains, arithmetic a kernel would do on what it
// reads (RunWork).
template <bool kPrefetch>
__attribute__((target("avx2,fma"), always_inline)) inline std::uint64_t read_avx2_chains(
    const std::byte* p, const std::byte* next, std::size_t bytes, int fma_rounds) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0,
          a7 = a0;
  __m256 w[8];
  for (__m256& x : w) x = _mm256_setzero_ps();
  // The touched bytes (0x5a each) read as f32 are about 1.5e16: times 2^-60
  // the chains grow by normal numbers far from overflow.
  const __m256 scale = _mm256_set1_ps(0x1p-60f);
  const std::byte* end = p + bytes / kReadBlock * kReadBlock;
  for (; p < end; p += kReadBlock) {
    if constexpr (kPrefetch) {
      for (std::size_t line = 0; line < kReadBlock; line += 64)
        _mm_prefetch(reinterpret_cast<const char*>(next + line), _MM_HINT_T1);
      next += kReadBlock;
    }
    const auto* v = reinterpret_cast<const __m256i*>(p);
    const __m256i x[8] = {_mm256_load_si256(v + 0), _mm256_load_si256(v + 1),
                          _mm256_load_si256(v + 2), _mm256_load_si256(v + 3),
                          _mm256_load_si256(v + 4), _mm256_load_si256(v + 5),
                          _mm256_load_si256(v + 6), _mm256_load_si256(v + 7)};
    a0 = _mm256_xor_si256(a0, x[0]);
    a1 = _mm256_xor_si256(a1, x[1]);
    a2 = _mm256_xor_si256(a2, x[2]);
    a3 = _mm256_xor_si256(a3, x[3]);
    a4 = _mm256_xor_si256(a4, x[4]);
    a5 = _mm256_xor_si256(a5, x[5]);
    a6 = _mm256_xor_si256(a6, x[6]);
    a7 = _mm256_xor_si256(a7, x[7]);
    for (int r = 0; r < fma_rounds; ++r)
      for (int i = 0; i < 8; ++i) w[i] = _mm256_fmadd_ps(_mm256_castsi256_ps(x[i]), scale, w[i]);
  }
  for (int i = 0; i < 8; ++i) a0 = _mm256_xor_si256(a0, _mm256_castps_si256(w[i]));
  a0 = _mm256_xor_si256(_mm256_xor_si256(_mm256_xor_si256(a0, a1), _mm256_xor_si256(a2, a3)),
                        _mm256_xor_si256(_mm256_xor_si256(a4, a5), _mm256_xor_si256(a6, a7)));
  alignas(32) std::uint64_t lanes[4];
  _mm256_store_si256(reinterpret_cast<__m256i*>(lanes), a0);
  return lanes[0] ^ lanes[1] ^ lanes[2] ^ lanes[3];
}

__attribute__((target("avx2,fma"), noinline)) std::uint64_t read_avx2(const std::byte* p,
                                                                      std::size_t bytes,
                                                                      int fma_rounds = 0) {
  return read_avx2_chains<false>(p, nullptr, bytes, fma_rounds);
}

__attribute__((target("avx2,fma"), noinline)) std::uint64_t read_avx2_prefetching(
    const std::byte* p, const std::byte* next, std::size_t bytes, int fma_rounds) {
  return read_avx2_chains<true>(p, next, bytes, fma_rounds);
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

// --- compute kernels ---------------------------------------------------------------
//
// Each runs kChains independent chains of one instruction, two steps per
// chain per trip. The empty asm ties every accumulator to a register each
// trip, so the compiler can neither spill nor fold the chains (the register
// copies it may add around the asm then cost 1 in 12 instructions, not 1 in 6:
// Zen 4 does not eliminate zmm copies). fp32 chains converge to c / (1 - m) = 1
// (no overflow, no denormals); the dot-product chains grow by a tiny step
// (bf16) or wrap (int32), neither of which changes the instruction's speed.

#define PAGEDATTN_CHAINS(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define PAGEDATTN_TIE_CHAINS()                                                                   \
  asm volatile(""                                                                                \
               : "+v"(a0), "+v"(a1), "+v"(a2), "+v"(a3), "+v"(a4), "+v"(a5), "+v"(a6), "+v"(a7), \
                 "+v"(a8), "+v"(a9), "+v"(a10), "+v"(a11))

__attribute__((noinline)) float mul_add_xmm(std::int64_t iterations) {
  const __m128 m = _mm_set1_ps(0.999999f), c = _mm_set1_ps(1e-6f);
#define INIT(i) __m128 a##i = _mm_set1_ps(0.5f + 0.1f * i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm_add_ps(_mm_mul_ps(a##i, m), c);
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m128 sum = _mm_setzero_ps();
#define SUM(i) sum = _mm_add_ps(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  alignas(16) float lanes[4];
  _mm_store_ps(lanes, sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3];
}

__attribute__((target("avx2,fma"), noinline)) float fma_ymm(std::int64_t iterations) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
#define INIT(i) __m256 a##i = _mm256_set1_ps(0.5f + 0.1f * i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm256_fmadd_ps(a##i, m, c);
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m256 sum = _mm256_setzero_ps();
#define SUM(i) sum = _mm256_add_ps(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, sum);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

// (_mm512_reduce_add_ps trips GCC 12's -Wuninitialized.)
__attribute__((target("avx512f"))) float sum_lanes(__m512 v) {
  alignas(64) float lanes[16];
  _mm512_store_ps(lanes, v);
  float total = 0.0f;
  for (float x : lanes) total += x;
  return total;
}

__attribute__((target("avx512f"), noinline)) float fma_zmm(std::int64_t iterations) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
#define INIT(i) __m512 a##i = _mm512_set1_ps(0.5f + 0.1f * i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm512_fmadd_ps(a##i, m, c);
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  return sum_lanes(sum);
}

// acc += a.even * b.even + a.odd * b.odd per fp32 lane: 1.0 x 2^-20 pairs.
__attribute__((target("avx512f,avx512bf16"), noinline)) float bf16_dot_zmm(
    std::int64_t iterations) {
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80);  // bf16 1.0
  const __m512bh y = (__m512bh)_mm512_set1_epi16(0x3580);  // bf16 2^-20
#define INIT(i) __m512 a##i = _mm512_set1_ps(0.5f + 0.1f * i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm512_dpbf16_ps(a##i, x, y);
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m512 sum = _mm512_setzero_ps();
#define SUM(i) sum = _mm512_add_ps(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  return sum_lanes(sum);
}

// acc += four u8 x s8 products per int32 lane (wrapping).
__attribute__((target("avx512f,avx512vnni"), noinline)) float int8_dot_zmm(
    std::int64_t iterations) {
  const __m512i x = _mm512_set1_epi8(3), y = _mm512_set1_epi8(-2);
#define INIT(i) __m512i a##i = _mm512_set1_epi32(i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) a##i = _mm512_dpbusd_epi32(a##i, x, y);
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m512i sum = _mm512_setzero_si512();
#define SUM(i) sum = _mm512_add_epi32(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  alignas(64) std::int32_t lanes[16];
  _mm512_store_si512(lanes, sum);
  std::int64_t total = 0;
  for (std::int32_t x : lanes) total += x;
  return float(total);
}

// acc = acc x (1 - 2^-10) + 2^-10 per f16 lane: stays near 1. f16 bits in
// __m512i and the instruction as assembly: clang 14 has the f16 intrinsics
// only where the whole translation unit targets AVX512-FP16.
__attribute__((target("avx512f,avx512bw"), noinline)) float f16_fma_zmm(std::int64_t iterations) {
  const __m512i m = _mm512_set1_epi16(0x3BFF);  // 1 - 2^-10
  const __m512i c = _mm512_set1_epi16(0x1400);  // 2^-10
#define INIT(i) __m512i a##i = _mm512_set1_epi16(0x3800 + 0x40 * i);
  PAGEDATTN_CHAINS(INIT)
#undef INIT
  for (std::int64_t n = 0; n < iterations; ++n) {
#define STEP(i) asm("vfmadd132ph %2, %1, %0" : "+v"(a##i) : "v"(c), "v"(m));  // a = a x m + c
    PAGEDATTN_CHAINS(STEP)
    PAGEDATTN_CHAINS(STEP)
#undef STEP
    PAGEDATTN_TIE_CHAINS();
  }
  __m512i sum = _mm512_setzero_si512();  // the chains' bits, so that none is dropped
#define SUM(i) sum = _mm512_xor_si512(sum, a##i);
  PAGEDATTN_CHAINS(SUM)
#undef SUM
  alignas(64) std::uint16_t lanes[32];
  _mm512_store_si512(lanes, sum);
  return float(lanes[0]) + float(lanes[31]);
}

#undef PAGEDATTN_TIE_CHAINS
#undef PAGEDATTN_CHAINS

// AMX: 4 accumulator tiles (16 x 16 f32) += 16 x 32 bf16 A tiles x 32 x 16
// B tiles, kChains x kStepsPerTrip tile products per trip like the other
// probes. The permission is requested by cpu_features() (amx_bf16).
inline constexpr pagedattn::kernels::TileConfig kAmxProbeConfig =
    pagedattn::kernels::uniform_tile_config(8, 16, 64);

__attribute__((target("amx-tile,amx-bf16"), noinline)) float bf16_amx(std::int64_t iterations) {
  static_assert(kChains * kStepsPerTrip == 24, "6 rounds of 4 accumulator tiles per trip");
  alignas(64) static const std::uint16_t ones[16 * 32] =
      {};  // zero bf16: the speed does not depend on it
  alignas(64) float out[16 * 16];
  pagedattn::kernels::use_tile_config(kAmxProbeConfig);
  _tile_loadd(0, ones, 64);
  _tile_loadd(1, ones, 64);
  _tile_loadd(2, ones, 64);
  _tile_loadd(3, ones, 64);
  _tile_zero(4);
  _tile_zero(5);
  _tile_zero(6);
  _tile_zero(7);
  for (std::int64_t n = 0; n < iterations; ++n) {
#define ROUND()            \
  _tile_dpbf16ps(4, 0, 2); \
  _tile_dpbf16ps(5, 0, 3); \
  _tile_dpbf16ps(6, 1, 2); \
  _tile_dpbf16ps(7, 1, 3);
    ROUND() ROUND() ROUND() ROUND() ROUND() ROUND()
#undef ROUND
  }
  _tile_stored(4, out, 64);
  _tile_release();
  return out[0];
}

// Operations per chain step of each class (two steps per loop trip).
double ops_per_chain_step(PeakClass c) {
  switch (c) {
    case PeakClass::kFp32MulAddXmm:
      return 4 * 2;  // a multiply and an add per lane
    case PeakClass::kFp32FmaYmm:
      return 8 * 2;
    case PeakClass::kFp32FmaZmm:
      return 16 * 2;
    case PeakClass::kBf16DotZmm:
      return 16 * 2 * 2;
    case PeakClass::kInt8DotZmm:
      return 16 * 4 * 2;
    case PeakClass::kBf16Amx:
      return 16 * 16 * 32 * 2;
    case PeakClass::kF16FmaZmm:
      return 32 * 2;
  }
  return 0;
}

float run_compute_kernel(PeakClass c, std::int64_t iterations) {
  switch (c) {
    case PeakClass::kFp32MulAddXmm:
      return mul_add_xmm(iterations);
    case PeakClass::kFp32FmaYmm:
      return fma_ymm(iterations);
    case PeakClass::kFp32FmaZmm:
      return fma_zmm(iterations);
    case PeakClass::kBf16DotZmm:
      return bf16_dot_zmm(iterations);
    case PeakClass::kInt8DotZmm:
      return int8_dot_zmm(iterations);
    case PeakClass::kF16FmaZmm:
      return f16_fma_zmm(iterations);
    case PeakClass::kBf16Amx:
      return bf16_amx(iterations);
  }
  return 0.0f;
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
  return pagedattn::cpu_features().avx2;
}

bool cpu_has_avx2_fma() {
  return cpu_has_avx2() && pagedattn::cpu_features().fma;
}

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
  const bool avx2 = cpu_has_avx2_fma();
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

double read_runs_pass_seconds(const std::byte* p, std::size_t bytes, std::size_t run_bytes,
                              int threads, RunPrefetch prefetch, RunWork work) {
  threads = resolve_threads(threads);
  run_bytes = std::max(kReadBlock, run_bytes / kReadBlock * kReadBlock);
  const std::size_t runs = bytes / run_bytes;
  // The same shuffled order every pass (seeded), made before the clock starts.
  std::vector<std::uint32_t> order(runs);
  for (std::size_t i = 0; i < runs; ++i) order[i] = static_cast<std::uint32_t>(i);
  std::shuffle(order.begin(), order.end(), std::mt19937(2026));
  const bool avx2 = cpu_has_avx2_fma();
  const bool prefetching = prefetch == RunPrefetch::kTwoRunsAhead && avx2;
  // Work without AVX2 + FMA: the loads alone.
  const int fma_rounds = avx2 ? std::max(0, work.fmas_per_line / 2) : 0;
  const int repeat = std::max(1, work.repeat);
  std::uint64_t sink = 0;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(^ : sink)
  {
    // Thread t reads runs t, t + n, t + 2n, ... (in the shuffled order) and
    // prefetches the run it reads two runs later (its last runs: their own).
    const std::size_t t = static_cast<std::size_t>(omp_get_thread_num());
    const std::size_t n = static_cast<std::size_t>(omp_get_num_threads());
    for (int rep = 0; rep < repeat; ++rep)
      for (std::size_t i = t; i < runs; i += n) {
        const std::byte* run = p + std::size_t(order[i]) * run_bytes;
        if (prefetching) {
          const std::size_t ahead = i + 2 * n < runs ? i + 2 * n : i;
          sink ^= read_avx2_prefetching(run, p + std::size_t(order[ahead]) * run_bytes, run_bytes,
                                        fma_rounds);
        } else {
          sink ^= avx2 ? read_avx2(run, run_bytes, fma_rounds) : read_scalar(run, run_bytes);
        }
      }
  }
  const double s = seconds_since(t0);
  g_sink.fetch_xor(sink, std::memory_order_relaxed);
  return s;
}

namespace {

// `passes` timed passes of `pass` over `buf` (touched), after one untimed
// warm-up (TLB, threads, clocks).
template <class Pass>
ReadBandwidthResult time_read_passes(const HugeBuffer& buf, int passes, int threads,
                                     const Pass& pass) {
  ReadBandwidthResult r;
  r.threads = resolve_threads(threads);
  r.passes = std::max(1, passes);
  r.isa = cpu_has_avx2_fma() ? "avx2" : "scalar";
  const CpuSample s0 = sample_cpu();
  r.bytes = buf.size() / kReadBlock * kReadBlock;
  pass(buf.data(), r.bytes, r.threads);
  std::vector<double> gbps;
  for (int i = 0; i < r.passes; ++i)
    gbps.push_back(double(r.bytes) / pass(buf.data(), r.bytes, r.threads) / 1e9);
  const Spread spread = spread_of(gbps);
  r.min_gbps = spread.min;
  r.median_gbps = spread.median;
  r.best_gbps = spread.max;
  r.mean_gbps = spread.mean;
  r.other_cores = other_cores_between(s0, sample_cpu());
  return r;
}

HugeBuffer touched_buffer(std::size_t bytes) {
  HugeBuffer buf(bytes);
  touch_parallel(buf.data(), buf.size());
  return buf;
}

}  // namespace

Spread spread_of(std::vector<double> values) {
  if (values.empty()) return {};
  std::sort(values.begin(), values.end());
  double sum = 0.0;
  for (double x : values) sum += x;
  const std::size_t n = values.size();
  const double median = n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
  return {values.front(), median, values.back(), sum / double(n)};
}

ReadBandwidthResult measure_read_bandwidth(std::size_t bytes, int passes, int threads) {
  return time_read_passes(
      touched_buffer(bytes), passes, threads,
      [](const std::byte* p, std::size_t b, int t) { return read_pass_seconds(p, b, t); });
}

PagedReadProbe::PagedReadProbe(std::size_t run_bytes, std::size_t bytes, int threads)
    : buf_(touched_buffer(bytes)), run_bytes_(run_bytes), threads_(threads) {}

ReadBandwidthResult PagedReadProbe::measure(int passes) const {
  const std::size_t run_bytes = run_bytes_;
  ReadBandwidthResult r = time_read_passes(
      buf_, passes, threads_, [run_bytes](const std::byte* p, std::size_t b, int t) {
        return read_runs_pass_seconds(p, b, run_bytes, t, RunPrefetch::kTwoRunsAhead);
      });
  r.run_bytes = std::max(kReadBlock, run_bytes / kReadBlock * kReadBlock);
  return r;
}

ReadBandwidthResult measure_paged_read_bandwidth(std::size_t run_bytes, std::size_t bytes,
                                                 int passes, int threads) {
  return PagedReadProbe(run_bytes, bytes, threads).measure(passes);
}

const char* peak_class_name(PeakClass c) {
  switch (c) {
    case PeakClass::kFp32MulAddXmm:
      return "fp32 mul+add xmm (mulps, addps)";
    case PeakClass::kFp32FmaYmm:
      return "fp32 FMA ymm (vfmadd231ps)";
    case PeakClass::kFp32FmaZmm:
      return "fp32 FMA zmm (vfmadd231ps)";
    case PeakClass::kBf16DotZmm:
      return "bf16 dot zmm (vdpbf16ps)";
    case PeakClass::kInt8DotZmm:
      return "int8 dot zmm (vpdpbusd)";
    case PeakClass::kBf16Amx:
      return "bf16 AMX tiles (tdpbf16ps)";
    case PeakClass::kF16FmaZmm:
      return "f16 FMA zmm (vfmadd231ph)";
  }
  return "?";
}

const char* peak_class_unit(PeakClass c) {
  return c == PeakClass::kInt8DotZmm ? "GOP/s" : "GFLOP/s";
}

bool peak_class_available(PeakClass c) {
  const pagedattn::CpuFeatures f = pagedattn::cpu_features();
  switch (c) {
    case PeakClass::kFp32MulAddXmm:
      return true;
    case PeakClass::kFp32FmaYmm:
      return f.avx2 && f.fma;
    case PeakClass::kFp32FmaZmm:
      return f.avx512f;
    case PeakClass::kBf16DotZmm:
      return f.avx512f && f.avx512_bf16;
    case PeakClass::kInt8DotZmm:
      return f.avx512f && f.avx512_vnni;
    case PeakClass::kBf16Amx:
      return f.amx_bf16;
    case PeakClass::kF16FmaZmm:
      return f.avx512f && f.avx512_fp16;
  }
  return false;
}

double compute_pass_ops_per_thread(PeakClass c, std::int64_t iterations) {
  return double(iterations) * kChains * kStepsPerTrip * ops_per_chain_step(c);
}

double compute_pass_seconds(PeakClass c, std::int64_t iterations, int threads) {
  require<pagedattn::Unsupported>(peak_class_available(c), peak_class_name(c),
                                  ": this CPU does not support it");
  threads = resolve_threads(threads);
  float sink = 0.0f;
  const auto t0 = Clock::now();
#pragma omp parallel num_threads(threads) reduction(+ : sink)
  sink += run_compute_kernel(c, iterations);
  const double s = seconds_since(t0);
  g_sink.fetch_add(static_cast<std::uint64_t>(std::fabs(sink)), std::memory_order_relaxed);
  return s;
}

ComputePeakResult measure_compute_peak(PeakClass c, double seconds_per_pass, int passes,
                                       int threads) {
  ComputePeakResult r;
  r.peak_class = c;
  r.isa = peak_class_name(c);
  r.threads = resolve_threads(threads);
  r.passes = std::max(1, passes);
  r.accumulators = kChains;
  r.available = peak_class_available(c);
  if (!r.available) return r;
  const CpuSample s0 = sample_cpu();
  // Calibrate: grow a pass until it takes >= 10 ms, then scale to the target.
  std::int64_t iterations = 1 << 16;
  double s = compute_pass_seconds(c, iterations, r.threads);
  while (s < 0.01) {
    iterations *= 4;
    s = compute_pass_seconds(c, iterations, r.threads);
  }
  iterations = std::max<std::int64_t>(1, std::int64_t(double(iterations) * seconds_per_pass / s));
  const double ops = compute_pass_ops_per_thread(c, iterations) * r.threads;
  std::vector<double> rates;
  for (int i = 0; i < r.passes; ++i)
    rates.push_back(ops / compute_pass_seconds(c, iterations, r.threads) / 1e9);
  const Spread spread = spread_of(rates);
  r.min_gflops = spread.min;
  r.median_gflops = spread.median;
  r.best_gflops = spread.max;
  r.mean_gflops = spread.mean;
  r.other_cores = other_cores_between(s0, sample_cpu());
  return r;
}

PeakClass widest_fp32_class() {
  if (peak_class_available(PeakClass::kFp32FmaZmm)) return PeakClass::kFp32FmaZmm;
  if (peak_class_available(PeakClass::kFp32FmaYmm)) return PeakClass::kFp32FmaYmm;
  return PeakClass::kFp32MulAddXmm;
}

double fma_pass_seconds(std::int64_t iterations, int threads) {
  return compute_pass_seconds(widest_fp32_class(), iterations, threads);
}

double fma_pass_flops_per_thread(std::int64_t iterations) {
  return compute_pass_ops_per_thread(widest_fp32_class(), iterations);
}

FmaPeakResult measure_fma_peak(double seconds_per_pass, int passes, int threads) {
  return measure_compute_peak(widest_fp32_class(), seconds_per_pass, passes, threads);
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
      [] { return measure_read_bandwidth(); },
      [](const ReadBandwidthResult& x) { return x.best_gbps; });
  return r;
}

// best_quiet_measurement of `measure(key)`, once per key for the process.
template <class Key, class Result, class Measure, class Score>
const Result& measured_once_per_key(Key key, const Measure& measure, const Score& score) {
  static std::mutex mutex;
  static std::map<Key, Result> measured;
  const std::lock_guard lock(mutex);
  auto it = measured.find(key);
  if (it == measured.end())
    it = measured.emplace(key, best_quiet_measurement<Result>([&] { return measure(key); }, score))
             .first;
  return it->second;
}

const ReadBandwidthResult& machine_paged_read_bandwidth(std::size_t run_bytes) {
  return measured_once_per_key<std::size_t, ReadBandwidthResult>(
      run_bytes, [](std::size_t b) { return measure_paged_read_bandwidth(b); },
      [](const ReadBandwidthResult& x) { return x.best_gbps; });
}

const ComputePeakResult& machine_compute_peak(PeakClass c) {
  return measured_once_per_key<PeakClass, ComputePeakResult>(
      c, [](PeakClass k) { return measure_compute_peak(k); },
      [](const ComputePeakResult& x) { return x.best_gflops; });
}

const FmaPeakResult& machine_fma_peak() {
  return machine_compute_peak(widest_fp32_class());
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

}  // namespace pagedattn::bench
