// main() of the MPI gtest binaries: every rank runs every test; ranks print
// only their failures (rank 0 prints the summary), and the exit status is
// nonzero on every rank when a test failed on any of them.
#include <gtest/gtest.h>

#include "pagedattn/distributed/mpi_comm.h"

int main(int argc, char** argv) {
  pagedattn::dist::MpiSession session(&argc, &argv);
  ::testing::InitGoogleTest(&argc, argv);
  const auto world = pagedattn::dist::MpiComm::world();
  if (world.rank() != 0) {
    auto& listeners = ::testing::UnitTest::GetInstance()->listeners();
    delete listeners.Release(listeners.default_result_printer());
  }
  float failed = RUN_ALL_TESTS() != 0 ? 1.0f : 0.0f;
  world.all_reduce_sum(std::span(&failed, 1));
  return failed > 0 ? 1 : 0;
}
