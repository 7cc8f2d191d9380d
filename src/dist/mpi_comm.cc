#include "dist/mpi_comm.h"

#include <cstdlib>
#include <limits>
#include <utility>

#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

bool g_session_open = false;

int checked_count(std::size_t bytes, const char* call) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw InvalidArgument(detail::concat(call, ": ", bytes, " bytes exceed one MPI message (2^31 - 1)"));
  return static_cast<int>(bytes);
}

}  // namespace

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  throw InternalError(detail::concat(call, " failed: ", std::string(message, static_cast<std::size_t>(length))));
}

MpiSession::MpiSession(int* argc, char*** argv, MpiThreads threads) {
  require<InvalidState>(!g_session_open && !active(), "MpiSession: MPI is already initialized");
  const int required =
      threads == MpiThreads::kSerialized ? MPI_THREAD_SERIALIZED : MPI_THREAD_FUNNELED;
  int provided = 0;
  check_mpi(MPI_Init_thread(argc, argv, required, &provided), "MPI_Init_thread");
  g_session_open = true;
  if (provided < required) {
    MPI_Finalize();
    g_session_open = false;
    throw Unsupported(detail::concat("MpiSession: MPI gives thread support level ", provided,
                                     ", below the ", required, " asked for"));
  }
}

MpiSession::~MpiSession() {
  MPI_Finalize();
  g_session_open = false;
}

bool MpiSession::active() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  return initialized && !finalized;
}

MpiRequest::MpiRequest(MpiRequest&& other) noexcept
    : request_(std::exchange(other.request_, MPI_REQUEST_NULL)) {}

MpiRequest& MpiRequest::operator=(MpiRequest&& other) noexcept {
  if (this != &other) {
    if (!done()) MPI_Wait(&request_, MPI_STATUS_IGNORE);
    request_ = std::exchange(other.request_, MPI_REQUEST_NULL);
  }
  return *this;
}

MpiRequest::~MpiRequest() {
  if (!done()) MPI_Wait(&request_, MPI_STATUS_IGNORE);
}

void MpiRequest::wait() {
  if (done()) return;
  check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
}

MpiComm::MpiComm(MPI_Comm comm) : comm_(comm) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiComm MpiComm::world() {
  require<InvalidState>(MpiSession::active(), "MpiComm::world: MPI is not initialized (make an MpiSession first)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return MpiComm(MPI_COMM_WORLD);
}

void MpiComm::barrier() const { check_mpi(MPI_Barrier(comm_), "MPI_Barrier"); }

void MpiComm::all_reduce_sum(std::span<float> values) const {
  const int n = checked_count(values.size(), "MpiComm::all_reduce_sum");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, MPI_FLOAT, MPI_SUM, comm_), "MPI_Allreduce");
}

void MpiComm::broadcast(std::span<std::byte> bytes, int root) const {
  const int n = checked_count(bytes.size(), "MpiComm::broadcast");
  check_mpi(MPI_Bcast(bytes.data(), n, MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiComm::send(std::span<const std::byte> bytes, int dest, int tag) const {
  const int n = checked_count(bytes.size(), "MpiComm::send");
  check_mpi(MPI_Send(bytes.data(), n, MPI_BYTE, dest, tag, comm_), "MPI_Send");
}

void MpiComm::recv(std::span<std::byte> bytes, int source, int tag) const {
  const int n = checked_count(bytes.size(), "MpiComm::recv");
  check_mpi(MPI_Recv(bytes.data(), n, MPI_BYTE, source, tag, comm_, MPI_STATUS_IGNORE), "MPI_Recv");
}

MpiRequest MpiComm::isend(std::span<const std::byte> bytes, int dest, int tag) const {
  const int n = checked_count(bytes.size(), "MpiComm::isend");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Isend(bytes.data(), n, MPI_BYTE, dest, tag, comm_, &r), "MPI_Isend");
  return MpiRequest(r);
}

MpiRequest MpiComm::irecv(std::span<std::byte> bytes, int source, int tag) const {
  const int n = checked_count(bytes.size(), "MpiComm::irecv");
  MPI_Request r = MPI_REQUEST_NULL;
  check_mpi(MPI_Irecv(bytes.data(), n, MPI_BYTE, source, tag, comm_, &r), "MPI_Irecv");
  return MpiRequest(r);
}

void MpiComm::abort(int exit_code) const {
  MPI_Abort(comm_, exit_code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace pagedattn::dist
