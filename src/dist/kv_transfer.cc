#include "dist/kv_transfer.h"

namespace pagedattn::dist {

std::vector<MpiRequest> post_kv_sends(const MpiComm& comm, const KVPageRuns& runs, int dest,
                                      int tag) {
  std::vector<MpiRequest> requests;
  requests.reserve(runs.layers.size());
  for (const auto& layer : runs.layers) requests.push_back(comm.isend_runs(layer, dest, tag));
  return requests;
}

std::vector<MpiRequest> post_kv_receives(const MpiComm& comm, const KVPageRuns& runs, int source,
                                         int tag) {
  std::vector<MpiRequest> requests;
  requests.reserve(runs.layers.size());
  for (const auto& layer : runs.layers) requests.push_back(comm.irecv_runs(layer, source, tag));
  return requests;
}

void wait_all(std::vector<MpiRequest>& requests) {
  for (MpiRequest& r : requests) r.wait();
}

void cancel_all(std::vector<MpiRequest>& requests) {
  for (MpiRequest& r : requests) r.cancel();
}

}  // namespace pagedattn::dist
