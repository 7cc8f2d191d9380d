#include "engine_worker.h"

#include <algorithm>
#include <cstdio>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

using Clock = std::chrono::steady_clock;

double seconds(Clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

}  // namespace

void RequestChannel::push(const RequestOutput& out) {
  {
    const std::lock_guard lock(mutex_);
    if (closed_) return;
    pending_.samples.insert(pending_.samples.end(), out.samples.begin(), out.samples.end());
    if (!out.prompt_logprobs.empty()) pending_.prompt_logprobs = out.prompt_logprobs;
    if (!out.error.empty()) pending_.error = out.error;  // FinishReason::kError
    if (out.finished) pending_.finished = closed_ = true;
  }
  cv_.notify_one();  // one reader: the request's HTTP thread
}

void RequestChannel::close(FinishReason reason, std::int32_t n, std::string error) {
  {
    const std::lock_guard lock(mutex_);
    if (closed_) return;
    for (std::int32_t i = 0; i < n; ++i) {
      SampleOutput& out = pending_.samples.emplace_back();
      out.index = i;
      out.finish_reason = reason;
    }
    pending_.finished = closed_ = true;
    pending_.error = std::move(error);
  }
  cv_.notify_one();
}

RequestChannel::News RequestChannel::wait(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mutex_);
  cv_.wait_for(lock, timeout, [&] { return !pending_.samples.empty() || pending_.finished; });
  News news = std::move(pending_);
  pending_ = News{};
  pending_.finished = news.finished;  // a finished channel stays finished
  return news;
}

EngineWorker::EngineWorker(EngineConfig config, std::int32_t max_requests, ServerMetrics& metrics)
    : engine_(std::move(config)), metrics_(metrics), max_requests_(max_requests) {
  engine_.set_stream_callback([this](const RequestOutput& out) { on_output(out); });
  publish_snapshot(engine_.stats(), times_);  // no step runs yet: the engine lock is free
  thread_ = std::thread([this] { run(); });
}

EngineWorker::~EngineWorker() {
  stop_accepting();
  drain(std::chrono::milliseconds(0));
  {
    const std::lock_guard lock(mutex_);
    stop_ = true;
  }
  work_cv_.notify_all();
  thread_.join();
}

EngineWorker::Ticket EngineWorker::submit(std::span<const std::int32_t> prompt,
                                          const SamplingParams& params) {
  const std::lock_guard lock(mutex_);
  if (!accepting_) throw ApiError(503, "the server is shutting down");
  if (std::ssize(held_) >= max_requests_)
    throw ApiError(429, "the server holds " + std::to_string(held_.size()) +
                            " requests, its limit (--max-queued-requests); retry later");
  // Under mutex_, so the stream callback cannot see the id before it is held.
  const RequestId id = engine_.add_request(prompt, params);
  Held& h = held_[id];
  h.channel = std::make_shared<RequestChannel>();
  h.submitted = Clock::now();
  h.prompt_tokens = std::ssize(prompt);
  h.per_sample.assign(std::size_t(params.n), 0);
  count_held_locked();
  ++submissions_;
  work_cv_.notify_one();
  return {id, h.channel};
}

void EngineWorker::abort(RequestId id) {
  std::shared_ptr<RequestChannel> channel;
  std::int32_t n = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto it = held_.find(id);
    if (it == held_.end()) return;  // finished already
    channel = it->second.channel;
    n = std::int32_t(it->second.per_sample.size());
    finish_locked(id, it->second);
    held_.erase(it);
    count_held_locked();
    try {
      engine_.abort(id);
    } catch (const InvalidArgument&) {
      // It finished in the step whose callback waits for mutex_: no pages left.
    }
  }
  channel->close(FinishReason::kAborted, n);
  empty_cv_.notify_all();
}

void EngineWorker::stop_accepting() {
  const std::lock_guard lock(mutex_);
  accepting_ = false;
}

void EngineWorker::drain(std::chrono::milliseconds timeout) {
  std::vector<RequestId> left;
  {
    std::unique_lock lock(mutex_);
    empty_cv_.wait_for(lock, timeout, [&] { return held_.empty(); });
    for (const auto& [id, h] : held_) left.push_back(id);
  }
  for (RequestId id : left) abort(id);
}

std::shared_ptr<const EngineWorker::Snapshot> EngineWorker::snapshot() const {
  const std::lock_guard lock(snapshot_mutex_);
  return snapshot_;
}

void EngineWorker::publish_snapshot(const EngineStats& engine, const EngineThreadTimes& thread) {
  auto next = std::make_shared<const Snapshot>(Snapshot{engine, thread});
  const std::lock_guard lock(snapshot_mutex_);
  snapshot_ = std::move(next);
}

void EngineWorker::run() {
  std::unique_lock lock(mutex_);
  while (!stop_) {
    if (!engine_.has_unfinished()) {
      const std::uint64_t seen = submissions_;
      const auto start = Clock::now();
      work_cv_.wait(lock, [&] { return stop_ || submissions_ != seen; });
      times_.idle += seconds(Clock::now() - start);
      continue;
    }
    lock.unlock();
    const auto start = Clock::now();
    std::string failure;
    try {
      engine_.step();
    } catch (const std::exception& e) {
      failure = e.what();
    }
    const double took = seconds(Clock::now() - start);
    if (!failure.empty()) fail_all(failure);
    // Between steps, on the only thread that steps: the engine lock is free.
    const EngineStats engine_stats = engine_.stats();
    lock.lock();
    times_.in_step += took;
    if (step_tokens_ > 0) metrics_.count_generated(step_tokens_);  // once per step, not per request
    step_tokens_ = 0;
    publish_snapshot(engine_stats, times_);
  }
}

// Engine thread, after the step released the engine.
void EngineWorker::on_output(const RequestOutput& out) {
  const auto start = Clock::now();
  std::int64_t tokens = 0;
  {
    const std::lock_guard lock(mutex_);
    const auto it = held_.find(out.request_id);
    if (it != held_.end()) {
      Held& h = it->second;
      for (const SampleOutput& s : out.samples) {
        tokens += std::ssize(s.new_token_ids);
        if (s.index >= 0 && std::size_t(s.index) < h.per_sample.size())
          h.per_sample[std::size_t(s.index)] += std::ssize(s.new_token_ids);
      }
      if (tokens > 0) {
        if (h.generated == 0) h.first_token = start;
        h.last_token = start;
        h.generated += tokens;
      }
      h.channel->push(out);
      if (out.finished) {
        finish_locked(out.request_id, h);
        held_.erase(it);
        count_held_locked();
      }
    }
    step_tokens_ += tokens;
    times_.in_callbacks += seconds(Clock::now() - start);
  }
  if (out.finished) empty_cv_.notify_all();
}

void EngineWorker::finish_locked(RequestId, Held& h) {
  const auto now = Clock::now();
  const std::int64_t longest =
      h.per_sample.empty() ? 0 : *std::max_element(h.per_sample.begin(), h.per_sample.end());
  const double tpot =
      longest > 1 ? seconds(h.last_token - h.first_token) / double(longest - 1) : 0.0;
  metrics_.observe_request(seconds(h.first_token - h.submitted), tpot, seconds(now - h.submitted),
                           h.prompt_tokens, h.generated);
}

// The step was cancelled (the model threw): every held request fails, so a
// model that keeps failing cannot spin the engine thread.
void EngineWorker::fail_all(const std::string& message) {
  std::fprintf(stderr, "pagedattn serve: engine step failed: %s\n", message.c_str());
  std::vector<std::pair<std::shared_ptr<RequestChannel>, std::int32_t>> failed;
  {
    const std::lock_guard lock(mutex_);
    for (auto& [id, h] : held_) {
      failed.emplace_back(h.channel, std::int32_t(h.per_sample.size()));
      finish_locked(id, h);
      try {
        engine_.abort(id);
      } catch (const std::exception&) {
        // Finished inside the failed step: nothing to free.
      }
    }
    held_.clear();
    count_held_locked();
  }
  for (auto& [channel, n] : failed)
    channel->close(FinishReason::kAborted, n, "engine step failed: " + message);
  empty_cv_.notify_all();
}

}  // namespace pagedattn::serve
