// The messages of disaggregated prefill/decode (see disagg.h) and their byte
// encoding. Both ranks run the same build on one machine or a homogeneous
// cluster, so fixed-width fields go in native byte order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "distributed/byte_message.h"
#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/engine.h"
#include "pagedattn/errors.h"

namespace pagedattn::dist {

// MPI tags. Pages of request i travel under kTagPagesBase + i % kPageTagSpan
// (tags stay below 32767, the smallest MPI_TAG_UB the standard allows).
inline constexpr int kTagConfig = 1;
inline constexpr int kTagRequest = 2;
inline constexpr int kTagAck = 3;
inline constexpr int kTagStatus = 4;
inline constexpr int kTagPrompt = 5;  // serve: decode -> prefill, a prompt to run
inline constexpr int kTagPagesBase = 100;
inline constexpr int kPageTagSpan = 30000;
inline int pages_tag(std::int64_t index) {
  return kTagPagesBase + static_cast<int>(index % kPageTagSpan);
}

// prefill -> decode: a prefilled request, the end of requests, or the
// prefill rank's failure (between two requests: the decode rank then stops
// with its message instead of waiting).
inline constexpr std::int64_t kEndOfRequests = -1;
inline constexpr std::int64_t kPrefillFailed = -2;
struct RequestMessage {
  std::int64_t index = kEndOfRequests;
  std::vector<std::int32_t> first_tokens;  // one per sample (params.n)
  std::vector<std::int32_t> prompt;
  SamplingParams params;  // seed always set
  std::string error;      // kPrefillFailed (serve: this request failed): why

  std::vector<std::byte> encode() const;
  static RequestMessage decode(std::span<const std::byte> bytes);
};

enum class Ack : std::int32_t { kAccepted = 0, kRetry = 1, kRejected = 2 };
enum class TransferStatus : std::int32_t { kPagesFollow = 0, kCancelled = 1 };

struct AckMessage {
  Ack ack = Ack::kAccepted;
  std::string error;  // kRejected: why

  std::vector<std::byte> encode() const;
  static AckMessage decode(std::span<const std::byte> bytes);
};

// Waits until a message from `source` with `tag` is there, sleeping between
// polls (from 20 us up to 1 ms): an idle rank leaves its core to the others
// instead of spinning in MPI_Probe.
void wait_for_message(const MpiComm& comm, int source, int tag);

}  // namespace pagedattn::dist
