// The prefill rank: runs each prompt through the model in its own cache
// (chunks of max_num_batched_tokens, like the engine's prefill), samples the
// first token with the engine's sampler, pins the prompt's pages, hands them
// to the decode rank and keeps nothing once they are sent.
#include <algorithm>
#include <array>
#include <chrono>

#include "core/seconds_since.h"
#include "distributed/config_fingerprint.h"
#include "distributed/disagg_protocol.h"
#include "distributed/kv_transfer.h"
#include "pagedattn/distributed/disagg.h"

namespace pagedattn::dist {
namespace {

struct Prefilled {
  std::vector<std::int32_t> first_tokens;  // one per sample (params.n)
  OutgoingKV pinned;
};

class PrefillInstance {
 public:
  explicit PrefillInstance(const EngineConfig& config)
      : config_(config), cache_(engine_cache_config(config)) {}

  PagedKVCache& cache() { return cache_; }

  // Computes the prompt's K/V as sequence `id` and each sample's first
  // token, then pins the pages and drops the sequence (the pin is all that
  // holds them).
  Prefilled run(SeqId id, std::span<const std::int32_t> prompt, const SamplingParams& params) {
    cache_.add_sequence(id);
    try {
      std::vector<std::int32_t> first = forward_prompt(id, prompt, params);
      Prefilled out{std::move(first), cache_.outgoing_pages(id)};
      cache_.remove_sequence(id);
      return out;
    } catch (...) {
      if (cache_.in_forward()) cache_.cancel_forward();
      cache_.remove_sequence(id);
      throw;
    }
  }

 private:
  std::vector<std::int32_t> forward_prompt(SeqId id, std::span<const std::int32_t> prompt,
                                           const SamplingParams& params) {
    Model& model = *config_.model;
    const auto vocab = static_cast<std::size_t>(model.spec().vocab_size);
    logits_.resize(vocab);
    const std::int64_t chunk = config_.max_num_batched_tokens;
    const std::array<SeqId, 1> ids{id};
    for (std::int64_t begin = 0; begin < std::ssize(prompt); begin += chunk) {
      const std::int64_t n = std::min<std::int64_t>(chunk, std::ssize(prompt) - begin);
      const bool last = begin + n == std::ssize(prompt);
      const std::array<std::int64_t, 1> lens{n};
      const std::array<std::int32_t, 1> row{static_cast<std::int32_t>(n - 1)};
      cache_.begin_forward(ids, lens);
      const ForwardBatch batch{
          prompt.subspan(static_cast<std::size_t>(begin), static_cast<std::size_t>(n)),
          last ? std::span<const std::int32_t>(row) : std::span<const std::int32_t>(),
          config_.deterministic};
      model.forward(batch, cache_, last ? std::span<float>(logits_) : std::span<float>());
      cache_.end_forward();
    }
    // Every sample draws from the prompt's logits, as the engine's first
    // sampling of a request with n > 1 does.
    std::vector<std::int32_t> first;
    for (std::int32_t i = 0; i < params.n; ++i)
      first.push_back(sample_token(logits_, params, *params.seed, i, std::ssize(prompt), prompt,
                                   model.spec().eos_token_id));
    return first;
  }

  EngineConfig config_;
  PagedKVCache cache_;
  std::vector<float> logits_;
};

// The checks the model needs before it runs (the decode rank's engine
// validates the rest when it reserves).
void validate(const DisaggRequest& r, std::size_t index, const ModelSpec& spec) {
  require(!r.prompt.empty(), "run_prefill: requests[", index, "].prompt is empty");
  for (std::size_t i = 0; i < r.prompt.size(); ++i)
    require(r.prompt[i] >= 0 && r.prompt[i] < spec.vocab_size, "run_prefill: requests[", index,
            "].prompt[", i, "] = ", r.prompt[i], " is outside [0, vocab_size = ", spec.vocab_size,
            ")");
  require(std::ssize(r.prompt) < spec.max_position, "run_prefill: requests[", index,
          "].prompt has ", r.prompt.size(), " tokens, the model's max_position is ",
          spec.max_position);
  require(r.params.n == 1, "run_prefill: requests[", index, "].params.n = ", r.params.n,
          " must be 1 (generate's decode rank reports one sample)");
  // The decode rank reports tokens only: the logits logprobs need stay here.
  require(!r.params.logprobs && !r.params.prompt_logprobs, "run_prefill: requests[", index,
          "].params: logprobs and prompt_logprobs are not supported in disaggregated "
          "prefill/decode; leave them unset");
  try {
    check_sampling_params(r.params);  // sample_token's draw needs them valid
  } catch (const InvalidArgument& e) {
    throw InvalidArgument(detail::concat("run_prefill: requests[", index, "].params: ", e.what()));
  }
}

SamplingParams with_seed(SamplingParams p, const EngineConfig& config, std::int64_t index) {
  if (!p.seed)
    p.seed = config.seed ^ (0x9e3779b97f4a7c15ull * static_cast<std::uint64_t>(index + 1));
  return p;
}

// Offers request `index` until the decode rank accepts or rejects it, then
// sends (or cancels) its pages. The pin is released in every case.
void transfer(const MpiComm& comm, int peer, const RequestMessage& msg, const OutgoingKV& pinned,
              const PrefillHooks& hooks, TransferStats& stats) {
  const std::vector<std::byte> request = msg.encode();
  AckMessage ack;
  for (;;) {
    comm.send(request, peer, kTagRequest);
    ack = AckMessage::decode(comm.recv_any_size(peer, kTagAck));
    if (ack.ack != Ack::kRetry) break;
    ++stats.retries;
  }
  if (ack.ack == Ack::kRejected) return;
  const bool cancel = hooks.cancel_after_ack && hooks.cancel_after_ack(msg.index);
  const auto status = cancel ? TransferStatus::kCancelled : TransferStatus::kPagesFollow;
  comm.send(std::as_bytes(std::span(&status, 1)), peer, kTagStatus);
  if (cancel) {
    ++stats.cancelled;
    return;
  }
  const auto start = std::chrono::steady_clock::now();
  KVTransfer sends = post_kv_sends(comm, pinned.runs, peer, pages_tag(msg.index));
  wait_all(sends);
  stats.seconds += seconds_since(start);
  stats.bytes += pinned.runs.total_bytes();
  ++stats.transfers;
}

// Prefills `msg`; a failure is reported to the decode rank (which would
// otherwise wait for the next request forever), then rethrown.
Prefilled prefill_or_report(PrefillInstance& prefill, const MpiComm& comm, int peer,
                            const RequestMessage& msg) {
  try {
    return prefill.run(msg.index, msg.prompt, msg.params);
  } catch (const std::exception& e) {
    RequestMessage failed;
    failed.index = kPrefillFailed;
    failed.error = e.what();
    comm.send(failed.encode(), peer, kTagRequest);
    throw;
  }
}

}  // namespace

TransferStats run_prefill(const MpiComm& comm, int decode_rank, const EngineConfig& config,
                          std::span<const DisaggRequest> requests, const PrefillHooks& hooks) {
  require_same_config(comm, decode_rank, config);
  for (std::size_t i = 0; i < requests.size(); ++i) validate(requests[i], i, config.model->spec());
  PrefillInstance prefill(config);
  TransferStats stats;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    RequestMessage msg;
    msg.index = static_cast<std::int64_t>(i);
    msg.prompt = requests[i].prompt;
    msg.params = with_seed(requests[i].params, config, msg.index);
    Prefilled p = prefill_or_report(prefill, comm, decode_rank, msg);
    msg.first_tokens = p.first_tokens;
    try {
      transfer(comm, decode_rank, msg, p.pinned, hooks, stats);
    } catch (...) {
      prefill.cache().release_outgoing(p.pinned.id);
      throw;
    }
    prefill.cache().release_outgoing(p.pinned.id);
  }
  comm.send(RequestMessage{}.encode(), decode_rank, kTagRequest);  // the end of requests
  prefill.cache().check_invariants();
  stats.pages_left = prefill.cache().num_pages() - prefill.cache().num_free_pages();
  return stats;
}

// --- serve --disaggregate: a prefill rank of a server ---------------------------
namespace {

// Runs one prompt rank 0 sent and offers its pages until rank 0 takes them
// (accepted: sent; rejected: the request was cancelled meanwhile). A prompt
// the model fails on (pagedattn::Error, such as non-finite logits) is
// reported to rank 0 as that request's error, and the rank serves on.
void serve_one(PrefillInstance& prefill, const MpiComm& comm, int decode_rank,
               const RequestMessage& job, TransferStats& stats) {
  RequestMessage offer;
  offer.index = job.index;
  Prefilled p;
  try {
    p = prefill.run(job.index, job.prompt, job.params);
  } catch (const Error& e) {
    offer.error = e.what();
    comm.send(offer.encode(), decode_rank, kTagRequest);
    return;
  }
  try {
    offer.first_tokens = p.first_tokens;
    comm.send(offer.encode(), decode_rank, kTagRequest);
    wait_for_message(comm, decode_rank, kTagAck);
    const AckMessage ack = AckMessage::decode(comm.recv_any_size(decode_rank, kTagAck));
    if (ack.ack == Ack::kAccepted) {
      const auto start = std::chrono::steady_clock::now();
      KVTransfer sends = post_kv_sends(comm, p.pinned.runs, decode_rank, pages_tag(job.index));
      wait_all(sends);
      stats.seconds += seconds_since(start);
      stats.bytes += p.pinned.runs.total_bytes();
      ++stats.transfers;
    } else {
      ++stats.cancelled;
    }
  } catch (...) {
    prefill.cache().release_outgoing(p.pinned.id);
    throw;
  }
  prefill.cache().release_outgoing(p.pinned.id);
}

}  // namespace

TransferStats serve_prefill(const MpiComm& comm, int decode_rank, const EngineConfig& config) {
  require(decode_rank >= 0 && decode_rank < comm.size() && decode_rank != comm.rank(),
          "serve_prefill: decode_rank = ", decode_rank, " must be another rank of the ",
          comm.size(), " (this is rank ", comm.rank(), ")");
  require_same_config(comm, decode_rank, config);
  PrefillInstance prefill(config);
  TransferStats stats;
  for (;;) {
    wait_for_message(comm, decode_rank, kTagPrompt);
    const RequestMessage job = RequestMessage::decode(comm.recv_any_size(decode_rank, kTagPrompt));
    if (job.index == kEndOfRequests) break;
    serve_one(prefill, comm, decode_rank, job, stats);
  }
  prefill.cache().check_invariants();
  stats.pages_left = prefill.cache().num_pages() - prefill.cache().num_free_pages();
  return stats;
}

}  // namespace pagedattn::dist
