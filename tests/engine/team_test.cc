// core/team.h: inside a team each piece's tasks and rows run once, over the
// team's threads, and every thread waits for the piece's end (timed inside a
// TeamWaitScope); outside one the pieces run as a region of their own (or on
// the caller). linear()
// inside a team gives bitwise what it gives outside, on every route.
#include "core/team.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "engine/counter_random.h"
#include "engine/gemm.h"
#include "pagedattn/errors.h"
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

// for_row_ranges_split gives rows too narrow for for_row_ranges to split a
// thread each (as many ranges as rows, up to the team's size), each row once;
// outside a team, all of them to the caller.
TEST(Team, RowRangesSplitGoOverTheTeamHoweverNarrowTheRows) {
  const Threads threads(3);
  for (const std::int32_t rows : {0, 1, 2, 7}) {
    std::vector<std::atomic<int>> runs(std::size_t(rows) + 1);
    std::atomic<int> ranges{0};
    core::run_in_team(true, [&] {
      core::for_row_ranges_split(rows, [&](std::int32_t begin, std::int32_t end) {
        ++ranges;
        EXPECT_LT(begin, end);
        for (std::int32_t r = begin; r < end; ++r) ++runs[std::size_t(r)];
      });
    });
    EXPECT_EQ(ranges.load(), std::min(rows, 3)) << rows;
    for (std::int32_t r = 0; r < rows; ++r) EXPECT_EQ(runs[std::size_t(r)].load(), 1) << r;
  }
  std::int32_t called = 0;
  core::for_row_ranges_split(5, [&](std::int32_t begin, std::int32_t end) {
    EXPECT_EQ(begin, 0);
    EXPECT_EQ(end, 5);
    ++called;
  });
  EXPECT_EQ(called, 1);
}

// Every thread's writes before a barrier are seen by every thread after it,
// and none passes it early: plain (non-atomic) writes to a slot per thread,
// read by all after each barrier, over many barriers; a thread now and then
// late by more than the spin time, so that the others sleep and are woken.
// With the team's own barrier (spinning, then sleeping), OpenMP's, and a
// SpinBarrier that sleeps at once (OMP_WAIT_POLICY=passive).
TEST(Team, BarriersOrderEveryThreadsWritesBeforeTheReads) {
  constexpr int kThreads = 4, kRounds = 1200;
  struct Rounds {
    std::int32_t slot[2][kThreads] = {};
    std::atomic<int> wrong{0};
    // On each thread of a region of kThreads.
    void run(const std::function<void()>& barrier) {
      const int me = omp_get_thread_num(), size = omp_get_num_threads();
      for (int round = 1; round <= kRounds; ++round) {
        if (round % 400 == me + 1) std::this_thread::sleep_for(std::chrono::milliseconds(3));
        slot[round % 2][me] = round;
        barrier();
        // The next round writes the other slots, this one's the round after:
        // none may pass the next barrier before every thread read these.
        for (int t = 0; t < size; ++t) wrong += slot[round % 2][t] != round ? 1 : 0;
      }
    }
  };
  const Threads threads(kThreads);
  for (const bool own : {true, false}) {
    core::set_team_barrier(own);
    Rounds rounds;
    std::atomic<int> size{0};
    core::run_in_team(true, [&] {
      size = omp_get_num_threads();
      rounds.run([] { core::team_barrier(); });
    });
    core::set_team_barrier(true);
    EXPECT_EQ(size.load(), kThreads);
    EXPECT_EQ(rounds.wrong.load(), 0) << own;
  }
  for (const double spin : {0.0, core::kBarrierSpinSeconds}) {
    core::detail::SpinBarrier barrier(spin);
    barrier.reset(kThreads);
    Rounds rounds;
#pragma omp parallel num_threads(kThreads)
    rounds.run([&] { barrier.arrive_and_wait(); });
    EXPECT_EQ(rounds.wrong.load(), 0) << spin;
  }
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

// Each part's chunks run once and in order on whichever thread claims them;
// a thread slowed in its own part has its later chunks taken by the others
// (and, with sharing off, keeps them all), over several pieces of a team.
TEST(Team, SharedChunksRunOnceAndASlowThreadsLaterChunksGoToOthers) {
  const Threads threads(3);
  constexpr std::int32_t kParts = 3, kChunks = 8, kPieces = 3;
  for (const bool sharing : {true, false}) {
    SCOPED_TRACE(sharing ? "sharing" : "sharing off");
    core::set_chunk_sharing(sharing);
    std::vector<std::atomic<int>> runs(std::size_t(kPieces) * kParts * kChunks);
    std::vector<std::atomic<int>> ran_on(runs.size());
    std::atomic<int> out_of_order{0};
    core::run_in_team(true, [&] {
      for (std::int32_t piece = 0; piece < kPieces; ++piece) {
        std::int32_t last_chunk[kParts] = {-1, -1, -1};  // this thread's, per part
        core::for_each_chunk_shared(kParts, kChunks, [&](std::int32_t part, std::int32_t chunk) {
          const std::size_t at = (std::size_t(piece) * kParts + part) * kChunks + chunk;
          ++runs[at];
          ran_on[at] = omp_get_thread_num();
          if (chunk <= last_chunk[part]) ++out_of_order;
          last_chunk[part] = chunk;
          if (part == 0 && omp_get_thread_num() == 0)  // thread 0 slow in its own part
            std::this_thread::sleep_for(std::chrono::milliseconds(15));
        });
      }
    });
    EXPECT_EQ(out_of_order.load(), 0);
    for (auto& r : runs) EXPECT_EQ(r.load(), 1);
    for (std::int32_t piece = 0; piece < kPieces; ++piece) {
      int part0_elsewhere = 0;
      for (std::int32_t part = 0; part < kParts; ++part)
        for (std::int32_t chunk = 0; chunk < kChunks; ++chunk) {
          const int thread = ran_on[(std::size_t(piece) * kParts + part) * kChunks + chunk];
          if (part == 0 && thread != 0) ++part0_elsewhere;
          if (!sharing) {
            EXPECT_EQ(thread, part) << piece << " " << part << " " << chunk;
          }
        }
      if (sharing) {
        EXPECT_GT(part0_elsewhere, 0) << piece;
      }
    }
  }
  core::set_chunk_sharing(true);
  // Outside a team: every chunk, on the caller or a region.
  std::atomic<int> outside{0};
  core::for_each_chunk_shared(2, 5, [&](std::int32_t, std::int32_t) { ++outside; });
  EXPECT_EQ(outside.load(), 10);
}

// A thread's column range in chunks: in order, covering it once, each
// chunk a whole number of granules but the last.
TEST(Team, ChunkRangesCoverAThreadsColumnsInWholeGranules) {
  for (const std::int32_t granule : {1, 4, 16})
    for (const engine::IndexRange cols :
         {engine::IndexRange{0, 36}, engine::IndexRange{36, 72}, engine::IndexRange{100, 101},
          engine::IndexRange{5, 5}, engine::IndexRange{64, 3136}})
      for (const std::int32_t chunks : {1, 2, 4, 7}) {
        std::int32_t at = cols.begin;
        for (std::int32_t c = 0; c < chunks; ++c) {
          const engine::IndexRange r = engine::chunk_range(cols, chunks, c, granule);
          EXPECT_EQ(r.begin, at);
          EXPECT_LE(r.begin, r.end);
          if (r.end < cols.end) {
            EXPECT_EQ((r.end - r.begin) % granule, 0);
          }
          at = r.end;
        }
        EXPECT_EQ(at, cols.end) << granule << " " << chunks;
      }
}

// The int8 tiles' split: every (row, column) of the product exactly once,
// each thread's columns whole groups, a left-over group's rows cut only
// where the left-over groups are at most half the threads; then no thread
// does more than per_thread groups and its share of one more group's rows.
TEST(Team, GroupSplitCoversTheProductOnceAndCutsLeftOverRows) {
  for (const std::int32_t group : {8, 16})
    for (const std::int32_t out : {0, 1, 15, 16, 100, 192, 400, 576, 960, 3072})
      for (const std::int32_t rows : {1, 2, 3, 12, 64})
        for (const std::int32_t threads : {1, 2, 3, 5, 8, 12, 16, 32, 64}) {
          SCOPED_TRACE(std::to_string(out) + " x " + std::to_string(rows) + ", " +
                       std::to_string(threads) + " threads, groups of " + std::to_string(group));
          const engine::GroupSplit s = engine::split_groups(out, rows, threads, group);
          EXPECT_EQ(s.groups, (out + group - 1) / group);
          EXPECT_EQ(s.rows_cut, s.left > 0 && 2 * s.left <= threads && rows >= 2);
          std::vector<int> runs(std::size_t(out) * std::size_t(rows), 0);
          const auto mark = [&](engine::IndexRange c, engine::IndexRange r) {
            ASSERT_TRUE(0 <= c.begin && c.begin <= c.end && c.end <= out);
            ASSERT_TRUE(0 <= r.begin && r.begin <= r.end && r.end <= rows);
            for (std::int32_t i = r.begin; i < r.end; ++i)
              for (std::int32_t j = c.begin; j < c.end; ++j) ++runs[std::size_t(i) * out + j];
          };
          // The most group-rows a thread may take: per_thread groups of every
          // row, and one more group's rows shared by floor(threads / left).
          const std::int32_t share = s.left == 0 ? 0
                                     : s.rows_cut
                                         ? (rows + threads / s.left - 1) / (threads / s.left)
                                         : rows;
          for (std::int32_t t = 0; t < threads; ++t) {
            const engine::IndexRange c = s.columns(t);
            EXPECT_EQ(c.begin % group, 0);
            EXPECT_TRUE(c.end == out || c.end % group == 0);
            mark(c, {0, rows});
            const engine::GroupSplit::Piece tail = s.tail(t);
            if (tail.empty()) continue;
            EXPECT_EQ(tail.columns.begin % group, 0);
            EXPECT_LE(tail.columns.end - tail.columns.begin, group);
            EXPECT_GE(tail.columns.begin, s.per_thread * threads * group);
            EXPECT_LE(tail.rows.end - tail.rows.begin, share);
            mark(tail.columns, tail.rows);
          }
          EXPECT_TRUE(std::all_of(runs.begin(), runs.end(), [](int n) { return n == 1; }));
        }
  EXPECT_THROW(engine::split_groups(16, 1, 0, 16), InvalidArgument);
  EXPECT_THROW(engine::split_groups(-1, 1, 2, 16), InvalidArgument);
  EXPECT_THROW(engine::split_groups(16, 1, 2, 0), InvalidArgument);
  // SmolLM2's 576 columns over 16 threads: 2 groups each, and 3 rows of 12
  // of one more (a 16th of the columns, 36, cost three whole groups before).
  const engine::GroupSplit smol = engine::split_groups(576, 12, 16, 16);
  EXPECT_EQ(smol.per_thread, 2);
  EXPECT_EQ(smol.left, 4);
  for (std::int32_t t = 0; t < 16; ++t)
    EXPECT_EQ(smol.tail(t).rows.end - smol.tail(t).rows.begin, 3) << t;
}

// Int8 products whose groups leave some over (SmolLM2's 576 columns over 16
// or 8 threads; 400 over 3 and 5), in a team: bitwise as one dot_tiles call
// over every column, with x rounded by each thread or once for all
// (LinearArgs::x_int8, read from each cut's first row).
TEST(Team, Int8ProductsWithLeftOverRowsCutEqualOneCall) {
  if (!engine::dot_tiles_int8_available()) GTEST_SKIP() << "no int8 tiles on this CPU";
  constexpr std::int32_t kIn = 256, kRows = 12;
  std::vector<float> x(std::size_t(kRows) * kIn);
  for (std::size_t i = 0; i < x.size(); ++i)
    x[i] = static_cast<float>(2.0 * engine::counter_uniform(5, 1, i) - 1.0);
  engine::Int8Rows rounded;
  rounded.resize(kRows, kIn);
  engine::quantize_int8_rows(x.data(), 0, kRows, rounded);
  for (const std::int32_t out : {576, 400})
    for (const int team : {16, 8, 5, 3}) {
      SCOPED_TRACE(std::to_string(out) + " columns, " + std::to_string(team) + " threads");
      std::vector<std::uint8_t> q8(std::size_t(out) * (kIn / 32) * 34);
      for (std::size_t i = 0; i < q8.size(); ++i) q8[i] = static_cast<std::uint8_t>((i * 37) % 251);
      for (std::size_t b = 0; b < q8.size(); b += 34) q8[b + 1] = 0x14;  // f16 scale near 2^-10
      std::vector<float> one(std::size_t(kRows) * out), split(one.size());
      core::CacheLineVector<float> tiles;
      engine::DotTilesArgs d{x.data(),   kRows, kIn,  q8.data(), engine::WeightFormat::kQ8_0,
                             one.data(), out,   false};
      d.int8 = true;
      engine::dot_tiles(d, 0, out, tiles);
      const Threads threads(team);
      engine::LinearArgs a{
          x.data(), kRows, kIn, q8.data(), out, nullptr, false, false, engine::WeightFormat::kQ8_0};
      a.activations = engine::Activations::kInt8;
      a.y = split.data();
      engine::LinearScratch scratch;
      engine::size_for_team(scratch);
      for (const engine::Int8Rows* once : {static_cast<engine::Int8Rows*>(nullptr), &rounded}) {
        a.x_int8 = once;
        std::fill(split.begin(), split.end(), 0.0f);
        core::run_in_team(true, [&] { engine::linear(a, scratch); });
        EXPECT_EQ(std::memcmp(split.data(), one.data(), one.size() * sizeof(float)), 0)
            << (once ? "x rounded once" : "x rounded by each thread");
      }
    }
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
    for (const bool sharing : {true, false}) {  // threads taking others' chunks or not
      core::set_chunk_sharing(sharing);
      std::copy(y0.begin(), y0.begin() + std::ptrdiff_t(inside.size()), inside.begin());
      core::run_in_team(true, [&] { engine::linear(a, scratch); });
      EXPECT_EQ(std::memcmp(inside.data(), outside.data(), inside.size() * sizeof(float)), 0)
          << sharing;
    }
    core::set_chunk_sharing(true);
  }
}

}  // namespace
}  // namespace pagedattn
