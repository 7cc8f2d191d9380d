// core/team.h: inside a team each piece's tasks and rows run once, over the
// team's threads, and every thread waits for the piece's end (timed inside a
// TeamWaitScope); outside one the pieces run as a region of their own (or on
// the caller). linear()
// inside a team gives bitwise what it gives outside, on every route.
#include "core/team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "engine/counter_random.h"
#include "engine/gemm.h"
#include "support/omp_threads.h"

namespace pagedattn {
namespace {

using Threads = test::OmpThreads;

TEST(Team, PiecesRunEachTaskAndRowOnceAndWaitForTheirEnd) {
  const Threads threads(3);  // more than the machine may have is fine
  constexpr std::int32_t kTasks = 7, kRows = 50;
  std::vector<std::atomic<int>> task_runs(kTasks), row_runs(kRows);
  std::atomic<int> singles{0}, ranges{0}, team_size{0}, seen_before_barrier{0};
  std::atomic<bool> outside_pieces_in_team{false};
  core::run_in_team(true, [&] {
    EXPECT_TRUE(core::in_team());
    core::on_one_thread([&] { team_size = core::available_threads(); });
    core::for_each_task(kTasks, [&](std::int32_t t) { ++task_runs[std::size_t(t)]; });
    // After the piece every task has run, on every thread.
    int done = 0;
    for (auto& r : task_runs) done += r.load();
    if (done == kTasks) ++seen_before_barrier;
    // 50 rows x 1000 elements: split over the threads.
    core::for_row_ranges(kRows, 1000, [&](std::int32_t begin, std::int32_t end) {
      ++ranges;
      for (std::int32_t r = begin; r < end; ++r) ++row_runs[std::size_t(r)];
    });
    core::on_one_thread([&] { ++singles; });
    // 3 rows x 10 elements: on one thread.
    core::for_row_ranges(3, 10, [&](std::int32_t, std::int32_t) { ++ranges; });
    core::run_in_team(true, [&] { outside_pieces_in_team = !core::in_team(); });  // nested: f only
  });
  EXPECT_FALSE(core::in_team());
  EXPECT_EQ(team_size.load(), 3);
  for (auto& r : task_runs) EXPECT_EQ(r.load(), 1);
  for (auto& r : row_runs) EXPECT_EQ(r.load(), 1);
  EXPECT_EQ(seen_before_barrier.load(), 3);
  EXPECT_EQ(singles.load(), 1);
  EXPECT_EQ(ranges.load(), 3 + 1);
  EXPECT_FALSE(outside_pieces_in_team.load());
}

TEST(Team, OutsideATeamPiecesRunOnTheCallerOrTheirOwnRegion) {
  const Threads threads(3);
  std::vector<std::atomic<int>> task_runs(5);
  std::atomic<int> on_threads{0};
  core::for_each_task(5, [&](std::int32_t t) {
    ++task_runs[std::size_t(t)];
    if (omp_get_num_threads() == 5) ++on_threads;  // a region of one thread per task
  });
  for (auto& r : task_runs) EXPECT_EQ(r.load(), 1);
  EXPECT_EQ(on_threads.load(), 5);
  std::vector<std::pair<std::int32_t, std::int32_t>> calls;
  core::for_row_ranges(50, 1000, [&](std::int32_t b, std::int32_t e) { calls.push_back({b, e}); });
  EXPECT_EQ(calls, (std::vector<std::pair<std::int32_t, std::int32_t>>{{0, 50}}));
  int runs = 0;
  core::run_in_team(false, [&] {
    ++runs;
    EXPECT_FALSE(core::in_team());
  });
  EXPECT_EQ(runs, 1);
}

// A TeamWaitScope gets the mean over the team's threads of their waits at
// the pieces' barriers, by the kind of piece: two of three threads wait out
// a 30 ms piece on the third, so about 20 ms; teams outside the scope add
// nothing.
TEST(Team, WaitsAtTheBarriersAreTimedInsideAScope) {
  const Threads threads(3);
  const auto slow_piece = [] {
    core::on_one_thread([] { std::this_thread::sleep_for(std::chrono::milliseconds(30)); });
  };
  double waited[core::kWaitKinds] = {};
  {
    const core::TeamWaitScope scope(waited);
    core::run_in_team(true, slow_piece);
    // The same piece counted as kind 2 (where every thread passes).
    core::run_in_team(true, [&] {
      const core::WaitKindScope kind(2);
      slow_piece();
    });
  }
  for (const int kind : {0, 2}) {
    EXPECT_GT(waited[kind], 0.015) << kind;
    EXPECT_LT(waited[kind], 1.0) << kind;
  }
  EXPECT_EQ(waited[1], 0.0);
  EXPECT_EQ(waited[3], 0.0);
  const double before = waited[0];
  core::run_in_team(true, slow_piece);
  EXPECT_EQ(waited[0], before);
}

// linear() on every route (f32 weights 1 / 16 / 80 rows: in place, tiles,
// BLAS; Q8_0 1-4 rows in place, 16 tiles, 80 dequantised blocks; int8
// activations 4 and 16 rows; bf16 batches; deterministic), accumulating
// into a y wider than out: inside a team of 3, bitwise as outside.
TEST(Team, LinearInsideATeamEqualsLinearOutside) {
  const Threads threads(3);
  constexpr std::int32_t kIn = 256, kOut = 400, kLdy = 413, kMaxRows = 80;
  const auto values = [](std::size_t n, std::uint64_t stream) {
    std::vector<float> v(n);
    for (std::size_t i = 0; i < n; ++i)
      v[i] = static_cast<float>(2.0 * engine::counter_uniform(3, stream, i) - 1.0);
    return v;
  };
  const std::vector<float> w = values(std::size_t(kOut) * kIn, 1);
  const std::vector<float> x = values(std::size_t(kMaxRows) * kIn, 2);
  const std::vector<float> y0 = values(std::size_t(kMaxRows) * kLdy, 3);
  std::vector<std::uint8_t> q8(std::size_t(kOut) * (kIn / 32) * 34);
  for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<std::uint8_t>((i * 37) % 251);
  for (std::size_t b = 0; b < q8.size(); b += 34) q8[b + 1] = 0x14;  // f16 scale near 2^-10
  struct Route {
    engine::WeightFormat format;
    std::int32_t rows;
    engine::Activations activations;
    bool bf16, deterministic;
  };
  using engine::Activations;
  using engine::WeightFormat;
  const Route routes[] = {
      {WeightFormat::kF32, 1, Activations::kF32, false, false},
      {WeightFormat::kF32, 16, Activations::kF32, false, false},
      {WeightFormat::kF32, 80, Activations::kF32, false, false},
      {WeightFormat::kF32, 16, Activations::kF32, true, false},
      {WeightFormat::kF32, 5, Activations::kF32, false, true},
      {WeightFormat::kQ8_0, 1, Activations::kF32, false, false},
      {WeightFormat::kQ8_0, 3, Activations::kF32, false, false},
      {WeightFormat::kQ8_0, 4, Activations::kF32, false, false},
      {WeightFormat::kQ8_0, 16, Activations::kF32, false, false},
      {WeightFormat::kQ8_0, 80, Activations::kF32, false, false},
      {WeightFormat::kQ8_0, 4, Activations::kInt8, false, false},
      {WeightFormat::kQ8_0, 16, Activations::kInt8, false, false},
      {WeightFormat::kQ8_0, 16, Activations::kF32, true, false},
      {WeightFormat::kQ8_0, 20, Activations::kF32, false, true},
  };
  for (const Route& r : routes) {
    SCOPED_TRACE(std::string(engine::weight_format_name(r.format)) + ", " + std::to_string(r.rows) +
                 " rows" + (r.activations == Activations::kInt8 ? ", int8" : "") +
                 (r.bf16 ? ", bf16" : "") + (r.deterministic ? ", deterministic" : ""));
    engine::LinearArgs a{
        x.data(), r.rows,
        kIn,      r.format == WeightFormat::kF32 ? static_cast<const void*>(w.data()) : q8.data(),
        kOut,     nullptr,
        true,     r.deterministic,
        r.format};
    a.ldy = kLdy;
    a.activations = r.activations;
    a.bf16_batches = r.bf16;
    engine::LinearScratch scratch;
    std::vector<float> outside(y0.begin(), y0.begin() + std::size_t(r.rows) * kLdy);
    a.y = outside.data();
    engine::linear(a, scratch);
    std::vector<float> inside(y0.begin(), y0.begin() + std::size_t(r.rows) * kLdy);
    a.y = inside.data();
    engine::size_for_team(scratch);
    core::run_in_team(true, [&] { engine::linear(a, scratch); });
    EXPECT_EQ(std::memcmp(inside.data(), outside.data(), inside.size() * sizeof(float)), 0);
  }
}

}  // namespace
}  // namespace pagedattn
