// Disaggregated prefill/decode over MPI (TVM's DisaggPrepareRecv /
// DisaggMarkSend, vLLM's KV transfer): a prefill rank runs each prompt
// through the model and samples its first token, then sends the prompt's
// pages (every layer, int8 scales included) to a decode rank, which
// received them straight into pages it reserved and decodes the request in
// its Engine. Page ids are remapped (each side's pages are its own); MPI
// moves the bytes from one cache's storage into the other's with derived
// datatypes, nothing is staged. A refused, failed or cancelled transfer
// frees every page on both sides.
//
// Per request (tags in src/distributed/disagg_protocol.h):
//   prefill -> decode  request (prompt, first token, sampling params)
//   decode  -> prefill ack: accepted (pages reserved, receives posted),
//                      retry (no pages now: the prefill side asks again after
//                      the decode side stepped) or rejected (invalid: error)
//   prefill -> decode  status: pages follow, or cancelled
//   prefill -> decode  the pages, one message for all layers
// then `end` after the last request, or `failed` (with the reason) when the
// prefill rank fails between two requests: the decode rank then throws it.
// Both ranks first compare their configs (src/distributed/config_fingerprint.h):
// a mismatch is a clear error on both, no hang.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "pagedattn/distributed/mpi_comm.h"
#include "pagedattn/engine.h"

namespace pagedattn::dist {

struct DisaggRequest {
  std::vector<std::int32_t> prompt;
  SamplingParams params;  // n must be 1; no seed: one derived from EngineConfig.seed and the index
};

// A request as the decode rank saw it: every output token (the prefill
// rank's first one included), or why it has none.
struct DisaggResult {
  std::vector<std::int32_t> tokens;
  FinishReason finish = FinishReason::kNone;  // kAborted for a cancelled transfer
  std::string error;                          // a request the decode rank rejected
};

// Test and fault-injection hooks; all optional.
struct PrefillHooks {
  // After the decode rank reserved pages for request `index`: true cancels
  // the transfer instead of sending the pages (a failed prefill).
  std::function<bool(std::int64_t index)> cancel_after_ack;
};
struct DecodeHooks {
  // Output tokens of request `index` as they come (the first token too).
  std::function<void(std::int64_t index, std::span<const std::int32_t> tokens)> on_tokens;
  // While request `index`'s pages are in flight: true aborts it (its
  // reserved pages are freed once MPI is done with them).
  std::function<bool(std::int64_t index)> abort_during_transfer;
};

struct TransferStats {
  std::int64_t transfers = 0;   // sequences whose pages arrived
  std::int64_t cancelled = 0;   // transfers cancelled or aborted
  std::int64_t retries = 0;     // requests refused for lack of pages, asked again
  std::int64_t bytes = 0;       // K/V bytes moved
  double seconds = 0.0;         // in page transfers (post to completion)
  std::int64_t pages_left = 0;  // pages still in use when the rank finished (0: no leak)
};

struct DecodeReport {
  std::vector<DisaggResult> results;  // [number of requests the prefill rank sent]
  TransferStats transfer;
  EngineStats engine;
};

// Rank roles. Each call first checks that the peer's config matches
// (InvalidArgument on both ranks otherwise). The prefill rank's cache needs
// room for one prompt; the decode rank's for what it decodes at once.
TransferStats run_prefill(const MpiComm& comm, int decode_rank, const EngineConfig& config,
                          std::span<const DisaggRequest> requests, const PrefillHooks& hooks = {});
DecodeReport run_decode(const MpiComm& comm, int prefill_rank, const EngineConfig& config,
                        const DecodeHooks& hooks = {});

// --- serve --disaggregate: a server's decode engine fed by prefill ranks ---------
// Rank 0 runs the server and its Engine; every other rank runs serve_prefill.
// Per request (tags in src/distributed/disagg_protocol.h):
//   rank 0  -> prefill  the prompt and sampling params (seed set)
//   prefill -> rank 0   an offer: each sample's first token, or the error
//   rank 0  -> prefill  ack: accepted (pages reserved, receives posted) or
//                       rejected (the request was cancelled meanwhile)
//   prefill -> rank 0   the pages, one message for all layers
// Rank 0 holds an offer while its cache has no room (the prefill rank waits,
// pages pinned) and takes it after a step freed pages. `close` ends every
// prefill rank's serve_prefill.

// A request whose prefill finished: imported into the engine (request_id),
// or failed (error).
struct PrefillArrival {
  std::int64_t key = 0;
  RequestId request_id = -1;               // -1: not imported (error says why)
  std::vector<std::int32_t> first_tokens;  // [n]: each sample's first token
  std::vector<FinishReason> finish;        // [n]: kStop/kLength: done at its first token
  std::string error;
};

// Rank 0's side. Every call but the constructor on the one thread that steps
// the engine, between its steps; none waits for a prompt to be prefilled.
class PrefillClient {
 public:
  // Collective with serve_prefill on every other rank: compares configs
  // (InvalidArgument on every rank on a mismatch). Keeps a copy of `comm`.
  PrefillClient(const MpiComm& comm, const EngineConfig& config);
  ~PrefillClient();  // close()s if not closed (errors are swallowed)
  PrefillClient(const PrefillClient&) = delete;
  PrefillClient& operator=(const PrefillClient&) = delete;

  // Queues a request under the caller's `key` (unique among those not yet
  // arrived); with n > 1 the prefill rank draws every sample's first token
  // and the engine forks the imported prompt (Engine::commit_import_samples).
  // InvalidArgument for an empty prompt, a negative key, or logprobs /
  // prompt_logprobs (the logits stay on the prefill rank).
  void submit(std::int64_t key, std::span<const std::int32_t> prompt, const SamplingParams& params);
  // The request will not arrive: dropped from the queue, or refused when its
  // prefill rank offers it. Nothing for a key that arrived or is unknown.
  void cancel(std::int64_t key);
  // Sends queued prompts to idle prefill ranks, takes the offers that came
  // (reserve_import on `engine`, the pages, commit_import) as far as the
  // cache has room, and returns the requests that arrived or failed.
  std::vector<PrefillArrival> poll(Engine& engine);
  // Requests submitted that have not arrived nor been cancelled.
  bool busy() const;
  // Cancels every request left (waiting for the prompts being prefilled) and
  // ends the prefill ranks' serve_prefill. Later calls do nothing.
  void close();
  TransferStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A prefill rank of a server: runs the prompts `decode_rank` sends until its
// PrefillClient closes; returns what it moved (pages_left 0: no leak).
TransferStats serve_prefill(const MpiComm& comm, int decode_rank, const EngineConfig& config);

}  // namespace pagedattn::dist
