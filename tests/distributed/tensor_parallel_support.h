// Drivers shared by the tensor-parallel tests: one step on a model and
// cache, and an Engine run that collects every sample's tokens.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/model.h"

namespace pagedattn::dist {

// One step on a cache: begin, forward, end; returns the logits.
inline std::vector<float> run_step(Model& model, PagedKVCache& cache,
                                   const std::vector<SeqId>& seqs,
                                   const std::vector<std::int64_t>& lengths,
                                   const std::vector<std::int32_t>& tokens,
                                   const std::vector<std::int32_t>& logit_rows) {
  std::vector<float> logits(logit_rows.size() * std::size_t(model.spec().vocab_size));
  cache.begin_forward(seqs, lengths);
  model.forward({tokens, logit_rows, false}, cache, logits);
  cache.end_forward();
  return logits;
}

// `count` token ids below `vocab`, different for each salt.
inline std::vector<std::int32_t> tokens_of(std::int32_t count, std::int32_t salt,
                                           std::int32_t vocab = 1024) {
  std::vector<std::int32_t> t(static_cast<std::size_t>(count));
  for (std::int32_t i = 0; i < count; ++i) t[std::size_t(i)] = (i * 37 + salt * 101 + 3) % vocab;
  return t;
}

inline double max_abs(const std::vector<float>& v) {
  double m = 0.0;
  for (float x : v) m = std::max(m, std::abs(double(x)));
  return m;
}

inline double max_abs_difference(const std::vector<float>& a, const std::vector<float>& b) {
  double m = 0.0;
  for (std::size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    m = std::max(m, std::abs(double(a[i]) - double(b[i])));
  return m;
}

struct Request {
  std::int32_t prompt_len, max_tokens, n;
};

// Runs every request to the end; returns each sample's tokens by (request, sample).
inline std::map<std::pair<RequestId, std::int32_t>, std::vector<std::int32_t>> run_engine(
    Engine& engine, const std::vector<Request>& requests, std::int32_t vocab = 1024) {
  std::map<std::pair<RequestId, std::int32_t>, std::vector<std::int32_t>> out;
  for (std::size_t i = 0; i < requests.size(); ++i) {
    const Request& r = requests[i];
    engine.add_request(tokens_of(r.prompt_len, std::int32_t(i), vocab),
                       {.max_tokens = r.max_tokens, .n = r.n, .ignore_eos = true});
  }
  while (engine.has_unfinished())
    for (const RequestOutput& o : engine.step())
      for (const SampleOutput& s : o.samples) {
        auto& tokens = out[{o.request_id, s.index}];
        tokens.insert(tokens.end(), s.new_token_ids.begin(), s.new_token_ids.end());
      }
  return out;
}

}  // namespace pagedattn::dist
