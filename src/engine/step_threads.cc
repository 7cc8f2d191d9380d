#include "engine/step_threads.h"

#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/placement.h"
#include "core/seconds_since.h"

namespace pagedattn::engine {

StepThreads::StepThreads(bool pin)
    : max_threads_(std::max(1, omp_get_max_threads())),
      cpus_(core::allowed_cpus()),
      interval_(interval_for(cpus_)),
      adapt_(max_threads_ > 1 && !core::openmp_waits_passively()),
      threads_(max_threads_),
      pin_(pin),
      last_(adapt_ ? core::sample_cpu(true) : core::CpuSample{}),
      last_step_end_(steady_seconds()) {
  adapt_ = adapt_ && last_.valid;  // without /proc, every thread
}

int StepThreads::for_share(int max_threads, int cpus, double other_cores) {
  const double free_cores = double(cpus) - std::max(0.0, other_cores);
  return std::clamp(static_cast<int>(std::lround(free_cores)), 1, std::max(1, max_threads));
}

double StepThreads::interval_for(int cpus) {
  return std::max(0.1, 0.04 * std::max(1, cpus));
}

int StepThreads::apply() {
  if (pin_) {
    core::pin_openmp_threads();  // on the stepping thread: its OpenMP threads
    pin_ = false;
  }
  const double now_seconds = steady_seconds();
  if (adapt_ && now_seconds - last_step_end_ >= restarts_after_idle(interval_)) {
    last_ = core::sample_cpu(true);  // a new measure from this step, with every thread
    threads_ = max_threads_;
  } else if (adapt_ && now_seconds - last_.wall_seconds >= interval_) {
    const core::CpuSample now = core::sample_cpu(true);
    threads_ = now.valid ? for_share(max_threads_, cpus_, core::other_cores_between(last_, now))
                         : max_threads_;
    last_ = now;
  }
  omp_set_num_threads(threads_);
  return threads_;
}

void StepThreads::step_done() {
  last_step_end_ = steady_seconds();
}

}  // namespace pagedattn::engine
