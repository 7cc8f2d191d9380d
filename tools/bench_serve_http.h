// bench-serve --url: the workload streamed to an OpenAI-compatible server over
// HTTP, timed at the client.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "bench_serve_options.h"
#include "bench_serve_url.h"
#include "serve_metrics.h"
#include "workload.h"

namespace pagedattn::tools {

struct HttpRequestResult {
  RequestTiming timing;         // finish < 0: the request failed
  std::string error;            // why it failed; empty when it completed
  bool usage_reported = false;  // output tokens from the stream's "usage", else counted per chunk
};

// The body of request `index` of the trace: /v1/completions with stream,
// stream_options.include_usage, max_tokens = output_len, ignore_eos, greedy
// (temperature 0) unless n > 1, and a prompt of prompt_len token ids (or, with
// text_prompts, prompt_len words).
nlohmann::json completion_body(const TraceRequest& r, std::size_t index, const std::string& model,
                               bool text_prompts);

// The model the requests name: --model-name, else the first id of GET
// /v1/models. InvalidArgument naming the URL when the server cannot be
// reached, or answers the listing with an error and no --model-name was given.
std::string resolve_model_name(const ServerUrl& url, const BenchServeOptions& o);

// Sends every request at its arrival (at most o.concurrency in flight, one
// connection each); returns per-request results, times relative to the start.
std::vector<HttpRequestResult> run_over_http(const ServerUrl& url, const BenchServeOptions& o,
                                             const std::string& model,
                                             const std::vector<TraceRequest>& trace);

// `pagedattn bench-serve --url ...` after option parsing. Returns the exit code.
int run_bench_serve_http(const BenchServeOptions& o, const std::vector<TraceRequest>& trace);

}  // namespace pagedattn::tools
