// What two ranks of a distributed run must agree on: the model's shape and
// identity, and the KV cache's page format. Exchanged at startup so that a
// mismatch (e.g. different models) is a clear error on both ranks instead of
// garbage K/V or a hang.
#pragma once

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/engine.h"

namespace pagedattn::dist {

// Sends this rank's fingerprint of `config` to `peer` and receives the
// peer's; InvalidArgument on both ranks naming every field that differs and
// both values.
void require_same_config(const MpiComm& comm, int peer, const EngineConfig& config);

}  // namespace pagedattn::dist
