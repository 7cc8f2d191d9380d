// A thin wrapper over one MPI communicator: the few point-to-point and
// collective calls pagedattn's distributed modes use (tensor parallelism,
// disaggregated prefill/decode), each turning an MPI failure into a typed
// pagedattn error that names the call. MPI itself (OpenMPI from Debian) does
// the communication; nothing here re-implements it.
//
//   dist::MpiSession session(argc, argv);   // MPI_Init_thread .. MPI_Finalize
//   dist::MpiComm world = dist::MpiComm::world();
//   world.all_reduce_sum(partial_sums);      // in place, every rank
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <mpi.h>

namespace pagedattn::dist {

// How threads may call MPI: kFunneled, only the thread that made the
// session (OpenMP regions never do); kSerialized, any thread, one at a time
// (a server whose engine thread steps a tensor-parallel model).
enum class MpiThreads { kFunneled, kSerialized };

// Initializes MPI for the process's lifetime and finalizes it on
// destruction. One per process; a second is refused. Unsupported when the
// MPI library cannot give the thread support asked for.
class MpiSession {
 public:
  MpiSession(int* argc, char*** argv, MpiThreads threads = MpiThreads::kFunneled);
  ~MpiSession();
  MpiSession(const MpiSession&) = delete;
  MpiSession& operator=(const MpiSession&) = delete;
  // True while some MpiSession (or another library) holds MPI initialized.
  static bool active();
};

// A pending non-blocking transfer; wait() completes it (the destructor waits
// too, so a buffer is never released while MPI still uses it).
class MpiRequest {
 public:
  MpiRequest() = default;
  explicit MpiRequest(MPI_Request r) : request_(r) {}
  MpiRequest(MpiRequest&& other) noexcept;
  MpiRequest& operator=(MpiRequest&& other) noexcept;
  ~MpiRequest();
  void wait();
  bool done() const { return request_ == MPI_REQUEST_NULL; }
  // Withdraws a receive that has not matched yet (MPI_Cancel) and completes
  // the request; a receive that already completed stays received.
  void cancel();

 private:
  MPI_Request request_ = MPI_REQUEST_NULL;
};

class MpiComm {
 public:
  // MPI_COMM_WORLD with errors returned (not fatal), so they become exceptions.
  static MpiComm world();

  int rank() const { return rank_; }
  int size() const { return size_; }
  MPI_Comm handle() const { return comm_; }

  void barrier() const;
  // Element-wise sum over ranks, result on every rank (in place).
  void all_reduce_sum(std::span<float> values) const;
  // Copies root's bytes into every rank's `bytes` (same size on every rank).
  void broadcast(std::span<std::byte> bytes, int root) const;
  // As broadcast, for a wait of unknown length (a follower waiting for the
  // next step of an idle server): the other ranks poll a non-blocking
  // broadcast and sleep between polls, backing off to 1 ms, instead of MPI's
  // busy wait, which holds a core at 100% for as long as nothing comes.
  // Every rank must take this call (not broadcast) for the same message.
  void broadcast_idle(std::span<std::byte> bytes, int root) const;
  // Broadcasts a vector whose size only the root knows (size first; with
  // `idle`, the size by broadcast_idle: every rank must pass the same).
  template <class T>
  void broadcast_vector(std::vector<T>& values, int root, bool idle = false) const {
    std::int64_t n = static_cast<std::int64_t>(values.size());
    const auto size = std::as_writable_bytes(std::span(&n, 1));
    if (idle)
      broadcast_idle(size, root);
    else
      broadcast(size, root);
    values.resize(static_cast<std::size_t>(n));
    broadcast(std::as_writable_bytes(std::span(values)), root);
  }
  // Blocking and non-blocking byte transfers with a tag.
  void send(std::span<const std::byte> bytes, int dest, int tag) const;
  void recv(std::span<std::byte> bytes, int source, int tag) const;
  MpiRequest isend(std::span<const std::byte> bytes, int dest, int tag) const;
  MpiRequest irecv(std::span<std::byte> bytes, int source, int tag) const;
  // A byte stream scattered over `runs` of memory, moved by one message
  // described by an MPI derived datatype (MPI_Type_create_hindexed over the
  // runs' addresses): no staging copy. Sender and receiver may cut the
  // stream at different places; its total length must match.
  MpiRequest isend_runs(std::span<const std::span<std::byte>> runs, int dest, int tag) const;
  MpiRequest irecv_runs(std::span<const std::span<std::byte>> runs, int source, int tag) const;
  // Whether a message from `source` with `tag` is waiting (MPI_Iprobe).
  bool has_message(int source, int tag) const;
  // Receives a message of any length (MPI_Probe, then MPI_Recv).
  std::vector<std::byte> recv_any_size(int source, int tag) const;
  // Ends every rank of the communicator (after a failure on one of them, so
  // the others do not wait forever in a collective).
  [[noreturn]] void abort(int exit_code) const;

 private:
  explicit MpiComm(MPI_Comm comm);
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
};

// Throws pagedattn::InternalError naming `call` and MPI's message when rc is
// not MPI_SUCCESS.
void check_mpi(int rc, const char* call);

}  // namespace pagedattn::dist
