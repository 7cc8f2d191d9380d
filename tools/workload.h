// Request traces for bench-serve: built-in synthetic workloads and JSONL
// trace files.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace pagedattn::tools {

struct TraceRequest {
  std::int32_t prompt_len = 1;
  std::int32_t output_len = 1;
  std::int32_t n = 1;    // parallel samples
  double arrival = 0.0;  // seconds after the start
};

// bench-serve runs on the wall clock: a request arriving later than this is a
// mistake (a rate of 1e-300 req/s, a trace in microseconds), not a benchmark.
inline constexpr double kMaxArrivalSeconds = 86400.0;
inline constexpr std::int32_t kMaxSamplesPerRequest = 256;

struct WorkloadOptions {
  std::string name =
      "sharegpt-like";  // sharegpt-like | alpaca-like | parallel-sampling | long-context
  std::int32_t num_requests = 300;
  double request_rate = 0.0;    // requests/s of Poisson arrivals; 0 = all at once
  double length_scale = 1.0;    // multiplies every prompt and output length
  std::int32_t max_len = 2048;  // prompt + output cap per request
  std::uint64_t seed = 1;
};

// Lognormal lengths (ShareGPT-like: means ~160 prompt / ~340 output tokens;
// Alpaca-like: ~20 / ~60; long-context: ~1500 / ~100), some requests with
// n = 2..4 samples (all of them for parallel-sampling). InvalidArgument for
// an unknown name, or when the last arrival would come after
// kMaxArrivalSeconds (too low a --request-rate).
std::vector<TraceRequest> make_workload(const WorkloadOptions& options);

// One JSON object per line: {"prompt_len": P, "output_len": O, "n": N,
// "arrival": T} (n and arrival optional, other keys ignored). P, O, N are
// integers (P, O >= 1, 1 <= N <= 256); T is seconds in [0, kMaxArrivalSeconds].
// InvalidArgument naming the line, the field and its value. Sorted by arrival.
std::vector<TraceRequest> load_trace(const std::string& path);

}  // namespace pagedattn::tools
