// The server's own counters, and GET /metrics in the Prometheus text format
// (with the engine's EngineStats beside them). Thread-safe.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "pagedattn/engine.h"

namespace pagedattn::serve {

// A cumulative Prometheus histogram over fixed bucket bounds (seconds).
class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double x);
  void render(std::string& out, const std::string& name, const std::string& help) const;

 private:
  std::vector<double> bounds_;
  std::vector<std::int64_t> counts_;  // per bucket, not cumulative; last: +Inf
  double sum_ = 0.0;
  std::int64_t count_ = 0;
};

// Where the engine thread's time went (seconds, in total).
struct EngineThreadTimes {
  double in_step = 0.0;       // inside Engine::step(), its stream callbacks included
  double in_callbacks = 0.0;  // of which in the server's stream callback
  double idle = 0.0;          // waiting for requests
};

class ServerMetrics {
 public:
  ServerMetrics();

  void count_response(int status);
  void count_client_abort();
  // A finished request: its timings and token counts.
  void observe_request(double ttft, double tpot, double e2e, std::int64_t prompt_tokens,
                       std::int64_t generated_tokens);
  void count_generated(std::int64_t tokens);  // as they stream, for tokens/s
  void add_http_seconds(double seconds);      // handler CPU work: parsing, tokenizing, JSON

  // `in_flight`: requests the server holds (waiting + running).
  std::string render(const EngineStats& engine, const EngineThreadTimes& thread,
                     std::int64_t in_flight) const;
  // The share of step time the server adds: (callbacks + HTTP work) / engine time.
  double overhead_ratio(const EngineStats& engine, const EngineThreadTimes& thread) const;

 private:
  double tokens_per_second_locked() const;

  mutable std::mutex mutex_;
  Histogram ttft_, tpot_, e2e_;
  std::map<int, std::int64_t> responses_;
  std::int64_t client_aborts_ = 0;
  std::int64_t prompt_tokens_ = 0, generated_tokens_ = 0, requests_finished_ = 0;
  double http_seconds_ = 0.0;
  // Generated tokens per second over the last kRateWindow.
  mutable std::deque<std::pair<std::chrono::steady_clock::time_point, std::int64_t>> recent_;
};

}  // namespace pagedattn::serve
