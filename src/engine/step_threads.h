// How many OpenMP threads the engine's steps use.
#pragma once

#include "core/cpu_load.h"

namespace pagedattn::engine {

// All of OpenMP's threads (its count when the engine was made) while the
// process's CPUs are its own, fewer while other processes take some of them.
// OpenMP threads spin for a while before they sleep (the runtime's default):
// on a core the scheduler shares with another process, a thread that spins
// waiting for one that is descheduled takes the time both need, and a step
// slows to a fraction of what fewer threads give (docs/engine.md#threads).
// Threads that sleep as they wait (OMP_WAIT_POLICY=passive) cost nothing
// then, so under that policy every step keeps them all.
class StepThreads {
 public:
  // pin: the first apply() binds the stepping thread's OpenMP threads to
  // the process's CPUs, one each (core::pin_openmp_threads).
  explicit StepThreads(bool pin = false);
  // Before a step: at most every interval_for(CPUs) seconds measures what
  // the other processes used of this process's CPUs since the last measure,
  // and sets the thread count for the calling thread's parallel regions
  // (omp_set_num_threads). Returns it. After the engine sat idle for
  // restarts_after_idle(interval) or longer, the measure restarts at this
  // step, which gets every thread: what others did while the engine had
  // nothing to do, or in an earlier burst of work (a client starting up,
  // say), says little of the next one, and a count of one from it halved the
  // first prefill of the next burst of requests. A neighbour still busy is
  // found again one interval into the burst.
  int apply();
  // After a step: when it ended, for apply()'s idle rule.
  void step_done();

  // The count for `other_cores` cores' worth of others' use of `cpus` CPUs:
  // the cores they leave, rounded to nearest, in [1, max_threads].
  static int for_share(int max_threads, int cpus, double other_cores);
  // Seconds between measures on `cpus` CPUs: 0.1 s, and 40 ms per CPU where
  // that is longer. Each CPU's counters move in clock ticks (10 ms), so a
  // measure can be a tick off per CPU: over cpus x 40 ms that is at most a
  // quarter of a core, which the rounding in for_share absorbs.
  static double interval_for(int cpus);
  // The idle time after which a measure restarts: a quarter of the
  // interval, the most of it that others' use while idle may fill without
  // moving a 2-CPU count (others' half core is where it drops to one).
  static double restarts_after_idle(double interval) { return 0.25 * interval; }

 private:
  int max_threads_;
  int cpus_;
  double interval_;
  bool adapt_;
  int threads_;
  bool pin_;
  core::CpuSample last_;
  double last_step_end_;  // steady_seconds(); the engine's making counts as a step
};

}  // namespace pagedattn::engine
