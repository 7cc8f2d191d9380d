#include "workload.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <optional>
#include <random>

#include <nlohmann/json.hpp>

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
  // The question after a shared system prompt; a multi-turn message.
  if (name == "shared-prefix") return {32, 64, 0.5, 0.0};
  if (name == "multi-turn") return {64, 64, 0.5, 0.0};
  throw InvalidArgument("bench-serve: --workload '" + name +
                        "' is not one of sharegpt-like, alpaca-like, parallel-sampling, "
                        "long-context, shared-prefix, multi-turn (or give a .jsonl trace file)");
}

// Lognormal with the given mean: mu = ln(mean) - sigma^2 / 2.
std::int32_t lognormal_length(std::mt19937_64& rng, double mean, double sigma, double scale) {
  std::lognormal_distribution<double> d(std::log(mean) - sigma * sigma / 2, sigma);
  return std::max(1, static_cast<std::int32_t>(std::lround(d(rng) * scale)));
}

}  // namespace

namespace {

void check_counts(const WorkloadOptions& o) {
  require(o.num_requests >= 1, "bench-serve: --num-requests = ", o.num_requests, " must be >= 1");
  require(o.request_rate >= 0.0, "bench-serve: --request-rate = ", o.request_rate, " must be >= 0");
  require(o.num_shared_prefixes >= 1, "bench-serve: --shared-prefixes = ", o.num_shared_prefixes,
          " must be >= 1");
  require(o.shared_prefix_len >= 1, "bench-serve: --shared-prefix-len = ", o.shared_prefix_len,
          " must be >= 1");
  require(o.num_turns >= 1, "bench-serve: --turns = ", o.num_turns, " must be >= 1");
}

// Multi-turn: `trace` holds conversations x turns independent draws, turn
// major; turn t of a conversation resends turns 0..t-1 (messages and
// answers) before its own message, and shares the first turn's arrival.
void link_turns(const WorkloadOptions& o, std::vector<TraceRequest>& trace) {
  const std::size_t conversations = trace.size() / std::size_t(o.num_turns);
  for (std::size_t i = 0; i < trace.size(); ++i) {
    TraceRequest& r = trace[i];
    r.conversation = static_cast<std::int32_t>(i % conversations);
    r.turn = static_cast<std::int32_t>(i / conversations);
    if (r.turn == 0) continue;
    const TraceRequest& prev = trace[i - conversations];
    r.history_len = prev.prompt_len + prev.output_len;
    r.prompt_len += r.history_len;
    r.arrival = prev.arrival;
    require(std::int64_t{r.prompt_len} + r.output_len <= o.max_len, "bench-serve: turn ", r.turn,
            " of a conversation reaches ", std::int64_t{r.prompt_len} + r.output_len,
            " tokens, over the limit of ", o.max_len, "; lower --turns");
  }
}

}  // namespace

std::vector<TraceRequest> make_workload(const WorkloadOptions& o) {
  const LengthModel m = length_model(o.name);
  check_counts(o);
  const bool multi_turn = o.name == "multi-turn";
  const bool shared = o.name == "shared-prefix";
  const std::int32_t count =
      multi_turn ? (o.num_requests + o.num_turns - 1) / o.num_turns * o.num_turns : o.num_requests;
  const std::int32_t arrivals = multi_turn ? count / o.num_turns : count;
  std::mt19937_64 rng(o.seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::exponential_distribution<double> gap(o.request_rate > 0 ? o.request_rate : 1.0);
  std::vector<TraceRequest> trace;
  double t = 0.0;
  for (std::int32_t i = 0; i < count; ++i) {
    TraceRequest r;
    if (shared) {
      r.shared_prefix = static_cast<std::int32_t>(unit(rng) * o.num_shared_prefixes);
      r.shared_prefix_len = std::min(o.shared_prefix_len, o.max_len - 2);
    }
    r.prompt_len = std::min(
        r.shared_prefix_len + lognormal_length(rng, m.prompt_mean, m.sigma, o.length_scale),
        o.max_len - 1);
    r.output_len = std::min(lognormal_length(rng, m.output_mean, m.sigma, o.length_scale),
                            o.max_len - r.prompt_len);
    r.n = unit(rng) < m.parallel_share ? 2 + static_cast<std::int32_t>(unit(rng) * 3) : 1;
    if (o.request_rate > 0 && i < arrivals) t += gap(rng);
    r.arrival = t;
    trace.push_back(r);
  }
  require(t <= kMaxArrivalSeconds, "bench-serve: --request-rate = ", o.request_rate,
          " puts the last of ", o.num_requests, " arrivals at ", t, " s, after the limit of ",
          kMaxArrivalSeconds, " s; raise the rate or lower --num-requests");
  if (multi_turn) link_turns(o, trace);
  return trace;
}

namespace {

// Token i of a stream of ids unique to `seed`, in [first_id, first_id + id_span).
std::int32_t stream_token(std::uint64_t seed, std::int32_t i, std::int32_t first_id,
                          std::int32_t id_span) {
  return first_id + static_cast<std::int32_t>((seed * 7919 + std::uint64_t(i) * 104729) %
                                              std::uint64_t(id_span));
}

// Streams of system prompts are kept apart from the requests' own streams.
constexpr std::uint64_t kSystemPromptSeed = 1u << 30;

}  // namespace

std::vector<std::int32_t> synthetic_prompt(const TraceRequest& r, std::size_t index,
                                           std::int32_t first_id, std::int32_t id_span) {
  std::vector<std::int32_t> t;
  t.reserve(std::size_t(r.prompt_len));
  const std::int32_t shared = r.shared_prefix >= 0 ? r.shared_prefix_len : 0;
  for (std::int32_t i = 0; i < shared; ++i)
    t.push_back(
        stream_token(kSystemPromptSeed + std::uint64_t(r.shared_prefix), i, first_id, id_span));
  for (std::int32_t i = shared; i < r.prompt_len; ++i)
    t.push_back(stream_token(index, i, first_id, id_span));
  return t;
}

std::vector<std::int32_t> MultiTurnPrompts::prompt(const TraceRequest& r, std::size_t index,
                                                   std::int32_t first_id, std::int32_t id_span) {
  if (r.conversation < 0) return synthetic_prompt(r, index, first_id, id_span);
  if (std::ssize(history_) <= r.conversation) history_.resize(std::size_t(r.conversation) + 1);
  std::vector<std::int32_t>& h = history_[std::size_t(r.conversation)];
  require(r.turn == 0 || !h.empty(), "MultiTurnPrompts: turn ", r.turn, " of conversation ",
          r.conversation, " before the previous turn's output");
  if (r.turn == 0) h.clear();
  const std::int32_t message = r.prompt_len - r.history_len;
  for (std::int32_t i = 0; i < message; ++i)
    h.push_back(stream_token(index, r.history_len + i, first_id, id_span));
  return h;
}

void MultiTurnPrompts::record_output(const TraceRequest& r, std::span<const std::int32_t> output) {
  if (r.conversation < 0) return;
  std::vector<std::int32_t>& h = history_[std::size_t(r.conversation)];
  h.insert(h.end(), output.begin(), output.end());
}

namespace {

// `key` of one trace line as an integer in [min, max], or `fallback` when absent.
std::int32_t integer_field(const nlohmann::json& line, const char* key, std::int32_t min,
                           std::int32_t max, std::optional<std::int32_t> fallback,
                           const std::string& where) {
  const auto it = line.find(key);
  if (it == line.end()) {
    require(fallback.has_value(), where, ": missing \"", key, "\"");
    return *fallback;
  }
  // JSON numbers arrive as integers or doubles; 3.0 is accepted, 3.5 and 3e9 are not.
  const bool integral =
      it->is_number_integer() ||
      (it->is_number_float() && std::floor(it->get<double>()) == it->get<double>());
  const double value = it->is_number() ? it->get<double>() : 0.0;
  require(integral && value >= min && value <= max, where, ": \"", key, "\" = ", it->dump(),
          " must be an integer in [", min, ", ", max, "]");
  return static_cast<std::int32_t>(value);
}

double arrival_field(const nlohmann::json& line, const std::string& where) {
  const auto it = line.find("arrival");
  if (it == line.end()) return 0.0;
  const double value = it->is_number() ? it->get<double>() : -1.0;
  require(it->is_number() && value >= 0.0 && value <= kMaxArrivalSeconds, where,
          ": \"arrival\" = ", it->dump(), " must be seconds in [0, ", kMaxArrivalSeconds, "]");
  return value;
}

}  // namespace

std::vector<TraceRequest> load_trace(const std::string& path) {
  std::ifstream in(path);
  require(in.good(), "bench-serve: cannot open trace file '", path, "'");
  constexpr std::int32_t kInt32Max = std::numeric_limits<std::int32_t>::max();
  std::vector<TraceRequest> trace;
  std::string text;
  for (std::int64_t number = 1; std::getline(in, text); ++number) {
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string where = detail::concat("bench-serve: ", path, " line ", number);
    nlohmann::json line;
    try {
      line = nlohmann::json::parse(text);
    } catch (const nlohmann::json::parse_error& e) {
      throw InvalidArgument(
          detail::concat(where, ": not valid JSON (", e.what(), "): '", text, "'"));
    }
    require(line.is_object(), where, ": expected a JSON object, got '", text, "'");
    TraceRequest r;
    r.prompt_len = integer_field(line, "prompt_len", 1, kInt32Max, std::nullopt, where);
    r.output_len = integer_field(line, "output_len", 1, kInt32Max, std::nullopt, where);
    r.n = integer_field(line, "n", 1, kMaxSamplesPerRequest, 1, where);
    r.arrival = arrival_field(line, where);
    trace.push_back(r);
  }
  require(!trace.empty(), "bench-serve: trace file '", path, "' has no requests");
  std::stable_sort(trace.begin(), trace.end(), [](const TraceRequest& a, const TraceRequest& b) {
    return a.arrival < b.arrival;
  });
  return trace;
}

}  // namespace pagedattn::tools
