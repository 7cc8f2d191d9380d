// The engine's step thread count (engine/step_threads.h): the cores other
// processes leave, and the CPU-time sampler behind it.
#include <gtest/gtest.h>
#include <omp.h>
#include <sched.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/cpu_load.h"
#include "engine/step_threads.h"

namespace pagedattn::engine {
namespace {

TEST(StepThreads, TakesTheCoresOthersLeaveRoundedWithinOneAndTheMaximum) {
  EXPECT_EQ(StepThreads::for_share(2, 2, 0.0), 2);
  EXPECT_EQ(StepThreads::for_share(2, 2, 0.3), 2);   // a little background
  EXPECT_EQ(StepThreads::for_share(2, 2, 0.67), 1);  // one busy process beside two spinners
  EXPECT_EQ(StepThreads::for_share(2, 2, 1.0), 1);
  EXPECT_EQ(StepThreads::for_share(2, 2, 1.9), 1);  // never below one
  EXPECT_EQ(StepThreads::for_share(2, 2, 7.0), 1);
  EXPECT_EQ(StepThreads::for_share(16, 16, 3.2), 13);
  EXPECT_EQ(StepThreads::for_share(8, 16, 0.0), 8);  // OMP_NUM_THREADS below the CPUs
  EXPECT_EQ(StepThreads::for_share(8, 16, 9.0), 7);
  EXPECT_EQ(StepThreads::for_share(4, 4, -1.0), 4);  // a clock step backwards
  EXPECT_EQ(StepThreads::for_share(0, 4, 0.0), 1);
}

// Measures far enough apart that a clock tick per CPU stays under a quarter
// of a core.
TEST(StepThreads, MeasuresLongerApartOnMoreCpus) {
  EXPECT_DOUBLE_EQ(StepThreads::interval_for(1), 0.1);
  EXPECT_DOUBLE_EQ(StepThreads::interval_for(2), 0.1);
  EXPECT_DOUBLE_EQ(StepThreads::interval_for(16), 0.64);
  EXPECT_DOUBLE_EQ(StepThreads::interval_for(64), 2.56);
  for (int cpus = 1; cpus <= 256; ++cpus)
    EXPECT_LE(cpus * 0.01 / StepThreads::interval_for(cpus), 0.25 + 1e-12) << cpus;
}

TEST(StepThreads, SamplesThisProcesssCpusAndSeesNoOthersInNoTime) {
  const core::CpuSample a = core::sample_cpu(true), b = core::sample_cpu(true);
  ASSERT_TRUE(a.valid && b.valid);
  EXPECT_GE(b.busy_ticks, a.busy_ticks);
  EXPECT_GE(b.self_ticks, a.self_ticks);
  EXPECT_GE(b.wall_seconds, a.wall_seconds);
  EXPECT_EQ(core::other_cores_between(a, a), 0.0);
  EXPECT_EQ(core::other_cores_between(core::CpuSample{}, b), 0.0);  // not valid: none
  const core::CpuSample all = core::sample_cpu(false);
  ASSERT_TRUE(all.valid);
  EXPECT_GE(all.busy_ticks + all.steal_ticks, 0);
  EXPECT_GE(core::allowed_cpus(), 1);
}

// Sets OMP_WAIT_POLICY for a scope (StepThreads reads it when made).
class WaitPolicy {
 public:
  explicit WaitPolicy(const char* policy) {
    if (const char* v = std::getenv("OMP_WAIT_POLICY")) {
      saved_ = v;
      had_ = true;
    }
    if (policy)
      setenv("OMP_WAIT_POLICY", policy, 1);
    else
      unsetenv("OMP_WAIT_POLICY");
  }
  ~WaitPolicy() {
    if (had_)
      setenv("OMP_WAIT_POLICY", saved_.c_str(), 1);
    else
      unsetenv("OMP_WAIT_POLICY");
  }
  WaitPolicy(const WaitPolicy&) = delete;
  WaitPolicy& operator=(const WaitPolicy&) = delete;

 private:
  std::string saved_;
  bool had_ = false;
};

// apply() sets the count it returns for this thread's parallel regions: all
// of them under passive waiting, a count in [1, all] otherwise.
TEST(StepThreads, SetsTheCountForThisThreadsRegions) {
  const int all = omp_get_max_threads();
  {
    const WaitPolicy passive("passive");
    StepThreads t;
    EXPECT_EQ(t.apply(), all);
    EXPECT_EQ(omp_get_max_threads(), all);
  }
  {
    const WaitPolicy runtime_default(nullptr);
    StepThreads t;
    const int n = t.apply();
    EXPECT_GE(n, 1);
    EXPECT_LE(n, all);
    EXPECT_EQ(omp_get_max_threads(), n);
  }
  omp_set_num_threads(all);
}

// After the engine sat idle for restarts_after_idle(interval), the next step
// gets every thread, whatever other processes did meanwhile (here a child
// that spins through the idle time, which a measure over it would count as
// a busy core); steps in a row keep a count in [1, all].
TEST(StepThreads, AStepAfterIdleTakesEveryThread) {
  const WaitPolicy runtime_default(nullptr);
  const int all = omp_get_max_threads();
  const double interval = StepThreads::interval_for(core::allowed_cpus());
  EXPECT_DOUBLE_EQ(StepThreads::restarts_after_idle(0.1), 0.025);
  StepThreads t;
  for (int burst = 0; burst < 2; ++burst) {
    t.apply();
    t.step_done();
    const auto idle = std::chrono::duration<double>(1.5 * interval);
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // spins through the idle time, then leaves
      const auto until = std::chrono::steady_clock::now() + idle;
      while (std::chrono::steady_clock::now() < until) {
      }
      _exit(0);
    }
    std::this_thread::sleep_for(idle);
    waitpid(child, nullptr, 0);
    EXPECT_EQ(t.apply(), all) << "burst " << burst;
    t.step_done();
    const int next = t.apply();  // no idle before it
    EXPECT_GE(next, 1);
    EXPECT_LE(next, all);
    t.step_done();
  }
  omp_set_num_threads(all);
}

// StepThreads(true) binds at its first apply(), on the stepping thread (a
// thread of its own here: the suite's other tests keep unbound threads),
// and keeps measuring the process's CPUs, not the one left to it.
TEST(StepThreads, PinsTheSteppingThreadsOpenMpThreadsAtTheFirstStep) {
  const int cpus = core::allowed_cpus();
  int before = -1, after = -1, measured = -1;
  std::thread([&] {
    omp_set_num_threads(1);
    auto own_cpus = [] {
      cpu_set_t set;
      CPU_ZERO(&set);
      sched_getaffinity(0, sizeof set, &set);
      return CPU_COUNT(&set);
    };
    StepThreads t(true);
    before = own_cpus();
    t.apply();
    after = own_cpus();
    measured = core::allowed_cpus();
  }).join();
  EXPECT_EQ(before, cpus);
  EXPECT_EQ(after, 1);
  EXPECT_EQ(measured, cpus);
}

}  // namespace
}  // namespace pagedattn::engine
