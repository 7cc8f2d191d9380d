// Request traces for bench-serve: built-in synthetic workloads and JSONL
// trace files.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace pagedattn::tools {

struct TraceRequest {
  std::int32_t prompt_len = 1;  // the whole prompt (shared prefix or history included)
  std::int32_t output_len = 1;
  std::int32_t n = 1;    // parallel samples
  double arrival = 0.0;  // seconds after the start (multi-turn: of the conversation's first turn)
  // shared-prefix: the prompt starts with system prompt `shared_prefix` of
  // `shared_prefix_len` tokens (-1: none).
  std::int32_t shared_prefix = -1;
  std::int32_t shared_prefix_len = 0;
  // multi-turn: turn `turn` of conversation `conversation` (-1: none). Its
  // prompt is the previous turn's prompt and output (history_len tokens in
  // all) and a new message; it is sent when the previous turn has finished.
  std::int32_t conversation = -1;
  std::int32_t turn = 0;
  std::int32_t history_len = 0;
};

// bench-serve runs on the wall clock: a request arriving later than this is a
// mistake (a rate of 1e-300 req/s, a trace in microseconds), not a benchmark.
inline constexpr double kMaxArrivalSeconds = 86400.0;
inline constexpr std::int32_t kMaxSamplesPerRequest = 256;

struct WorkloadOptions {
  // sharegpt-like | alpaca-like | parallel-sampling | long-context | shared-prefix | multi-turn
  std::string name = "sharegpt-like";
  std::int32_t num_requests = 300;  // multi-turn: conversations x turns (rounded up)
  double request_rate = 0.0;        // requests/s of Poisson arrivals; 0 = all at once
  double length_scale = 1.0;        // multiplies every prompt and output length
  std::int32_t max_len = 2048;      // prompt + output cap per request
  std::uint64_t seed = 1;
  std::int32_t num_shared_prefixes = 4;   // shared-prefix: distinct system prompts
  std::int32_t shared_prefix_len = 1024;  // shared-prefix: tokens per system prompt (not scaled)
  std::int32_t num_turns = 4;             // multi-turn: turns per conversation
};

// Lognormal lengths (ShareGPT-like: means ~160 prompt / ~340 output tokens;
// Alpaca-like: ~20 / ~60; long-context: ~1500 / ~100), some requests with
// n = 2..4 samples (all of them for parallel-sampling). shared-prefix: each
// request is one of num_shared_prefixes system prompts (picked at random)
// and a unique question of ~32 tokens, answered in ~64. multi-turn:
// conversations of num_turns turns, each a new message of ~64 tokens
// answered in ~64, its prompt resending the whole history; requests are
// ordered turn by turn (all first turns, then all second turns, ...).
// InvalidArgument for an unknown name, a bad count, or when the last
// arrival would come after kMaxArrivalSeconds (too low a --request-rate).
std::vector<TraceRequest> make_workload(const WorkloadOptions& options);

// The prompt's token ids (prompt_len of them) with ids in [first_id,
// first_id + id_span): the request's system prompt, if any, then tokens
// unique to `index` (the request's position in the trace). Not for
// multi-turn turns after the first (their history is the served output):
// see MultiTurnPrompts.
std::vector<std::int32_t> synthetic_prompt(const TraceRequest& r, std::size_t index,
                                           std::int32_t first_id, std::int32_t id_span);

// Builds multi-turn prompts from what the model answered: the previous
// turn's prompt and output, then a new message unique to `index`.
class MultiTurnPrompts {
 public:
  // Returns the prompt of trace[index]; for turn > 0 the previous turn of its
  // conversation must have been recorded with record_output.
  std::vector<std::int32_t> prompt(const TraceRequest& r, std::size_t index, std::int32_t first_id,
                                   std::int32_t id_span);
  void record_output(const TraceRequest& r, std::span<const std::int32_t> output);

 private:
  std::vector<std::vector<std::int32_t>> history_;  // per conversation
};

// One JSON object per line: {"prompt_len": P, "output_len": O, "n": N,
// "arrival": T} (n and arrival optional, other keys ignored). P, O, N are
// integers (P, O >= 1, 1 <= N <= 256); T is seconds in [0, kMaxArrivalSeconds].
// InvalidArgument naming the line, the field and its value. Sorted by arrival.
std::vector<TraceRequest> load_trace(const std::string& path);

}  // namespace pagedattn::tools
