// The decode rank: an Engine that takes requests prefilled elsewhere. Between
// its steps it answers the prefill rank: reserves pages for an offered
// request (or asks it to retry later), posts the receives straight into
// them, and commits (or cancels) once the status and pages arrive.
#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>
#include <unordered_map>
#include <utility>

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
    const std::int32_t first = msg.first_tokens.at(0);  // n is 1 (run_prefill checks)
    result.finish = engine_.commit_import(slot.request_id, first);
    result.tokens.push_back(first);
    if (hooks_.on_tokens) hooks_.on_tokens(msg.index, std::span(&first, 1));
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

// --- serve --disaggregate: rank 0's PrefillClient -----------------------------

struct PrefillClient::Impl {
  struct Job {
    std::int64_t key = 0;
    std::vector<std::int32_t> prompt;
    SamplingParams params;  // seed set
  };
  // What one prefill rank is doing: nothing, prefilling `job`, or (offer
  // set) waiting for rank 0 to take the pages.
  struct Rank {
    std::optional<Job> job;
    bool cancelled = false;
    std::optional<RequestMessage> offer;
    bool waited = false;  // the offer found no room once (counted in stats.retries)
  };

  const MpiComm comm;  // a copy: the handle outlives the caller's
  std::uint64_t seed;
  std::deque<Job> queue;
  std::vector<Rank> ranks;      // [comm.size()]; rank 0's entry unused
  std::deque<int> offer_order;  // ranks whose offers wait for pages, oldest first
  TransferStats stats;
  bool closed = false;

  Impl(const MpiComm& c, const EngineConfig& config)
      : comm(c), seed(config.seed), ranks(static_cast<std::size_t>(c.size())) {}

  void send_prompt(int rank, Job job) {
    RequestMessage msg;
    msg.index = job.key;
    msg.prompt = job.prompt;
    msg.params = job.params;
    comm.send(msg.encode(), rank, kTagPrompt);
    ranks[static_cast<std::size_t>(rank)].job = std::move(job);
  }

  void dispatch() {
    for (int r = 1; r < comm.size() && !queue.empty(); ++r) {
      if (ranks[static_cast<std::size_t>(r)].job) continue;
      Job job = std::move(queue.front());
      queue.pop_front();
      send_prompt(r, std::move(job));
    }
  }

  void answer(int rank, Ack ack, std::string error = {}) {
    comm.send(AckMessage{ack, std::move(error)}.encode(), rank, kTagAck);
  }

  void free_rank(int rank) {
    ranks[static_cast<std::size_t>(rank)] = Rank{};
    std::erase(offer_order, rank);
  }

  // Offers that came: a failed prefill arrives as its error; a cancelled
  // request's offer is refused at once.
  void receive_offers(std::vector<PrefillArrival>& arrivals) {
    for (int r = 1; r < comm.size(); ++r) {
      Rank& rank = ranks[static_cast<std::size_t>(r)];
      if (!rank.job || rank.offer || !comm.has_message(r, kTagRequest)) continue;
      RequestMessage offer = RequestMessage::decode(comm.recv_any_size(r, kTagRequest));
      require<InternalError>(offer.index == rank.job->key, "serve --disaggregate: rank ", r,
                             " offered request ", offer.index, ", it was sent ", rank.job->key);
      if (!offer.error.empty()) {
        if (!rank.cancelled) {
          PrefillArrival failed;
          failed.key = offer.index;
          failed.error = detail::concat("prefill rank ", r, ": ", offer.error);
          arrivals.push_back(std::move(failed));
        }
        free_rank(r);  // a failed prefill waits for no answer
      } else if (rank.cancelled) {
        answer(r, Ack::kRejected);
        ++stats.cancelled;
        free_rank(r);
      } else {
        rank.offer = std::move(offer);
        offer_order.push_back(r);
      }
    }
  }

  // Imports the oldest offers while the engine has room; false when it had none.
  bool import_next(Engine& engine, std::vector<PrefillArrival>& arrivals) {
    const int r = offer_order.front();
    Rank& rank = ranks[static_cast<std::size_t>(r)];
    const Job& job = *rank.job;
    PrefillArrival arrival;
    arrival.key = job.key;
    arrival.first_tokens = rank.offer->first_tokens;
    std::optional<ImportSlot> slot;
    try {
      slot = engine.reserve_import(job.prompt, job.params);
    } catch (const InvalidArgument& e) {
      answer(r, Ack::kRejected, e.what());
      arrival.error = e.what();
      arrivals.push_back(std::move(arrival));
      free_rank(r);
      return true;
    }
    if (!slot) {  // asked again after the next step
      if (!std::exchange(rank.waited, true)) ++stats.retries;
      return false;
    }
    const auto start = std::chrono::steady_clock::now();
    KVTransfer receives = post_kv_receives(comm, slot->pages, r, pages_tag(job.key));
    answer(r, Ack::kAccepted);
    try {
      wait_all(receives);  // MPI is done with the pages only now
    } catch (...) {
      engine.cancel_import(slot->request_id);
      throw;
    }
    stats.seconds += seconds_since(start);
    stats.bytes += slot->pages.total_bytes();
    ++stats.transfers;
    arrival.request_id = slot->request_id;
    arrival.finish = engine.commit_import_samples(slot->request_id, arrival.first_tokens);
    arrivals.push_back(std::move(arrival));
    free_rank(r);
    return true;
  }

  void cancel(std::int64_t key) {
    if (std::erase_if(queue, [&](const Job& j) { return j.key == key; }) > 0) return;
    for (int r = 1; r < comm.size(); ++r) {
      Rank& rank = ranks[static_cast<std::size_t>(r)];
      if (!rank.job || rank.job->key != key) continue;
      if (rank.offer) {  // its pages wait for room: refuse them now
        answer(r, Ack::kRejected);
        ++stats.cancelled;
        free_rank(r);
      } else {
        rank.cancelled = true;
      }
    }
  }

  void close() {
    if (closed) return;
    closed = true;
    queue.clear();
    for (int r = 1; r < comm.size(); ++r) {
      Rank& rank = ranks[static_cast<std::size_t>(r)];
      if (!rank.job) continue;
      if (!rank.offer) {
        wait_for_message(comm, r, kTagRequest);
        rank.offer = RequestMessage::decode(comm.recv_any_size(r, kTagRequest));
      }
      if (rank.offer->error.empty()) answer(r, Ack::kRejected);
      free_rank(r);
    }
    for (int r = 1; r < comm.size(); ++r) comm.send(RequestMessage{}.encode(), r, kTagPrompt);
  }
};

PrefillClient::PrefillClient(const MpiComm& comm, const EngineConfig& config) {
  require(comm.rank() == 0 && comm.size() >= 2, "PrefillClient: comm has rank ", comm.rank(),
          " of ", comm.size(), "; it must be rank 0 of at least 2 (the others prefill)");
  for (int r = 1; r < comm.size(); ++r) require_same_config(comm, r, config);
  impl_ = std::make_unique<Impl>(comm, config);
}

PrefillClient::~PrefillClient() {
  try {
    impl_->close();
  } catch (const std::exception&) {
    // The prefill ranks are gone or MPI failed: nothing left to release here.
  }
}

void PrefillClient::submit(std::int64_t key, std::span<const std::int32_t> prompt,
                           const SamplingParams& params) {
  require(key >= 0, "PrefillClient::submit: key = ", key, " must be >= 0");
  require(!prompt.empty(), "PrefillClient::submit: prompt is empty");
  require(!params.logprobs && !params.prompt_logprobs,
          "PrefillClient::submit: logprobs and prompt_logprobs are not supported (the logits "
          "stay on the prefill rank); leave them unset");
  require<InvalidState>(!impl_->closed, "PrefillClient::submit: the client is closed");
  SamplingParams seeded = params;
  if (!seeded.seed)
    seeded.seed = impl_->seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(key + 1));
  impl_->queue.push_back({key, {prompt.begin(), prompt.end()}, std::move(seeded)});
}

void PrefillClient::cancel(std::int64_t key) {
  impl_->cancel(key);
}

std::vector<PrefillArrival> PrefillClient::poll(Engine& engine) {
  std::vector<PrefillArrival> arrivals;
  if (impl_->closed) return arrivals;
  impl_->dispatch();
  impl_->receive_offers(arrivals);
  while (!impl_->offer_order.empty() && impl_->import_next(engine, arrivals)) {
  }
  impl_->dispatch();
  return arrivals;
}

bool PrefillClient::busy() const {
  if (!impl_->queue.empty()) return true;
  for (const Impl::Rank& r : impl_->ranks)
    if (r.job) return true;
  return false;
}

void PrefillClient::close() {
  impl_->close();
}

TransferStats PrefillClient::stats() const {
  return impl_->stats;
}

}  // namespace pagedattn::dist
