// The decode rank: an Engine that takes requests prefilled elsewhere. Between
// its steps it answers the prefill rank: reserves pages for an offered
// request (or asks it to retry later), posts the receives straight into
// them, and commits (or cancels) once the status and pages arrive.
#include <chrono>
#include <unordered_map>

#include "core/seconds_since.h"
#include "distributed/config_fingerprint.h"
#include "distributed/disagg_protocol.h"
#include "distributed/kv_transfer.h"
#include "pagedattn/distributed/disagg.h"

namespace pagedattn::dist {
namespace {

class DecodeInstance {
 public:
  DecodeInstance(const MpiComm& comm, int peer, const EngineConfig& config,
                 const DecodeHooks& hooks)
      : comm_(comm), peer_(peer), engine_(config), hooks_(hooks) {}

  DecodeReport run() {
    bool more = true;
    while (more || engine_.has_unfinished()) {
      // Idle: wait for the prefill rank; busy: answer it between steps.
      if (more && (!engine_.has_unfinished() || comm_.has_message(peer_, kTagRequest)))
        more = handle(RequestMessage::decode(comm_.recv_any_size(peer_, kTagRequest)));
      if (engine_.has_unfinished()) collect(engine_.step());
    }
    engine_.cache().check_invariants();
    report_.engine = engine_.stats();
    report_.transfer.pages_left = report_.engine.pages_in_use;
    return std::move(report_);
  }

 private:
  // One offered request; false at the end of requests.
  bool handle(const RequestMessage& msg) {
    require<InternalError>(msg.index != kPrefillFailed,
                           "disaggregated prefill/decode: the prefill rank failed: ", msg.error);
    if (msg.index == kEndOfRequests) return false;
    if (std::ssize(report_.results) <= msg.index)
      report_.results.resize(static_cast<std::size_t>(msg.index) + 1);
    DisaggResult& result = report_.results[static_cast<std::size_t>(msg.index)];
    std::optional<ImportSlot> slot;
    try {
      slot = engine_.reserve_import(msg.prompt, msg.params);
    } catch (const InvalidArgument& e) {
      result.error = e.what();
      comm_.send(AckMessage{Ack::kRejected, e.what()}.encode(), peer_, kTagAck);
      return true;
    }
    if (!slot) {
      ++report_.transfer.retries;
      comm_.send(AckMessage{Ack::kRetry, {}}.encode(), peer_, kTagAck);
      return true;
    }
    // Receives are posted before the ack, so the pages never wait in an
    // MPI buffer: they land in the reserved pages directly.
    const auto start = std::chrono::steady_clock::now();
    KVTransfer receives = post_kv_receives(comm_, slot->pages, peer_, pages_tag(msg.index));
    comm_.send(AckMessage{}.encode(), peer_, kTagAck);
    receive(msg, *slot, receives, start, result);
    return true;
  }

  void receive(const RequestMessage& msg, const ImportSlot& slot, KVTransfer& receives,
               std::chrono::steady_clock::time_point start, DisaggResult& result) {
    TransferStatus status{};
    comm_.recv(std::as_writable_bytes(std::span(&status, 1)), peer_, kTagStatus);
    if (status == TransferStatus::kCancelled) {
      cancel_all(receives);
      engine_.cancel_import(slot.request_id);
      result.finish = FinishReason::kAborted;
      ++report_.transfer.cancelled;
      return;
    }
    const bool abort = hooks_.abort_during_transfer && hooks_.abort_during_transfer(msg.index);
    wait_all(receives);  // MPI is done with the pages only now
    report_.transfer.seconds += seconds_since(start);
    report_.transfer.bytes += slot.pages.total_bytes();
    ++report_.transfer.transfers;
    if (abort) {
      engine_.cancel_import(slot.request_id);
      result.finish = FinishReason::kAborted;
      ++report_.transfer.cancelled;
      return;
    }
    result.finish = engine_.commit_import(slot.request_id, msg.first_token);
    result.tokens.push_back(msg.first_token);
    if (hooks_.on_tokens) hooks_.on_tokens(msg.index, std::span(&msg.first_token, 1));
    if (result.finish == FinishReason::kNone) index_of_[slot.request_id] = msg.index;
  }

  void collect(const std::vector<RequestOutput>& outputs) {
    for (const RequestOutput& out : outputs) {
      const std::int64_t index = index_of_.at(out.request_id);
      DisaggResult& result = report_.results[static_cast<std::size_t>(index)];
      for (const SampleOutput& s : out.samples) {
        result.tokens.insert(result.tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
        result.finish = s.finish_reason;
        if (hooks_.on_tokens && !s.new_token_ids.empty()) hooks_.on_tokens(index, s.new_token_ids);
      }
      if (out.finished) index_of_.erase(out.request_id);
    }
  }

  const MpiComm& comm_;
  int peer_;
  Engine engine_;
  DecodeHooks hooks_;
  DecodeReport report_;
  std::unordered_map<RequestId, std::int64_t> index_of_;
};

}  // namespace

DecodeReport run_decode(const MpiComm& comm, int prefill_rank, const EngineConfig& config,
                        const DecodeHooks& hooks) {
  require_same_config(comm, prefill_rank, config);
  return DecodeInstance(comm, prefill_rank, config, hooks).run();
}

}  // namespace pagedattn::dist
