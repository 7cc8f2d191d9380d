#include "distributed/kv_transfer.h"

#include <limits>

namespace pagedattn::dist {
namespace {

// The runs of consecutive layers, grouped into as few messages as MPI's
// int byte count allows (one for any sequence under 2 GiB).
std::vector<std::vector<std::span<std::byte>>> messages_of(const KVPageRuns& runs) {
  constexpr std::int64_t kMaxMessageBytes = std::numeric_limits<int>::max();
  std::vector<std::vector<std::span<std::byte>>> messages;
  std::int64_t bytes = kMaxMessageBytes;
  for (const auto& layer : runs.layers) {
    if (bytes + runs.layer_bytes > kMaxMessageBytes) {
      messages.emplace_back();
      bytes = 0;
    }
    messages.back().insert(messages.back().end(), layer.begin(), layer.end());
    bytes += runs.layer_bytes;
  }
  return messages;
}

}  // namespace

std::vector<MpiRequest> post_kv_sends(const MpiComm& comm, const KVPageRuns& runs, int dest,
                                      int tag) {
  std::vector<MpiRequest> requests;
  for (const auto& message : messages_of(runs))
    requests.push_back(comm.isend_runs(message, dest, tag));
  return requests;
}

std::vector<MpiRequest> post_kv_receives(const MpiComm& comm, const KVPageRuns& runs, int source,
                                         int tag) {
  std::vector<MpiRequest> requests;
  for (const auto& message : messages_of(runs))
    requests.push_back(comm.irecv_runs(message, source, tag));
  return requests;
}

void wait_all(std::vector<MpiRequest>& requests) {
  for (MpiRequest& r : requests) r.wait();
}

void cancel_all(std::vector<MpiRequest>& requests) {
  for (MpiRequest& r : requests) r.cancel();
}

}  // namespace pagedattn::dist
