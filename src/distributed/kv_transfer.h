// Moving one sequence's K/V pages between two caches on two ranks: one MPI
// message for every layer (several only past 2 GiB, MPI's int byte count),
// described by a derived datatype over the sequence's page runs
// (PagedKVCache::outgoing_pages on the sender, reserve_incoming on the
// receiver), so MPI reads the K/V blocks from the sender's page storage and
// writes them into the receiver's. Runs shorter than a threshold (small
// pages of scattered sequences; an int8 cache keeps its token scales inside
// its K pages, so they add no runs of their own) go through a staging
// buffer instead: the sender packs each stretch of consecutive short runs
// with memcpy into one block, the receiver unpacks it after the message
// completes. OpenMPI's datatype engine pays per block, so this keeps the
// block count near the number of K/V pages and the copies to a few percent
// of the bytes. The threshold is each side's own choice: the message is the
// same byte stream either way.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/kv_cache.h"

namespace pagedattn::dist {

// Runs shorter than this are staged; 0 stages none (a pure datatype message),
// a huge value stages every run (one contiguous message).
inline constexpr std::int64_t kDefaultStageBelowBytes = 1024;

// One direction of a sequence's transfer, posted by post_kv_sends or
// post_kv_receives. The pages must stay pinned (reserved) until wait()
// returns; a receive's staged runs are written by wait(). Destroying an
// unfinished transfer waits for its messages (without unpacking).
class KVTransfer {
 public:
  KVTransfer(KVTransfer&&) noexcept;
  KVTransfer& operator=(KVTransfer&&) noexcept;
  ~KVTransfer();

  void wait();
  // Receives only: withdraws the messages (the sender will not send).
  void cancel();
  std::int64_t num_messages() const;
  std::int64_t num_blocks() const;        // datatype blocks over all messages
  std::int64_t num_staged_bytes() const;  // bytes copied through the staging buffer

  struct State;

 private:
  explicit KVTransfer(std::unique_ptr<State> state);
  friend KVTransfer post_kv_sends(const MpiComm&, const KVPageRuns&, int, int, std::int64_t);
  friend KVTransfer post_kv_receives(const MpiComm&, const KVPageRuns&, int, int, std::int64_t);
  std::unique_ptr<State> state_;
};

// Posts the sends (receives) of every layer of `runs` (sender and receiver
// group layers alike, as their layer_bytes are equal).
KVTransfer post_kv_sends(const MpiComm& comm, const KVPageRuns& runs, int dest, int tag,
                         std::int64_t stage_below = kDefaultStageBelowBytes);
KVTransfer post_kv_receives(const MpiComm& comm, const KVPageRuns& runs, int source, int tag,
                            std::int64_t stage_below = kDefaultStageBelowBytes);
void wait_all(KVTransfer& transfer);
// Withdraws receives whose sender will not send (a cancelled transfer).
void cancel_all(KVTransfer& transfer);

}  // namespace pagedattn::dist
