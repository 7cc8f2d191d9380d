// A team: one OpenMP parallel region that runs several pieces of work in
// turn, each split over the region's threads with a barrier after it, where
// each piece would otherwise open a region of its own. Opening a region
// costs several times a barrier once there are more than a few threads
// (docs/benchmarks.md, "A region per product or one for the step"), and a
// model layer's products, norms and RoPE are a dozen pieces.
//
// The pieces (for_each_task, for_row_ranges, on_one_thread) also run outside
// a team, as they did before teams: for_each_task then opens a region of its
// own, for_row_ranges hands all rows to the callee (which splits them
// itself). Inside a team every thread must reach the same pieces in the same
// order (they are OpenMP worksharing constructs), and nothing may throw out
// of the region: check arguments before it.
#pragma once

#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdint>

#include "core/cpu_load.h"
#include "core/env_switch.h"
#include "core/row_parallel.h"

namespace pagedattn::core {

// The kinds of piece a team's waits are told apart by (WaitKindScope): the
// callers' own numbering, 0 for pieces of no kind (the model's step
// phases: the rest of the forward pass, products, attention, LM head).
inline constexpr int kWaitKinds = 4;

namespace detail {
inline thread_local bool in_team = false;
// Inside a team whose caller asked for it (TeamWaitScope): the seconds this
// thread has waited at the pieces' barriers, by the kind of piece.
inline thread_local bool time_waits = false;
inline thread_local double waited[kWaitKinds] = {};
inline thread_local int wait_kind = 0;
// On a caller's thread: where the teams it starts add their waits.
inline thread_local double* wait_sink = nullptr;

// for_each_chunk_shared's cursors, one cache line each: a part's generation
// (the team's count of such pieces, the same on every thread since they
// reach the same pieces in order) in the high half, its next chunk in the
// low half. A cursor of an older generation has not started this piece.
inline constexpr int kSharedParts = 256;
struct alignas(64) ChunkCursor {
  std::atomic<std::uint64_t> value{0};
};
inline thread_local ChunkCursor* chunk_cursors = nullptr;  // the team's, null outside one
inline thread_local std::uint32_t chunk_generation = 0;

// The barrier after a team's pieces where the team has its own
// (team_barrier_switch): a count of the threads yet to arrive and a
// generation the last one moves on, each on a cache line of its own.
// Waiters spin for up to spin_seconds, then sleep (std::atomic::wait); the
// last thread wakes them only where one sleeps. libgomp's barrier makes a
// futex call at every barrier, sleepers or not: a system call for the last
// thread at each of a step's hundreds of pieces.
class SpinBarrier {
 public:
  explicit SpinBarrier(double spin_seconds) : spin_seconds_(spin_seconds) {}
  // For a team of `threads`, before any of them arrives.
  void reset(std::int32_t threads) {
    size_ = threads;
    remaining_.store(threads, std::memory_order_relaxed);
  }
  void arrive_and_wait() {
    // Not moved on before this thread arrives: the generation it passed last.
    const std::uint32_t seen = generation_.load(std::memory_order_relaxed);
    if (remaining_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      remaining_.store(size_, std::memory_order_relaxed);  // before the release below
      generation_.store(seen + 1, std::memory_order_seq_cst);
      if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
      return;
    }
    if (spun_until_released(seen)) return;
    // seq_cst with the last thread's store and load: either it sees this
    // sleeper, or this thread sees the new generation before it sleeps.
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    while (generation_.load(std::memory_order_seq_cst) == seen)
      generation_.wait(seen, std::memory_order_seq_cst);
    sleepers_.fetch_sub(1, std::memory_order_relaxed);
  }

 private:
  bool spun_until_released(std::uint32_t seen) const {
    const double until = spin_seconds_ > 0.0 ? omp_get_wtime() + spin_seconds_ : 0.0;
    for (std::uint32_t spin = 1;; ++spin) {
      if (generation_.load(std::memory_order_acquire) != seen) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (spin % 64 == 0 && omp_get_wtime() >= until) return false;
    }
  }

  alignas(64) std::atomic<std::int32_t> remaining_{0};
  alignas(64) std::atomic<std::uint32_t> generation_{0};
  std::atomic<std::int32_t> sleepers_{0};
  double spin_seconds_;
  std::int32_t size_ = 0;
};
inline thread_local SpinBarrier* spin_barrier = nullptr;  // the team's, where it has its own
}  // namespace detail

// While it lives, every team the calling thread starts adds to sink[kind]
// (kWaitKinds of them) the time its threads waited at the barriers after
// its pieces of that kind, averaged over the threads (seconds): what the
// team lost to uneven splits and to pieces on one thread. Two clock reads
// per thread and piece; none without a scope.
class TeamWaitScope {
 public:
  explicit TeamWaitScope(double* sink) : previous_(detail::wait_sink) { detail::wait_sink = sink; }
  ~TeamWaitScope() { detail::wait_sink = previous_; }
  TeamWaitScope(const TeamWaitScope&) = delete;
  TeamWaitScope& operator=(const TeamWaitScope&) = delete;

 private:
  double* previous_;
};

// While it lives, the waits after the pieces the calling thread runs count
// as `kind` (in [0, kWaitKinds)); the previous kind comes back after. Each
// thread of a team sets its own: construct it where every thread passes.
class WaitKindScope {
 public:
  explicit WaitKindScope(int kind) : previous_(detail::wait_kind) { detail::wait_kind = kind; }
  ~WaitKindScope() { detail::wait_kind = previous_; }
  WaitKindScope(const WaitKindScope&) = delete;
  WaitKindScope& operator=(const WaitKindScope&) = delete;

 private:
  int previous_;
};

namespace detail {
inline void wait_for_team() {
  if (spin_barrier != nullptr) return spin_barrier->arrive_and_wait();
#pragma omp barrier
}
}  // namespace detail

// The barrier after a piece, inside a team: every thread waits for all.
inline void team_barrier() {
  if (!detail::time_waits) return detail::wait_for_team();
  const double start = omp_get_wtime();
  detail::wait_for_team();
  detail::waited[detail::wait_kind] += omp_get_wtime() - start;
}

// Whether the calling thread runs inside run_in_team (not merely inside some
// OpenMP region: a caller's own region is not a team).
inline bool in_team() {
  return detail::in_team;
}

namespace detail {
inline thread_local bool solo = false;
}  // namespace detail

// While it lives, the calling thread runs the pieces it reaches alone: not
// as a team's (in_team() is false), and with one thread to split them over
// (available_threads() is 1). For a team's thread that takes a share of
// work made of whole products (a mixture of experts' column ranges), which
// the other threads do not reach. Scopes nest.
class SoloScope {
 public:
  SoloScope() : team_(detail::in_team), solo_(detail::solo) {
    detail::in_team = false;
    detail::solo = true;
  }
  ~SoloScope() {
    detail::in_team = team_;
    detail::solo = solo_;
  }
  SoloScope(const SoloScope&) = delete;
  SoloScope& operator=(const SoloScope&) = delete;

 private:
  bool team_, solo_;
};

// The threads work may be split over here: the team's size inside a team,
// one in a SoloScope, the size of the next region otherwise.
inline int available_threads() {
  if (detail::solo) return 1;
  return in_team() ? omp_get_num_threads() : omp_get_max_threads();
}

// Which of the per-thread buffers sized by the thread count (max threads)
// the calling thread uses: its number in the team or region, 0 in a
// SoloScope (whose caller hands it buffers of its own).
inline int worker_index() {
  return detail::solo ? 0 : omp_get_thread_num();
}

// Whether callers that may run their work in teams do (the model's layers):
// true unless the environment variable PAGEDATTN_TEAMS is "0" when first
// asked, or set_teams_enabled(false) was called. Off, each piece opens its
// own region as before teams: for A/B runs, and for tests that compare the
// two.
inline EnvSwitch& teams_switch() {
  static EnvSwitch setting("PAGEDATTN_TEAMS", true);
  return setting;
}
inline bool teams_enabled() {
  return teams_switch().on();
}
inline void set_teams_enabled(bool enabled) {
  teams_switch().set(enabled);
}

// Whether for_each_chunk_shared lets threads take others' chunks: true
// unless the environment variable PAGEDATTN_SHARE_CHUNKS is "0" when first
// asked, or set_chunk_sharing(false) was called (for A/B runs; each part's
// chunks then stay on its thread).
inline EnvSwitch& chunk_sharing_switch() {
  static EnvSwitch setting("PAGEDATTN_SHARE_CHUNKS", true);
  return setting;
}
inline bool chunk_sharing_enabled() {
  return chunk_sharing_switch().on();
}
inline void set_chunk_sharing(bool enabled) {
  chunk_sharing_switch().set(enabled);
}

// Whether teams wait at their pieces' barriers on their own
// (detail::SpinBarrier) rather than OpenMP's: true unless the environment
// variable PAGEDATTN_TEAM_BARRIER is "0" when first asked, or
// set_team_barrier(false) was called (for A/B runs). Its waiters spin for
// kBarrierSpinSeconds before they sleep, and sleep at once under
// OMP_WAIT_POLICY=passive or where the team has more threads than the
// process has CPUs (a spinning thread would take the core of the one it
// waits for).
inline EnvSwitch& team_barrier_switch() {
  static EnvSwitch setting("PAGEDATTN_TEAM_BARRIER", true);
  return setting;
}
inline void set_team_barrier(bool own) {
  team_barrier_switch().set(own);
}
inline constexpr double kBarrierSpinSeconds = 1e-3;
inline double barrier_spin_seconds(int threads) {
  static const bool passive = openmp_waits_passively();
  static const int cpus = allowed_cpus();
  return passive || threads > cpus ? 0.0 : kBarrierSpinSeconds;
}

// f() on every thread of a new region of omp_get_max_threads() threads, each
// marked as in a team while it runs; without `team`, f() on the caller
// alone, whose pieces then open their own regions.
template <typename F>
void run_in_team(bool team, F&& f) {
  if (!team || in_team()) return f();
  double* const sink = detail::wait_sink;
  std::array<detail::ChunkCursor, detail::kSharedParts> cursors;
  const bool own_barrier = team_barrier_switch().on();
  detail::SpinBarrier barrier(barrier_spin_seconds(omp_get_max_threads()));
#pragma omp parallel
  {
    if (own_barrier) {
#pragma omp single
      barrier.reset(omp_get_num_threads());  // the region's size; a barrier after
    }
    detail::in_team = true;
    detail::spin_barrier = own_barrier ? &barrier : nullptr;
    detail::chunk_cursors = cursors.data();
    detail::chunk_generation = 0;
    detail::time_waits = sink != nullptr;
    for (double& w : detail::waited) w = 0.0;
    f();
    for (int kind = 0; sink != nullptr && kind < kWaitKinds; ++kind) {
      const double mine = detail::waited[kind] / omp_get_num_threads();
#pragma omp atomic
      sink[kind] += mine;
    }
    detail::in_team = false;
    detail::spin_barrier = nullptr;
    detail::chunk_cursors = nullptr;
    detail::time_waits = false;
  }
}

// body(task) for every task in [0, tasks). Inside a team: split over its
// threads (task t on thread t when there are as many), a barrier after.
// Outside one: in a region of `tasks` threads, or on the caller for one task.
template <typename F>
void for_each_task(std::int32_t tasks, F&& body) {
  if (in_team()) {
#pragma omp for schedule(static) nowait
    for (std::int32_t t = 0; t < tasks; ++t) body(t);
    return team_barrier();
  }
  if (tasks <= 1) {
    for (std::int32_t t = 0; t < tasks; ++t) body(t);
    return;
  }
#pragma omp parallel for schedule(static) num_threads(tasks)
  for (std::int32_t t = 0; t < tasks; ++t) body(t);
}

// body(part, chunk) for every chunk in [0, chunks) of every part in
// [0, parts), a part's chunks in order. Inside a team: part p on thread
// p % size as for_each_task, and a thread done with its own parts goes on
// to the next chunks of the others' (from the part after its own), so that
// a thread slowed by its core's other work (a VM's neighbours, the OS) or
// by slower memory holds up the piece by a chunk rather than by its share;
// a barrier after. For work whose results do not depend on the thread that
// runs a chunk. Outside a team, or for more than kSharedParts parts: as
// for_each_task, each part's chunks in order.
template <typename F>
void for_each_chunk_shared(std::int32_t parts, std::int32_t chunks, F&& body) {
  const auto whole_part = [&](std::int32_t p) {
    for (std::int32_t c = 0; c < chunks; ++c) body(p, c);
  };
  if (!in_team() || !chunk_sharing_enabled() || parts > detail::kSharedParts || chunks <= 1)
    return for_each_task(parts, whole_part);
  const std::uint64_t generation = ++detail::chunk_generation;
  const auto claim = [&](std::int32_t p) -> std::int32_t {  // the part's next chunk, or -1
    std::atomic<std::uint64_t>& cursor = detail::chunk_cursors[p].value;
    std::uint64_t seen = cursor.load(std::memory_order_relaxed);
    for (;;) {
      const std::uint64_t next = (seen >> 32) == generation ? (seen & 0xffffffffu) : 0;
      if (next >= std::uint64_t(chunks)) return -1;
      if (cursor.compare_exchange_weak(seen, (generation << 32) | (next + 1),
                                       std::memory_order_relaxed))
        return static_cast<std::int32_t>(next);
    }
  };
  const auto drain = [&](std::int32_t p) {
    for (std::int32_t c = claim(p); c >= 0; c = claim(p)) body(p, c);
  };
  const std::int32_t size = omp_get_num_threads(), me = omp_get_thread_num();
  for (std::int32_t p = me; p < parts; p += size) drain(p);
  for (std::int32_t k = 1; k <= parts; ++k) drain((me + k) % parts);
  team_barrier();
}

// f() on one thread of the team, the others waiting at its end; outside a
// team, on the caller.
template <typename F>
void on_one_thread(F&& f) {
  if (!in_team()) return f();
#pragma omp single nowait
  f();
  team_barrier();
}

// Whether for_row_ranges splits `rows` of `row_elements` each over a team's
// threads (else one thread takes them all).
inline bool splits_rows(std::int32_t rows, std::int64_t row_elements) {
  return std::int64_t{rows} * row_elements >= kRowParallelElements;
}

namespace detail {
// f(begin, end) over `parts` even ranges of the rows [0, rows), a part per
// team thread (static), a barrier after.
template <typename F>
void row_ranges_over(std::int32_t rows, std::int32_t parts, F& f) {
#pragma omp for schedule(static) nowait
  for (std::int32_t p = 0; p < parts; ++p) {
    const auto edge = [&](std::int32_t i) {
      return static_cast<std::int32_t>(std::int64_t{rows} * i / parts);
    };
    f(edge(p), edge(p + 1));
  }
  team_barrier();
}
}  // namespace detail

// f(begin, end) over the rows [0, rows) of row-wise element work (norms,
// RoPE, activations) whose own functions split rows over a region from
// kRowParallelElements elements. Inside a team: ranges of rows over its
// threads from that many elements, else all of them on one thread (a
// barrier after either); the callee's own region is then nested and runs on
// its thread alone. Outside a team: f(0, rows), which splits them itself.
template <typename F>
void for_row_ranges(std::int32_t rows, std::int64_t row_elements, F&& f) {
  if (!in_team()) return f(std::int32_t{0}, rows);
  const bool split = splits_rows(rows, row_elements);
  detail::row_ranges_over(rows, split ? std::min<std::int32_t>(rows, omp_get_num_threads()) : 1, f);
}

// As for_row_ranges, but inside a team the rows go to as many of its
// threads as there are rows, however few their elements: for row work that
// every thread's share of the next piece reads (rows rounded to int8 for
// the int8 tiles), which one thread would otherwise do while the others
// wait, or every thread would redo for each of its product's chunks.
template <typename F>
void for_row_ranges_split(std::int32_t rows, F&& f) {
  if (!in_team()) return f(std::int32_t{0}, rows);
  detail::row_ranges_over(rows, std::min<std::int32_t>(rows, omp_get_num_threads()), f);
}
}  // namespace pagedattn::core
