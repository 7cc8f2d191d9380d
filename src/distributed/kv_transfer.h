// Moving one sequence's K/V pages between two caches on two ranks: one MPI
// message for every layer (several only past 2 GiB, MPI's int byte count),
// described by a derived datatype over the sequence's page runs (PagedKVCache::outgoing_pages on
// the sender, reserve_incoming on the receiver), so MPI reads from the sender's page storage and
// writes into the receiver's with no staging buffer.
#pragma once

#include <vector>

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::dist {

// Posts the sends (receives) of every layer of `runs` (sender and receiver
// group layers alike, as their layer_bytes are equal); the pages must stay
// pinned (reserved) until every returned request completes.
std::vector<MpiRequest> post_kv_sends(const MpiComm& comm, const KVPageRuns& runs, int dest,
                                      int tag);
std::vector<MpiRequest> post_kv_receives(const MpiComm& comm, const KVPageRuns& runs, int source,
                                         int tag);
void wait_all(std::vector<MpiRequest>& requests);
// Withdraws receives whose sender will not send (a cancelled transfer).
void cancel_all(std::vector<MpiRequest>& requests);

}  // namespace pagedattn::dist
