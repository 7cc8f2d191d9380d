// The engine thread: it runs Engine::step() while there is work and sleeps on
// a condition variable otherwise. HTTP threads only submit requests and read
// each request's RequestChannel; the stream callback (on the engine thread)
// fills the channels. A request leaves the worker when it finishes or is
// aborted, and its pages go back to the pool.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagedattn/engine.h"
#include "server_metrics.h"

namespace pagedattn::serve {

// One request's outputs on their way from the engine thread to its HTTP thread.
class RequestChannel {
 public:
  struct News {
    std::vector<SampleOutput> samples;           // in the order the engine made them
    std::vector<TokenLogprobs> prompt_logprobs;  // RequestOutput::prompt_logprobs, once
    bool finished = false;                       // nothing more will come
    std::string error;                           // the engine failed this request
  };
  void push(const RequestOutput& out);
  void close(FinishReason reason, std::int32_t n, std::string error = "");
  // Waits up to `timeout` for news and takes it (empty News on timeout).
  News wait(std::chrono::milliseconds timeout);

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  News pending_;
  bool closed_ = false;
};

// Prompts prefilled by other processes (serve --disaggregate, disagg_serve.h:
// prefill ranks over MPI). The worker calls it on the engine thread only,
// between steps; `poll` imports what was prefilled into the engine.
class RemotePrefill {
 public:
  struct Arrival {
    std::int64_t key = 0;
    RequestId request_id = -1;               // the engine's request; -1: failed (error)
    std::vector<std::int32_t> first_tokens;  // [n]: each sample's, drawn by the prefill side
    std::vector<FinishReason> finish;        // [n]: kStop/kLength: done at its first token
    std::string error;
  };
  virtual ~RemotePrefill() = default;
  // Whether a request with `params` can be prefilled there; the engine
  // itself runs the others (logprobs: the logits stay where they are made).
  virtual bool takes(const SamplingParams& params) const = 0;
  virtual void submit(std::int64_t key, std::span<const std::int32_t> prompt,
                      const SamplingParams& params) = 0;
  // The request must not arrive (nothing if it has).
  virtual void cancel(std::int64_t key) = 0;
  virtual std::vector<Arrival> poll(Engine& engine) = 0;
  virtual bool busy() const = 0;  // requests submitted, not arrived nor cancelled
  // Cancels what is left and releases the prefill side (the worker's last call).
  virtual void close() = 0;
};

class EngineWorker {
 public:
  // `max_requests`: requests held at once (waiting + running); more get 429.
  // With `remote`, prompts it takes are prefilled there (RemotePrefill).
  EngineWorker(EngineConfig config, std::int32_t max_requests, ServerMetrics& metrics,
               std::unique_ptr<RemotePrefill> remote = nullptr);
  ~EngineWorker();  // aborts what is left and joins the engine thread
  EngineWorker(const EngineWorker&) = delete;
  EngineWorker& operator=(const EngineWorker&) = delete;

  struct Ticket {
    RequestId id = -1;  // the engine's id; with a RemotePrefill, the worker's own
    std::shared_ptr<RequestChannel> channel;
  };
  // ApiError 429 when max_requests are held, 503 once draining; the engine's
  // InvalidArgument passes through (the caller checked the request first).
  Ticket submit(std::span<const std::int32_t> prompt, const SamplingParams& params);
  // Stops a request (its channel closes with kAborted); nothing if it has finished.
  void abort(RequestId id);
  // Refuse new requests (503) from now on.
  void stop_accepting();
  // Waits until no request is held or `timeout` passes; then aborts the rest.
  void drain(std::chrono::milliseconds timeout);

  // What /metrics and /health read. The engine thread publishes a new one
  // after every step: a reader takes the last one and never waits for the
  // engine's lock, which a long prefill holds for seconds.
  struct Snapshot {
    EngineStats engine;
    EngineThreadTimes thread;
  };
  std::shared_ptr<const Snapshot> snapshot() const;
  EngineStats stats() const { return snapshot()->engine; }  // as of the last step
  EngineThreadTimes thread_times() const { return snapshot()->thread; }
  // Requests held; lock-free, as abort() holds mutex_ while it waits for a step.
  std::int64_t in_flight() const { return in_flight_.load(); }
  const Engine& engine() const { return engine_; }

 private:
  struct Held {
    std::shared_ptr<RequestChannel> channel;
    RequestId engine_id = -1;  // -1: still with the RemotePrefill
    std::chrono::steady_clock::time_point submitted, first_token, last_token;
    std::int64_t prompt_tokens = 0, generated = 0;
    std::vector<std::int64_t> per_sample;  // tokens per sample
  };
  void run();
  // One exchange with the RemotePrefill (lock held on entry and exit).
  void exchange_with_remote(std::unique_lock<std::mutex>& lock);
  void deliver_arrivals_locked(std::vector<RemotePrefill::Arrival>& arrivals);
  void close_remote(std::unique_lock<std::mutex>& lock);
  bool remote_has_work_locked() const {
    return remote_ != nullptr && !remote_failed_ &&
           (!to_remote_.empty() || !remote_cancels_.empty() || remote_->busy());
  }
  void on_output(const RequestOutput& out);
  // Hands `out` (whose request_id is the ticket's) to held request `key`;
  // returns the tokens it carried.
  std::int64_t deliver_locked(RequestId key, const RequestOutput& out,
                              std::chrono::steady_clock::time_point now);
  void finish_locked(RequestId id, Held& h);
  void fail_all(const std::string& message);
  void count_held_locked() { in_flight_ = std::ssize(held_); }
  void publish_snapshot(const EngineStats& engine, const EngineThreadTimes& thread);

  Engine engine_;
  ServerMetrics& metrics_;
  const std::int32_t max_requests_;
  mutable std::mutex mutex_;
  std::condition_variable work_cv_;   // the engine thread waits for requests
  std::condition_variable empty_cv_;  // drain waits for the last request
  std::unordered_map<RequestId, Held> held_;
  std::uint64_t submissions_ = 0;
  bool accepting_ = true;
  bool stop_ = false;
  EngineThreadTimes times_;
  std::int64_t step_tokens_ = 0;            // generated in the running step's callbacks
  std::atomic<std::int64_t> in_flight_{0};  // held_.size(), for readers that must not wait
  mutable std::mutex snapshot_mutex_;       // held only to swap or copy the pointer
  std::shared_ptr<const Snapshot> snapshot_;
  // serve --disaggregate: tickets carry the worker's keys; key_of_ maps
  // engine ids back. Submissions and aborts for the RemotePrefill wait here
  // for the engine thread (the only one that calls it).
  struct RemoteJob {
    RequestId key = -1;
    std::vector<std::int32_t> prompt;
    SamplingParams params;
  };
  std::unique_ptr<RemotePrefill> remote_;
  RequestId next_key_ = 0;
  std::unordered_map<RequestId, RequestId> key_of_;
  std::vector<RemoteJob> to_remote_;
  std::vector<RequestId> remote_cancels_;
  bool remote_failed_ = false;  // MPI failed: later requests are prefilled here
  std::thread thread_;
};

}  // namespace pagedattn::serve
