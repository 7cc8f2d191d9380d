// `mpirun -np N pagedattn serve --disaggregate ...` (builds with MPI only):
// rank 0 serves HTTP and decodes every request in its engine; ranks 1..N-1
// prefill the prompts and send their KV pages to rank 0
// (pagedattn/distributed/disagg.h, docs/disaggregation.md).
#pragma once

#include <memory>

#include "engine_worker.h"

namespace pagedattn::serve {

// MPI for the process's lifetime when argv asks for --disaggregate (the
// handle finalizes it); null otherwise. Threads: serialized, as rank 0's
// engine thread makes the MPI calls.
std::shared_ptr<void> start_mpi_if_disaggregated(int* argc, char*** argv);

// Collective over the mpirun ranks. Rank 0: the RemotePrefill its engine
// worker hands prompts to. Every other rank: prefills until rank 0's server
// stops, then returns null (the command then exits 0). InvalidArgument for
// fewer than 2 ranks; a prefill rank's failure ends every rank (MPI_Abort).
std::unique_ptr<RemotePrefill> start_disaggregated(const EngineConfig& config);

}  // namespace pagedattn::serve
