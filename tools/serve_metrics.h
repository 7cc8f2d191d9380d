// What bench-serve measures: per-request timings, a sample of the engine
// after every step, and the summary figures computed from them.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "engine/step_profile.h"

namespace pagedattn::tools {

struct RequestTiming {
  double arrival = 0.0;       // seconds since the start
  double first_token = -1.0;  // first token of any sample
  double finish = -1.0;
  std::int64_t output_tokens = 0;   // over all samples
  std::int32_t longest_sample = 0;  // tokens of the longest sample
};

struct StepSample {
  double time = 0.0;  // end of the step, seconds since the start
  std::int32_t running_seqs = 0;
  std::int32_t batch_tokens = 0;
  std::int64_t pages_in_use = 0;
  std::int64_t token_states_stored = 0;
  std::int64_t pages_if_unshared = 0;
  std::int64_t output_tokens = 0;  // produced so far
  double step_s = 0.0;             // wall time of Engine::step alone (no arrivals, no sleeps)
  std::int32_t decodes = 0;        // of batch_tokens, decode tokens (one per running sample)
  engine::StepProfile profile;     // the step's phases (in-process runs)
};

struct ServeSummary {
  double duration_s = 0.0;
  std::int32_t completed = 0;
  std::int64_t output_tokens = 0;
  double requests_per_s = 0.0, output_tokens_per_s = 0.0;
  double ttft_p50 = 0.0, ttft_p99 = 0.0;  // seconds
  double tpot_p50 = 0.0, tpot_p99 = 0.0;  // seconds per output token after the first
  std::int32_t peak_batch = 0;            // running sequences
  std::int64_t preemptions = 0;
  std::int64_t peak_pages = 0, num_pages = 0;
  std::int32_t page_size = 0;
  double kv_efficiency = 0.0;   // token states stored / KV reserved, over the steps
  double sharing_saving = 0.0;  // 1 - pages in use / pages without sharing, over the steps
  double overhead_share = 0.0;  // step time outside Model::forward / step time
  std::int64_t steps = 0;
  // Prefix caching and preemption (in-process runs).
  bool prefix_caching = false;
  std::int64_t prompt_tokens = 0;         // over the trace
  std::int64_t history_tokens = 0;        // multi-turn: of which resent history
  std::int64_t shared_prefix_tokens = 0;  // shared-prefix: of which system prompts
  std::int64_t prefix_hit_tokens = 0;     // prompt tokens found cached, not computed
  std::int64_t cached_pages = 0;          // at the end
  std::int64_t prefix_evictions = 0;
  std::int64_t swap_outs = 0, swap_ins = 0;
  std::int64_t recomputed_tokens = 0;  // dropped by recompute preemptions
  std::int64_t swapped_tokens = 0;     // kept by swapping to the host tier
};

// What a client of a server sees beyond the timings (bench-serve --url).
struct ClientTally {
  std::int32_t failed = 0;
  std::vector<std::pair<std::string, std::int32_t>> failures;  // message, count
  std::int32_t short_outputs = 0;        // completed with fewer tokens than requested
  std::int32_t counted_from_chunks = 0;  // completed without "usage": one token per chunk
};

// Percentile p in [0, 100] by linear interpolation; 0 for no values.
double percentile(std::vector<double> values, double p);

// The per-request figures (completed requests: finish >= 0) over a run of
// `duration_s` seconds; the step figures stay zero.
ServeSummary summarize_requests(const std::vector<RequestTiming>& requests, double duration_s);

// The per-request figures over the steps' duration, and the step figures.
ServeSummary summarize(const std::vector<RequestTiming>& requests,
                       const std::vector<StepSample>& steps, std::int32_t page_size);

}  // namespace pagedattn::tools
