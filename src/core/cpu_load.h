// How busy other processes keep the CPUs, from /proc/stat and /proc/self/stat:
// the benchmarks report it beside each figure, and the engine steps with
// fewer threads while others take cores (engine/step_threads.h).
#pragma once

#include <cstdint>

namespace pagedattn::core {

struct CpuSample {
  double wall_seconds = 0.0;     // steady clock
  std::int64_t busy_ticks = 0;   // the sampled CPUs: user + nice + system + irq + softirq
  std::int64_t steal_ticks = 0;  // the sampled CPUs: stolen by the hypervisor
  std::int64_t self_ticks = 0;   // this process: utime + stime (all threads)
  bool valid = false;            // both files were read
};
// Counters over every CPU of the machine, or (allowed_cpus_only) over the
// CPUs this process may run on (process_cpus): what other processes
// take from this one's CPUs, wherever else the machine is busy.
CpuSample sample_cpu(bool allowed_cpus_only = false);
// Cores' worth of CPU that others (other processes + steal) used between two
// samples, averaged over the wall time between them (0 = quiet machine; 1 =
// one core fully taken); 0 when a sample is not valid. Resolution: one clock
// tick (10 ms) per interval.
double other_cores_between(const CpuSample& a, const CpuSample& b);
// The CPUs this process may run on (at least 1).
int allowed_cpus();
// Whether OpenMP's threads sleep as soon as they wait
// (OMP_WAIT_POLICY=passive, any case): then a waiting thread takes no core
// from the one it waits for.
bool openmp_waits_passively();

}  // namespace pagedattn::core
