#include "workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <random>
#include <cstdlib>
#include <limits>

#include "pagedattn/errors.h"

namespace pagedattn::tools {
namespace {

struct LengthModel {
  double prompt_mean, output_mean, sigma;
  double parallel_share;  // fraction of requests with n = 2..4
};

LengthModel length_model(const std::string& name) {
  if (name == "sharegpt-like") return {160, 340, 0.9, 0.15};
  if (name == "alpaca-like") return {20, 60, 0.6, 0.15};
  if (name == "parallel-sampling") return {160, 340, 0.9, 1.0};
  if (name == "long-context") return {1500, 100, 0.4, 0.0};
  throw InvalidArgument("bench-serve: --workload '" + name +
                        "' is not one of sharegpt-like, alpaca-like, parallel-sampling, "
                        "long-context (or give a .jsonl trace file)");
}

// Lognormal with the given mean: mu = ln(mean) - sigma^2 / 2.
std::int32_t lognormal_length(std::mt19937_64& rng, double mean, double sigma, double scale) {
  std::lognormal_distribution<double> d(std::log(mean) - sigma * sigma / 2, sigma);
  return std::max(1, static_cast<std::int32_t>(std::lround(d(rng) * scale)));
}

}  // namespace

std::vector<TraceRequest> make_workload(const WorkloadOptions& o) {
  const LengthModel m = length_model(o.name);
  require(o.num_requests >= 1, "bench-serve: --num-requests = ", o.num_requests, " must be >= 1");
  require(o.request_rate >= 0.0, "bench-serve: --request-rate = ", o.request_rate, " must be >= 0");
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  std::vector<TraceRequest> trace;
  double t = 0.0;
  for (std::int32_t i = 0; i < o.num_requests; ++i) {
    TraceRequest r;
    r.prompt_len = std::min(lognormal_length(rng, m.prompt_mean, m.sigma, o.length_scale), o.max_len - 1);
    r.output_len = std::min(lognormal_length(rng, m.output_mean, m.sigma, o.length_scale),
                            o.max_len - r.prompt_len);
    r.n = unit(rng) < m.parallel_share ? 2 + static_cast<std::int32_t>(unit(rng) * 3) : 1;
    if (o.request_rate > 0) t += gap(rng);
    r.arrival = t;
    trace.push_back(r);
  }
  return trace;
}

std::vector<TraceRequest> load_trace(const std::string& path) {
  std::ifstream in(path);
  require(in.good(), "bench-serve: cannot open trace file '", path, "'");
  // The number after "key" - the fallback when the key is absent, NaN when the
  // value is not a number (the check below reports it).
  auto field = [](const std::string& line, const char* key, double fallback) {
    const std::size_t at = line.find(std::string("\"") + key + "\"");
    if (at == std::string::npos) return fallback;
    const std::size_t colon =
        line.find_first_not_of(" \t", at + std::char_traits<char>::length(key) + 2);
    if (colon == std::string::npos || line[colon] != ':') return std::numeric_limits<double>::quiet_NaN();
    const char* begin = line.c_str() + colon + 1;
    char* end = nullptr;
    const double value = std::strtod(begin, &end);
    return end == begin ? std::numeric_limits<double>::quiet_NaN() : value;
  };
  std::vector<TraceRequest> trace;
  std::string line;
  for (std::int64_t number = 1; std::getline(in, line); ++number) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    TraceRequest r;
    const double prompt = field(line, "prompt_len", -1), output = field(line, "output_len", -1);
    const double n = field(line, "n", 1), arrival = field(line, "arrival", 0);
    require(prompt >= 1 && output >= 1 && n >= 1 && n <= 256 && arrival >= 0, "bench-serve: ",
            path, " line ", number, ": needs prompt_len >= 1, output_len >= 1, 1 <= n <= 256, "
            "arrival >= 0; got '", line, "'");
    r.prompt_len = static_cast<std::int32_t>(prompt);
    r.output_len = static_cast<std::int32_t>(output);
    r.n = static_cast<std::int32_t>(n);
    r.arrival = arrival;
    trace.push_back(r);
  }
  require(!trace.empty(), "bench-serve: trace file '", path, "' has no requests");
  std::stable_sort(trace.begin(), trace.end(),
                   [](const TraceRequest& a, const TraceRequest& b) { return a.arrival < b.arrival; });
  return trace;
}

}  // namespace pagedattn::tools
