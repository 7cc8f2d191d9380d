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
  std::int32_t first_token = 0;
  OutgoingKV pinned;
};

class PrefillInstance {
 public:
  explicit PrefillInstance(const EngineConfig& config)
      : config_(config), cache_(engine_cache_config(config)) {}

  PagedKVCache& cache() { return cache_; }

  // Computes the prompt's K/V as sequence `id` and its first token, then
  // pins the pages and drops the sequence (the pin is all that holds them).
  Prefilled run(SeqId id, std::span<const std::int32_t> prompt, const SamplingParams& params) {
    cache_.add_sequence(id);
    try {
      const std::int32_t first = forward_prompt(id, prompt, params);
      Prefilled out{first, cache_.outgoing_pages(id)};
      cache_.remove_sequence(id);
      return out;
    } catch (...) {
      if (cache_.in_forward()) cache_.cancel_forward();
      cache_.remove_sequence(id);
      throw;
    }
  }

 private:
  std::int32_t forward_prompt(SeqId id, std::span<const std::int32_t> prompt,
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
    return sample_token(logits_, params, *params.seed, 0, std::ssize(prompt), prompt,
                        model.spec().eos_token_id);
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
          " must be 1 (parallel samples are not disaggregated)");
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
    msg.first_token = p.first_token;
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

}  // namespace pagedattn::dist
