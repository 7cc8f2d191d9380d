// Request sets for engine tests: a deterministic token stream, jobs
// (prompt + sampling parameters), and a driver that runs them through one
// engine and gathers every sample's tokens.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::test {

using Tokens = std::vector<std::int32_t>;

// `len` tokens below `vocab`, different for each `seed`.
inline Tokens token_stream(std::int32_t len, std::int32_t seed, std::int32_t vocab = 300) {
  Tokens t(static_cast<std::size_t>(len));
  for (std::int32_t i = 0; i < len; ++i) t[std::size_t(i)] = (i * 37 + seed * 101 + 11) % vocab;
  return t;
}

struct Job {
  Tokens prompt;
  SamplingParams params;
};

// Tokens per (job index, sample index).
using JobOutputs = std::map<std::pair<std::size_t, std::int32_t>, Tokens>;

// Queues every job at once and steps until all have finished.
inline JobOutputs run_jobs(Engine& engine, const std::vector<Job>& jobs) {
  std::map<RequestId, std::size_t> job_of;
  for (std::size_t j = 0; j < jobs.size(); ++j)
    job_of[engine.add_request(jobs[j].prompt, jobs[j].params)] = j;
  JobOutputs out;
  while (engine.has_unfinished())
    for (const RequestOutput& r : engine.step())
      for (const SampleOutput& s : r.samples) {
        Tokens& t = out[{job_of.at(r.request_id), s.index}];
        t.insert(t.end(), s.new_token_ids.begin(), s.new_token_ids.end());
      }
  return out;
}

}  // namespace pagedattn::test
