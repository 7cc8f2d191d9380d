// MPI_Allreduce (sum of floats, through dist::MpiComm) at the message sizes
// tensor parallelism sends: hidden_size x tokens floats, twice per layer.
// Run under mpirun: `mpirun -np 2 pagedattn_bench_mpi_allreduce`. Rank 0
// prints per size the mean time per call, the algorithmic bandwidth
// (bytes / time) and the ring-model bus bandwidth (2 (N-1) / N x bytes /
// time), next to the same process adding two buffers of that size in
// memory (the work a shared-memory reduction cannot avoid) as a baseline.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "pagedattn/distributed/mpi_comm.h"

namespace {

using Clock = std::chrono::steady_clock;
using pagedattn::dist::MpiComm;

// Mean seconds per call of f over at least 0.2 s (every rank runs the same
// number of calls: rank 0 decides when to stop).
template <class F>
double time_calls(const MpiComm& world, F&& f) {
  for (int i = 0; i < 10; ++i) f();
  std::int64_t calls = 0;
  const auto start = Clock::now();
  for (std::int64_t batch = 1;; batch *= 2) {
    for (std::int64_t i = 0; i < batch; ++i) f();
    calls += batch;
    float done = std::chrono::duration<double>(Clock::now() - start).count() > 0.2 ? 1.0f : 0.0f;
    world.broadcast(std::as_writable_bytes(std::span(&done, 1)), 0);
    if (done != 0.0f) break;
  }
  return std::chrono::duration<double>(Clock::now() - start).count() / double(calls);
}

}  // namespace

int main(int argc, char** argv) {
  pagedattn::dist::MpiSession session(&argc, &argv);
  const MpiComm world = MpiComm::world();
  const int n = world.size();
  if (world.rank() == 0)
    std::printf(
        "MPI_Allreduce, %d ranks (hidden 768 = the small preset; 576 = SmolLM2-135M)\n"
        "%10s %10s %12s %12s %12s %14s\n",
        n, "floats", "KiB", "us/call", "alg GB/s", "bus GB/s", "local add GB/s");
  for (std::int64_t tokens : {1, 8, 64, 256, 2048}) {
    const std::size_t count = std::size_t(768 * tokens);
    std::vector<float> values(count, 1.0f), other(count, 2.0f);
    const double mpi = time_calls(world, [&] {
      world.all_reduce_sum(values);
      std::fill(values.begin(), values.end(), 1.0f);
    });
    const double fill = time_calls(world, [&] { std::fill(values.begin(), values.end(), 1.0f); });
    const double add = time_calls(world, [&] {
      for (std::size_t i = 0; i < count; ++i) values[i] += other[i];
    });
    const double bytes = 4.0 * double(count), seconds = std::max(mpi - fill, 1e-9);
    if (world.rank() == 0)
      std::printf("%10zu %10.1f %12.2f %12.2f %12.2f %14.2f\n", count, bytes / 1024.0,
                  seconds * 1e6, bytes / seconds / 1e9, 2.0 * (n - 1) / n * bytes / seconds / 1e9,
                  3.0 * bytes / add / 1e9);
  }
  return 0;
}
