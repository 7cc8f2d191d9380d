// Machine-limit probes for the attention benchmarks: what this machine can do
// at best, measured in the same process, so that every kernel can be reported
// as a fraction of it.
//
//   * read bandwidth: all OpenMP threads stream-read a buffer (default 1 GiB,
//     well above any L3; huge-page advised and pre-touched) with 256-bit loads;
//     best of 30 passes (about 1 s), in GB/s (1e9 bytes per second);
//   * fp32 FMA peak: all OpenMP threads run 12 independent AVX2 FMA chains
//     held in registers; best of several passes, in GFLOP/s (an FMA is 2 FLOP).
//
// Both fall back to scalar code when the CPU lacks AVX2 / FMA (checked at run
// time; the probe file is compiled for the baseline ISA with function-level
// target attributes), and say so in `isa`.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace pagedattn::bench {

struct ReadBandwidthResult {
  double best_gbps = 0.0;  // best pass
  double mean_gbps = 0.0;  // mean over passes
  double other_cores = 0.0;  // others' CPU use meanwhile (other_cores_between)
  std::size_t bytes = 0;   // buffer size
  int passes = 0;
  int threads = 0;
  std::string isa;         // "avx2" or "scalar"
};

struct FmaPeakResult {
  double best_gflops = 0.0;
  double mean_gflops = 0.0;
  double other_cores = 0.0;  // others' CPU use meanwhile (other_cores_between)
  int passes = 0;
  int threads = 0;
  int accumulators = 0;    // independent FMA chains per thread
  std::string isa;         // "avx2+fma" or "scalar"
};

// A buffer of `bytes` from mmap, advised for transparent huge pages; not
// touched (callers decide which threads touch it first). Throws std::bad_alloc.
class HugeBuffer {
 public:
  HugeBuffer() = default;
  explicit HugeBuffer(std::size_t bytes);
  ~HugeBuffer();
  HugeBuffer(HugeBuffer&& other) noexcept;
  HugeBuffer& operator=(HugeBuffer&& other) noexcept;
  HugeBuffer(const HugeBuffer&) = delete;
  HugeBuffer& operator=(const HugeBuffer&) = delete;

  std::byte* data() const { return data_; }
  std::size_t size() const { return bytes_; }

 private:
  std::byte* data_ = nullptr;
  std::size_t bytes_ = 0;
};

// Fills `bytes` at `p` with a non-zero pattern using all OpenMP threads, each
// thread writing the slice it will later read (first touch).
void touch_parallel(std::byte* p, std::size_t bytes);

// One read pass of `bytes` at `p` by `threads` threads (0: OpenMP maximum);
// returns its wall time in seconds.
double read_pass_seconds(const std::byte* p, std::size_t bytes, int threads);

// One read pass over `bytes` at `p` as runs of `run_bytes` (a multiple of
// 256) visited in a shuffled order, like the K/V of one head in a paged cache
// (a 4 KiB run: one f16 page of 16 tokens x 128 dims); the runs are dealt to
// the threads in turn. Returns its wall time in seconds.
double read_runs_pass_seconds(const std::byte* p, std::size_t bytes, std::size_t run_bytes, int threads);

// Fresh measurements (allocate, touch, run `passes` passes, free).
ReadBandwidthResult measure_read_bandwidth(std::size_t bytes = std::size_t{1} << 30,
                                           int passes = 30, int threads = 0);
// One FMA-probe pass of `iterations` loop trips per thread; returns seconds.
double fma_pass_seconds(std::int64_t iterations, int threads);
// FLOPs one thread performs in one pass of `iterations` trips.
double fma_pass_flops_per_thread(std::int64_t iterations);
FmaPeakResult measure_fma_peak(double seconds_per_pass = 0.1, int passes = 7, int threads = 0);

// Measured once per process (on first use) with the defaults above, then
// cached: the denominators of every "fraction of the machine" counter. A
// measurement during which other processes used more than 0.1 core is
// repeated (after wait_for_quiet, at most 3 attempts); the best is kept.
const ReadBandwidthResult& machine_read_bandwidth();
const FmaPeakResult& machine_fma_peak();

// Contention from the rest of the machine (other processes, hypervisor
// steal), from /proc/stat and /proc/self/stat: the benchmarks share the
// machine, so each one reports how busy the others kept it meanwhile.
struct CpuSample {
  double wall_seconds = 0.0;     // steady clock
  std::int64_t busy_ticks = 0;   // all CPUs: user + nice + system + irq + softirq
  std::int64_t steal_ticks = 0;  // all CPUs: stolen by the hypervisor
  std::int64_t self_ticks = 0;   // this process: utime + stime (all threads)
};
CpuSample sample_cpu();
// Cores' worth of CPU that others (other processes + steal) used between two
// samples, averaged over the wall time between them (0 = quiet machine; 1 =
// one core fully taken). Resolution: one clock tick (10 ms) per interval.
double other_cores_between(const CpuSample& a, const CpuSample& b);
// Waits (at most `limit_seconds`) for a one-second window in which others
// use less than `max_other_cores`; returns whether one came.
bool wait_for_quiet(double limit_seconds, double max_other_cores = 0.1);

// Run-time CPU feature checks.
bool cpu_has_avx2();
bool cpu_has_avx2_fma();

// The last-level cache size in bytes (sysfs / sysconf), or `fallback`.
std::size_t l3_cache_bytes(std::size_t fallback = std::size_t{32} << 20);

}  // namespace pagedattn::bench
