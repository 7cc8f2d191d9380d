#include "pagedattn/distributed/mpi_comm.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <limits>
#include <thread>
#include <utility>

#include "pagedattn/errors.h"

namespace pagedattn::dist {
namespace {

bool g_session_open = false;

int checked_count(std::size_t bytes, const char* call) {
  if (bytes > static_cast<std::size_t>(std::numeric_limits<int>::max()))
    throw InvalidArgument(
        detail::concat(call, ": ", bytes, " bytes exceed one MPI message (2^31 - 1)"));
  return static_cast<int>(bytes);
}

}  // namespace

void check_mpi(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char message[MPI_MAX_ERROR_STRING];
  int length = 0;
  MPI_Error_string(rc, message, &length);
  throw InternalError(
      detail::concat(call, " failed: ", std::string(message, static_cast<std::size_t>(length))));
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

void MpiRequest::cancel() {
  if (done()) return;
  check_mpi(MPI_Cancel(&request_), "MPI_Cancel");
  check_mpi(MPI_Wait(&request_, MPI_STATUS_IGNORE), "MPI_Wait");
}

MpiComm::MpiComm(MPI_Comm comm) : comm_(comm) {
  check_mpi(MPI_Comm_rank(comm_, &rank_), "MPI_Comm_rank");
  check_mpi(MPI_Comm_size(comm_, &size_), "MPI_Comm_size");
}

MpiComm MpiComm::world() {
  require<InvalidState>(MpiSession::active(),
                        "MpiComm::world: MPI is not initialized (make an MpiSession first)");
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  return MpiComm(MPI_COMM_WORLD);
}

void MpiComm::barrier() const {
  check_mpi(MPI_Barrier(comm_), "MPI_Barrier");
}

void MpiComm::all_reduce_sum(std::span<float> values) const {
  const int n = checked_count(values.size(), "MpiComm::all_reduce_sum");
  check_mpi(MPI_Allreduce(MPI_IN_PLACE, values.data(), n, MPI_FLOAT, MPI_SUM, comm_),
            "MPI_Allreduce");
}

void MpiComm::broadcast(std::span<std::byte> bytes, int root) const {
  const int n = checked_count(bytes.size(), "MpiComm::broadcast");
  check_mpi(MPI_Bcast(bytes.data(), n, MPI_BYTE, root, comm_), "MPI_Bcast");
}

void MpiComm::broadcast_idle(std::span<std::byte> bytes, int root) const {
  const int n = checked_count(bytes.size(), "MpiComm::broadcast_idle");
  MPI_Request request = MPI_REQUEST_NULL;
  check_mpi(MPI_Ibcast(bytes.data(), n, MPI_BYTE, root, comm_, &request), "MPI_Ibcast");
  if (rank() == root) {
    check_mpi(MPI_Wait(&request, MPI_STATUS_IGNORE), "MPI_Wait");
    return;
  }
  // Busy polls first (a step that follows at once pays no sleep), then sleeps
  // doubling from 20 us to 1 ms: an idle rank wakes about 1000 times a second.
  constexpr int kBusyPolls = 2000;
  constexpr auto kLongestSleep = std::chrono::microseconds(1000);
  auto sleep = std::chrono::microseconds(20);
  for (int polls = 0;; ++polls) {
    int done = 0;
    check_mpi(MPI_Test(&request, &done, MPI_STATUS_IGNORE), "MPI_Test");
    if (done != 0) return;
    if (polls < kBusyPolls) continue;
    std::this_thread::sleep_for(sleep);
    sleep = std::min(sleep * 2, kLongestSleep);
  }
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

namespace {

// An MPI_BYTE datatype covering `runs` at their absolute addresses (used
// with MPI_BOTTOM), committed; the caller frees it.
MPI_Datatype runs_type(std::span<const std::span<std::byte>> runs, const char* call) {
  std::vector<int> lengths;
  std::vector<MPI_Aint> addresses;
  lengths.reserve(runs.size());
  addresses.reserve(runs.size());
  for (std::span<std::byte> run : runs) {
    lengths.push_back(checked_count(run.size(), call));
    MPI_Aint address = 0;
    check_mpi(MPI_Get_address(run.data(), &address), "MPI_Get_address");
    addresses.push_back(address);
  }
  MPI_Datatype type = MPI_DATATYPE_NULL;
  check_mpi(MPI_Type_create_hindexed(checked_count(runs.size(), call), lengths.data(),
                                     addresses.data(), MPI_BYTE, &type),
            "MPI_Type_create_hindexed");
  check_mpi(MPI_Type_commit(&type), "MPI_Type_commit");
  return type;
}

}  // namespace

// A pending operation keeps its datatype alive, so it is freed right away.
MpiRequest MpiComm::isend_runs(std::span<const std::span<std::byte>> runs, int dest,
                               int tag) const {
  MPI_Datatype type = runs_type(runs, "MpiComm::isend_runs");
  MPI_Request r = MPI_REQUEST_NULL;
  const int rc = MPI_Isend(MPI_BOTTOM, 1, type, dest, tag, comm_, &r);
  MPI_Type_free(&type);
  check_mpi(rc, "MPI_Isend");
  return MpiRequest(r);
}

MpiRequest MpiComm::irecv_runs(std::span<const std::span<std::byte>> runs, int source,
                               int tag) const {
  MPI_Datatype type = runs_type(runs, "MpiComm::irecv_runs");
  MPI_Request r = MPI_REQUEST_NULL;
  const int rc = MPI_Irecv(MPI_BOTTOM, 1, type, source, tag, comm_, &r);
  MPI_Type_free(&type);
  check_mpi(rc, "MPI_Irecv");
  return MpiRequest(r);
}

bool MpiComm::has_message(int source, int tag) const {
  int flag = 0;
  check_mpi(MPI_Iprobe(source, tag, comm_, &flag, MPI_STATUS_IGNORE), "MPI_Iprobe");
  return flag != 0;
}

std::vector<std::byte> MpiComm::recv_any_size(int source, int tag) const {
  MPI_Status status;
  check_mpi(MPI_Probe(source, tag, comm_, &status), "MPI_Probe");
  int count = 0;
  check_mpi(MPI_Get_count(&status, MPI_BYTE, &count), "MPI_Get_count");
  std::vector<std::byte> bytes(static_cast<std::size_t>(count));
  check_mpi(MPI_Recv(bytes.data(), count, MPI_BYTE, status.MPI_SOURCE, status.MPI_TAG, comm_,
                     MPI_STATUS_IGNORE),
            "MPI_Recv");
  return bytes;
}

void MpiComm::abort(int exit_code) const {
  MPI_Abort(comm_, exit_code);
  std::abort();  // MPI_Abort does not return; this keeps [[noreturn]] honest
}

}  // namespace pagedattn::dist
