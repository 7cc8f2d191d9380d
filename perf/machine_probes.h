// Machine-limit probes for the attention benchmarks: what this machine can do
// at best, measured in the same process, so that every kernel can be reported
// as a fraction of it.
//
//   * read bandwidth: all OpenMP threads stream-read a buffer (default 1 GiB,
//     well above any L3; huge-page advised and pre-touched) with 256-bit loads
//     (DRAM, not the load width, bounds it); 30 passes (about 1 s), reported
//     as min / median / max in GB/s (1e9 bytes per second);
//   * compute peaks, one per instruction class (PeakClass): all OpenMP
//     threads run 12 independent chains of one instruction held in
//     registers, 7 passes of about 0.1 s. fp32 FMA at 512 bits (zmm,
//     vfmadd231ps), 256 bits (ymm) and 128-bit SSE multiply + add; bf16 dot
//     products (vdpbf16ps, zmm) and int8 dot products (vpdpbusd, zmm) where
//     the CPU has AVX512-BF16 / AVX512-VNNI; bf16 tile products (tdpbf16ps
//     on 4 accumulator tiles) where it has AMX-BF16. An FMA counts 2 FLOP;
//     vdpbf16ps 64 FLOP (16 lanes x 2 bf16 pairs); vpdpbusd 128 integer ops
//     (16 lanes x 4 byte pairs), reported as GOP/s; tdpbf16ps 16384 FLOP
//     (16 x 16 outputs x 32 products).
//
// The probe file is compiled for the baseline ISA; each probe loop has a
// function-level target attribute and runs only when cpuid says the CPU (and
// OS) supports it (pagedattn::cpu_features()).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/cpu_load.h"
#include "pagedattn/cpu_features.h"
#include "workload_rules.h"  // l3_cache_bytes

namespace pagedattn::bench {

struct ReadBandwidthResult {
  double min_gbps = 0.0;     // slowest pass
  double median_gbps = 0.0;  // median pass
  double best_gbps = 0.0;    // fastest pass (the max)
  double mean_gbps = 0.0;    // mean over passes
  double other_cores = 0.0;  // others' CPU use meanwhile (other_cores_between)
  std::size_t bytes = 0;     // buffer size
  int passes = 0;
  int threads = 0;
  std::string isa;            // "avx2" or "scalar"
  std::size_t run_bytes = 0;  // the paged probe's run length (0: one sequential slice per thread)
};

// The instruction classes a kernel's inner products can use; each has its
// own measured peak.
enum class PeakClass {
  kFp32MulAddXmm,  // SSE mulps + addps, 4 lanes (targets below AVX2)
  kFp32FmaYmm,     // vfmadd231ps ymm, 8 lanes
  kFp32FmaZmm,     // vfmadd231ps zmm, 16 lanes
  kBf16DotZmm,     // vdpbf16ps zmm (AVX512-BF16)
  kInt8DotZmm,     // vpdpbusd zmm (AVX512-VNNI)
  kBf16Amx,        // tdpbf16ps on AMX tiles (AMX-BF16)
  kF16FmaZmm,      // vfmadd231ph zmm, 32 f16 lanes (AVX512-FP16)
};
inline constexpr PeakClass kAllPeakClasses[] = {PeakClass::kFp32MulAddXmm, PeakClass::kFp32FmaYmm,
                                                PeakClass::kFp32FmaZmm,    PeakClass::kBf16DotZmm,
                                                PeakClass::kInt8DotZmm,    PeakClass::kBf16Amx,
                                                PeakClass::kF16FmaZmm};

// "fp32 FMA zmm (vfmadd231ps)" and the like.
const char* peak_class_name(PeakClass c);
// "GFLOP/s", or "GOP/s" for the integer class.
const char* peak_class_unit(PeakClass c);
// Whether this CPU (and OS) can run the class at all.
bool peak_class_available(PeakClass c);

struct ComputePeakResult {
  PeakClass peak_class = PeakClass::kFp32FmaYmm;
  bool available = false;   // false: not measured, the figures are 0
  double min_gflops = 0.0;  // GFLOP/s, or GOP/s for kInt8DotZmm
  double median_gflops = 0.0;
  double best_gflops = 0.0;  // the fastest pass: the peak
  double mean_gflops = 0.0;
  double other_cores = 0.0;  // others' CPU use meanwhile (other_cores_between)
  int passes = 0;
  int threads = 0;
  int accumulators = 0;  // independent chains per thread
  std::string isa;       // peak_class_name
};
using FmaPeakResult = ComputePeakResult;

// min / median / max / mean of `values` (all zero when there are none).
struct Spread {
  double min = 0.0, median = 0.0, max = 0.0, mean = 0.0;
};
Spread spread_of(std::vector<double> values);

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

// How read_runs_pass_seconds reads its runs: by loads alone (what the
// hardware prefetchers make of the pattern), or also prefetching into L2
// (prefetcht1) the lines of the run two runs ahead, one line per line read,
// as the decode kernels prefetch their K/V rows (src/kernels/cpu/prefetch.h).
// The prefetching loop is AVX2 code: a CPU without AVX2 reads by loads alone.
enum class RunPrefetch { kNone, kTwoRunsAhead };

// Arithmetic a read pass does on what it reads, as a decode kernel does:
// fmas_per_line f32 FMAs (AVX2, 8 lanes, rounded down to an even count) per
// 64-byte line, on independent chains; repeat: the runs are read that many
// times in one pass (a buffer in cache, timed without a parallel region per
// pass). A pass with work against the same pass from memory tells how much
// of the stream a loop of that arithmetic keeps: the kernels' compute and
// their reads overlap only in part (docs/benchmarks.md, "What decode keeps
// of the stream").
struct RunWork {
  int fmas_per_line = 0;
  int repeat = 1;
};

// One read pass over `bytes` at `p` as runs of `run_bytes` (a multiple of
// 256) visited in a shuffled order, like the K/V of a paged cache (a 4 KiB
// run: one f16 page of 16 tokens x 128 dims of one head; 32 KiB: that page
// for 8 KV heads); the runs are dealt to the threads in turn. Returns its
// wall time in seconds (all `work.repeat` walks).
double read_runs_pass_seconds(const std::byte* p, std::size_t bytes, std::size_t run_bytes,
                              int threads, RunPrefetch prefetch = RunPrefetch::kNone,
                              RunWork work = {});

// Fresh measurements (allocate, touch, run `passes` passes, free).
ReadBandwidthResult measure_read_bandwidth(std::size_t bytes = std::size_t{1} << 30,
                                           int passes = 30, int threads = 0);
// The paged read probe: passes of read_runs_pass_seconds with prefetches
// (RunPrefetch::kTwoRunsAhead) over runs of `run_bytes`: what a decode
// kernel that reads pages of that size at random places can expect from
// this machine's memory, against the sequential probe above.
ReadBandwidthResult measure_paged_read_bandwidth(std::size_t run_bytes,
                                                 std::size_t bytes = std::size_t{1} << 30,
                                                 int passes = 30, int threads = 0);
// The paged read probe over one buffer, allocated and touched once: a run
// that interleaves probe passes with its own work (bench-attention
// --interleave-probe) pays the set-up of a 1 GiB buffer once, not per round.
class PagedReadProbe {
 public:
  explicit PagedReadProbe(std::size_t run_bytes, std::size_t bytes = std::size_t{1} << 30,
                          int threads = 0);
  // One untimed warm-up pass, then `passes` timed ones.
  ReadBandwidthResult measure(int passes) const;

 private:
  HugeBuffer buf_;
  std::size_t run_bytes_;
  int threads_;
};
// One pass of the `c` probe: `iterations` loop trips per thread; seconds.
double compute_pass_seconds(PeakClass c, std::int64_t iterations, int threads);
// Operations (FLOP, or integer ops) one thread performs in that pass.
double compute_pass_ops_per_thread(PeakClass c, std::int64_t iterations);
ComputePeakResult measure_compute_peak(PeakClass c, double seconds_per_pass = 0.1, int passes = 7,
                                       int threads = 0);

// The widest fp32 FMA class this CPU has (zmm, ymm, else SSE multiply + add).
PeakClass widest_fp32_class();
// The same probe for widest_fp32_class(), kept for the Google Benchmark suite.
double fma_pass_seconds(std::int64_t iterations, int threads);
double fma_pass_flops_per_thread(std::int64_t iterations);
FmaPeakResult measure_fma_peak(double seconds_per_pass = 0.1, int passes = 7, int threads = 0);

// Measured once per process (on first use) with the defaults above, then
// cached: the denominators of every "fraction of the machine" counter. A
// measurement during which other processes used more than 0.1 core is
// repeated (after wait_for_quiet, at most 3 attempts); the best is kept.
const ReadBandwidthResult& machine_read_bandwidth();
// measure_paged_read_bandwidth(run_bytes), once per run length.
const ReadBandwidthResult& machine_paged_read_bandwidth(std::size_t run_bytes);
// The peak of class `c` (available == false where the CPU lacks it).
const ComputePeakResult& machine_compute_peak(PeakClass c);
// machine_compute_peak(widest_fp32_class()).
const FmaPeakResult& machine_fma_peak();

// Contention from the rest of the machine (other processes, hypervisor
// steal), from /proc/stat and /proc/self/stat: the benchmarks share the
// machine, so each one reports how busy the others kept it meanwhile.
// (core/cpu_load.h: the machine's CPUs, all of them.)
using core::CpuSample;
using core::other_cores_between;
using core::sample_cpu;
// Waits (at most `limit_seconds`) for a one-second window in which others
// use less than `max_other_cores`; returns whether one came.
bool wait_for_quiet(double limit_seconds, double max_other_cores = 0.1);

// Run-time CPU feature checks (pagedattn::cpu_features()).
bool cpu_has_avx2();
bool cpu_has_avx2_fma();

}  // namespace pagedattn::bench
