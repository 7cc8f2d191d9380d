#include "server_metrics.h"

#include <algorithm>
#include <cstdio>

namespace pagedattn::serve {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::seconds kRateWindow{10};

std::string num(double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", x);
  return buf;
}

void line(std::string& out, const std::string& name, const std::string& type,
          const std::string& help, double value) {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  out += name + " " + num(value) + "\n";
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::observe(double x) {
  const auto bucket = std::lower_bound(bounds_.begin(), bounds_.end(), x) - bounds_.begin();
  ++counts_[std::size_t(bucket)];
  sum_ += x;
  ++count_;
}

void Histogram::render(std::string& out, const std::string& name, const std::string& help) const {
  out += "# HELP " + name + " " + help + "\n# TYPE " + name + " histogram\n";
  std::int64_t cumulative = 0;
  for (std::size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    out += name + "_bucket{le=\"" + num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  out += name + "_sum " + num(sum_) + "\n" + name + "_count " + std::to_string(count_) + "\n";
}

ServerMetrics::ServerMetrics()
    : ttft_({0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}),
      tpot_({0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5}),
      e2e_({0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300}) {}

void ServerMetrics::count_response(int status) {
  const std::lock_guard lock(mutex_);
  ++responses_[status];
}

void ServerMetrics::count_client_abort() {
  const std::lock_guard lock(mutex_);
  ++client_aborts_;
}

void ServerMetrics::observe_request(double ttft, double tpot, double e2e,
                                    std::int64_t prompt_tokens, std::int64_t generated_tokens) {
  const std::lock_guard lock(mutex_);
  if (generated_tokens > 0) ttft_.observe(ttft);
  if (generated_tokens > 1) tpot_.observe(tpot);
  e2e_.observe(e2e);
  prompt_tokens_ += prompt_tokens;
  ++requests_finished_;
}

void ServerMetrics::count_generated(std::int64_t tokens) {
  const std::lock_guard lock(mutex_);
  generated_tokens_ += tokens;
  recent_.emplace_back(Clock::now(), tokens);
}

void ServerMetrics::add_http_seconds(double seconds) {
  const std::lock_guard lock(mutex_);
  http_seconds_ += seconds;
}

double ServerMetrics::tokens_per_second_locked() const {
  const auto now = Clock::now();
  while (!recent_.empty() && now - recent_.front().first > kRateWindow) recent_.pop_front();
  std::int64_t tokens = 0;
  for (const auto& [when, n] : recent_) tokens += n;
  return double(tokens) / std::chrono::duration<double>(kRateWindow).count();
}

double ServerMetrics::overhead_ratio(const EngineStats& engine,
                                     const EngineThreadTimes& thread) const {
  const std::lock_guard lock(mutex_);
  if (engine.seconds_in_steps <= 0.0) return 0.0;
  const double loop =
      thread.in_step - engine.seconds_in_steps;  // callbacks + step bookkeeping outside the lock
  return (std::max(0.0, loop) + http_seconds_) / engine.seconds_in_steps;
}

std::string ServerMetrics::render(const EngineStats& e, const EngineThreadTimes& t,
                                  std::int64_t in_flight) const {
  const double overhead = overhead_ratio(e, t);
  const std::lock_guard lock(mutex_);
  std::string out;
  line(out, "pagedattn_requests_in_flight", "gauge", "Requests accepted and not finished.",
       double(in_flight));
  line(out, "pagedattn_running_sequences", "gauge", "Sequences (samples) the engine is running.",
       e.num_running_seqs);
  line(out, "pagedattn_waiting_requests", "gauge",
       "Requests queued in the engine, not yet running.", e.num_waiting_requests);
  line(out, "pagedattn_kv_pages_total", "gauge", "KV cache pages in the pool.",
       double(e.num_pages));
  line(out, "pagedattn_kv_pages_used", "gauge", "KV cache pages holding tokens.",
       double(e.pages_in_use));
  line(out, "pagedattn_kv_pages_free", "gauge", "KV cache pages free.",
       double(e.num_pages - e.pages_in_use));
  line(out, "pagedattn_preemptions_total", "counter", "Requests preempted (by swap or recompute).",
       double(e.num_preemptions));
  line(out, "pagedattn_swap_outs_total", "counter",
       "Requests preempted by swapping their pages to the host tier.", double(e.num_swap_outs));
  line(out, "pagedattn_swap_ins_total", "counter", "Requests swapped back in from the host tier.",
       double(e.num_swap_ins));
  line(out, "pagedattn_swapped_requests", "gauge", "Requests whose pages are in the host tier now.",
       e.num_swapped_requests);
  line(out, "pagedattn_host_kv_pages_free", "gauge", "Host-tier pages free.",
       double(e.free_host_pages));
  line(out, "pagedattn_prefix_cache_queries_total", "counter",
       "Prompt tokens looked up in the prefix cache.", double(e.prefix_query_tokens));
  line(out, "pagedattn_prefix_cache_hits_total", "counter", "Of which found cached (not computed).",
       double(e.prefix_hit_tokens));
  line(out, "pagedattn_prefix_cache_hit_rate", "gauge",
       "Prefix-cache hit tokens / looked-up tokens, in total.", e.prefix_hit_rate());
  line(out, "pagedattn_prefix_cache_pages", "gauge", "KV pages holding cached prefixes.",
       double(e.cached_pages));
  line(out, "pagedattn_prefix_cache_evictions_total", "counter",
       "Cached pages reclaimed for new tokens.", double(e.prefix_evictions));
  line(out, "pagedattn_engine_steps_total", "counter", "Engine steps run.", double(e.steps));
  line(out, "pagedattn_prompt_tokens_total", "counter", "Prompt tokens of finished requests.",
       double(prompt_tokens_));
  line(out, "pagedattn_generation_tokens_total", "counter", "Tokens generated.",
       double(generated_tokens_));
  line(out, "pagedattn_generation_tokens_per_second", "gauge",
       "Tokens generated per second over the last 10 s.", tokens_per_second_locked());
  line(out, "pagedattn_requests_finished_total", "counter", "Requests finished (any reason).",
       double(requests_finished_));
  line(out, "pagedattn_client_aborts_total", "counter",
       "Requests aborted because the client went away.", double(client_aborts_));
  out +=
      "# HELP pagedattn_http_responses_total HTTP responses by status.\n"
      "# TYPE pagedattn_http_responses_total counter\n";
  for (const auto& [status, n] : responses_)
    out += "pagedattn_http_responses_total{status=\"" + std::to_string(status) + "\"} " +
           std::to_string(n) + "\n";
  ttft_.render(out, "pagedattn_time_to_first_token_seconds",
               "Time from request to its first token.");
  tpot_.render(out, "pagedattn_time_per_output_token_seconds",
               "Mean time between a request's tokens after the first.");
  e2e_.render(out, "pagedattn_request_latency_seconds", "Time from request to finish.");
  line(out, "pagedattn_engine_step_seconds_total", "counter",
       "Engine time inside step() (the engine lock held).", e.seconds_in_steps);
  line(out, "pagedattn_engine_model_seconds_total", "counter", "Of which in the model's forward.",
       e.seconds_in_model);
  line(out, "pagedattn_engine_thread_step_seconds_total", "counter",
       "Engine thread time in step() calls, stream callbacks included.", t.in_step);
  line(out, "pagedattn_engine_thread_callback_seconds_total", "counter",
       "Engine thread time in the server's stream callback.", t.in_callbacks);
  line(out, "pagedattn_engine_thread_idle_seconds_total", "counter",
       "Engine thread time waiting for requests.", t.idle);
  line(out, "pagedattn_http_handler_seconds_total", "counter",
       "HTTP threads' work: parsing, tokenizing, decoding and writing JSON (waits excluded).",
       http_seconds_);
  line(out, "pagedattn_server_overhead_ratio", "gauge",
       "(Engine-thread time outside the engine lock + HTTP handler work) / engine step time.",
       overhead);
  return out;
}

}  // namespace pagedattn::serve
