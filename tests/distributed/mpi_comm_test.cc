// The MPI wrapper on 2+ ranks: collectives, variable-size broadcast,
// non-blocking point-to-point, and errors as typed exceptions.
#include <gtest/gtest.h>

#include <chrono>
#include <ctime>
#include <numeric>
#include <thread>
#include <vector>

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

TEST(MpiComm, AllReduceSumsEveryRanksValues) {
  const auto world = MpiComm::world();
  ASSERT_GE(world.size(), 2);
  std::vector<float> v = {1.0f, static_cast<float>(world.rank()), -2.5f};
  world.all_reduce_sum(v);
  const int n = world.size();
  EXPECT_EQ(v[0], static_cast<float>(n));
  EXPECT_EQ(v[1], static_cast<float>(n * (n - 1) / 2));
  EXPECT_EQ(v[2], -2.5f * static_cast<float>(n));
}

TEST(MpiComm, BroadcastVectorSendsSizeAndContents) {
  const auto world = MpiComm::world();
  std::vector<std::int64_t> v;
  if (world.rank() == 0) v = {7, -3, 1ll << 40};
  world.broadcast_vector(v, 0);
  EXPECT_EQ(v, (std::vector<std::int64_t>{7, -3, 1ll << 40}));
}

// The idle wait of a follower: rank 0 broadcasts late (the others are past
// their busy polls, sleeping), then at once; every rank gets the bytes, and
// a waiting rank spends less CPU than the wall time it waited.
TEST(MpiComm, IdleBroadcastDeliversLateAndPromptMessages) {
  const auto world = MpiComm::world();
  for (const int delay_ms : {200, 0}) {
    std::vector<std::int32_t> v;
    if (world.rank() == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(delay_ms));
      v = {delay_ms, 5, -6};
    }
    const std::clock_t cpu = std::clock();
    const auto wall = std::chrono::steady_clock::now();
    world.broadcast_vector(v, 0, /*idle=*/true);
    EXPECT_EQ(v, (std::vector<std::int32_t>{delay_ms, 5, -6}));
    if (world.rank() != 0 && delay_ms > 0) {
      const double cpu_s = double(std::clock() - cpu) / CLOCKS_PER_SEC;
      const double wall_s =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - wall).count();
      EXPECT_LT(cpu_s, 0.5 * wall_s) << "a waiting rank should sleep, not spin";
    }
  }
}

TEST(MpiComm, NonBlockingRingDeliversEachNeighboursBytes) {
  const auto world = MpiComm::world();
  const int next = (world.rank() + 1) % world.size();
  const int prev = (world.rank() + world.size() - 1) % world.size();
  std::vector<int> out(1000), in(1000, -1);
  std::iota(out.begin(), out.end(), world.rank() * 1000);
  MpiRequest r = world.irecv(std::as_writable_bytes(std::span(in)), prev, 5);
  MpiRequest s = world.isend(std::as_bytes(std::span(out)), next, 5);
  r.wait();
  s.wait();
  EXPECT_TRUE(r.done());
  EXPECT_EQ(in[0], prev * 1000);
  EXPECT_EQ(in[999], prev * 1000 + 999);
}

TEST(MpiComm, AnInvalidRankIsATypedError) {
  const auto world = MpiComm::world();
  std::vector<std::byte> b(4);
  EXPECT_THROW(world.send(b, world.size() + 3, 0), InternalError);
}

TEST(MpiComm, ASecondSessionIsRefused) {
  int argc = 0;
  char** argv = nullptr;
  EXPECT_THROW(MpiSession(&argc, &argv), InvalidState);
}

}  // namespace
}  // namespace pagedattn::dist
