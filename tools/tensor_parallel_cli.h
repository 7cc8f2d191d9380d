// --tensor-parallel N for the CLI's engine commands (generate, bench-serve,
// serve): `mpirun -np N pagedattn COMMAND --tensor-parallel N ...`. Rank 0
// runs the command (scheduler, sampling, all I/O) on its model shard; the
// other ranks only follow its steps on theirs and exit 0 when it is done.
// Builds without MPI refuse the flag (Unsupported).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "pagedattn/model.h"
#include "pagedattn/tensor_parallel_shard.h"

namespace pagedattn::tools {

// MPI for the process's lifetime when argv asks for tensor parallelism
// (--tensor-parallel N, N > 1): returned handle finalizes MPI when
// destroyed; null when not asked. Unsupported in a build without MPI.
std::shared_ptr<void> start_mpi_if_requested(int* argc, char*** argv);
// Whether argv asks for tensor parallelism (then `mpirun` runs the process).
bool wants_tensor_parallel(int argc, char** argv);

// Builds this process's shard of the model (the whole model for size 1).
using ShardFactory = std::function<std::unique_ptr<Model>(const TensorParallelShard&)>;

// The model a command runs. tensor_parallel == 1: make({}). Otherwise
// (collective over the mpirun ranks): checks that N is the number of ranks
// and that every rank loads the same `model_arg` (a preset name or a GGUF
// file: compared by size and header hash), builds each rank's shard (a
// failure on any rank fails every rank), then returns rank 0's model, or
// on every other rank follows rank 0 until it is done and returns null:
// the command then returns 0 at once.
std::shared_ptr<Model> make_cli_model(std::int32_t tensor_parallel, const std::string& model_arg,
                                      const ShardFactory& make);

// Where a tensor-parallel run spent its communication time so far.
struct TensorParallelTimes {
  std::int32_t size = 1;
  std::int64_t all_reduce_calls = 0;
  std::int64_t all_reduce_floats = 0;
  double all_reduce_seconds = 0.0;  // inside MPI_Allreduce on rank 0
  double broadcast_seconds = 0.0;   // rank 0 broadcasting steps
};
TensorParallelTimes tensor_parallel_times();

}  // namespace pagedattn::tools
