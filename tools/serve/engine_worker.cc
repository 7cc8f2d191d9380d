#include "engine_worker.h"

#include <algorithm>
#include <cstdio>
#include <utility>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

using Clock = std::chrono::steady_clock;

// How often an idle engine thread looks for pages from the prefill ranks.
constexpr auto kRemotePollInterval = std::chrono::microseconds(500);

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

EngineWorker::EngineWorker(EngineConfig config, std::int32_t max_requests, ServerMetrics& metrics,
                           std::unique_ptr<RemotePrefill> remote)
    : engine_(std::move(config)),
      metrics_(metrics),
      max_requests_(max_requests),
      remote_(std::move(remote)) {
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
  RequestId id = -1, engine_id = -1;
  if (remote_ == nullptr) {
    id = engine_id = engine_.add_request(prompt, params);
  } else if (!remote_failed_ && remote_->takes(params)) {
    id = next_key_++;
    to_remote_.push_back({id, {prompt.begin(), prompt.end()}, params});
  } else {
    engine_id = engine_.add_request(prompt, params);
    id = next_key_++;
    key_of_[engine_id] = id;
  }
  Held& h = held_[id];
  h.engine_id = engine_id;
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
    const RequestId engine_id = it->second.engine_id;
    finish_locked(id, it->second);
    held_.erase(it);
    count_held_locked();
    if (engine_id < 0) {
      remote_cancels_.push_back(id);  // the engine thread tells the RemotePrefill
      work_cv_.notify_one();
    } else {
      key_of_.erase(engine_id);
      try {
        engine_.abort(engine_id);
      } catch (const InvalidArgument&) {
        // It finished in the step whose callback waits for mutex_: no pages left.
      }
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
    if (remote_has_work_locked()) exchange_with_remote(lock);
    if (!engine_.has_unfinished()) {
      const std::uint64_t seen = submissions_;
      const std::size_t cancels = remote_cancels_.size();
      const auto start = Clock::now();
      auto woken = [&] {
        return stop_ || submissions_ != seen || remote_cancels_.size() != cancels;
      };
      // Prompts with the RemotePrefill: look for their pages again soon.
      if (remote_has_work_locked())
        work_cv_.wait_for(lock, kRemotePollInterval, woken);
      else
        work_cv_.wait(lock, woken);
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
  if (remote_ != nullptr) close_remote(lock);
}

// Hands the queued submissions and cancellations to the RemotePrefill and
// imports what it has prefilled. A failure (MPI's) fails every held request.
void EngineWorker::exchange_with_remote(std::unique_lock<std::mutex>& lock) {
  std::vector<RemoteJob> jobs = std::exchange(to_remote_, {});
  std::vector<RequestId> cancels = std::exchange(remote_cancels_, {});
  lock.unlock();
  std::vector<RemotePrefill::Arrival> arrivals;
  std::string failure;
  try {
    for (const RemoteJob& job : jobs) {
      try {
        remote_->submit(job.key, job.prompt, job.params);
      } catch (const InvalidArgument& e) {  // this request only
        arrivals.push_back({.key = job.key, .first_tokens = {}, .finish = {}, .error = e.what()});
      }
    }
    for (const RequestId key : cancels) remote_->cancel(key);
    for (RemotePrefill::Arrival& a : remote_->poll(engine_)) arrivals.push_back(std::move(a));
  } catch (const std::exception& e) {
    failure = e.what();
  }
  if (!failure.empty()) {
    fail_all("prefill ranks: " + failure);
    lock.lock();
    remote_failed_ = true;  // its state is unknown: ask it nothing more
    return;
  }
  lock.lock();
  deliver_arrivals_locked(arrivals);
}

void EngineWorker::deliver_arrivals_locked(std::vector<RemotePrefill::Arrival>& arrivals) {
  const auto now = Clock::now();
  for (RemotePrefill::Arrival& a : arrivals) {
    const auto it = held_.find(a.key);
    if (it == held_.end()) {  // aborted while its pages came: drop it
      const bool running = std::any_of(a.finish.begin(), a.finish.end(),
                                       [](FinishReason f) { return f == FinishReason::kNone; });
      if (a.request_id >= 0 && running) engine_.abort(a.request_id);
      continue;
    }
    Held& h = it->second;
    RequestOutput out;
    out.request_id = a.key;
    if (a.request_id < 0) {
      out.error = a.error;
      for (std::size_t i = 0; i < h.per_sample.size(); ++i)
        out.samples.push_back({std::int32_t(i), {}, FinishReason::kError});
      out.finished = true;
    } else {
      h.engine_id = a.request_id;
      out.finished = true;
      for (std::size_t i = 0; i < a.first_tokens.size(); ++i) {
        out.samples.push_back({std::int32_t(i), {a.first_tokens[i]}, a.finish.at(i)});
        out.finished &= a.finish[i] != FinishReason::kNone;
      }
      if (!out.finished) key_of_[a.request_id] = a.key;
    }
    step_tokens_ += deliver_locked(a.key, out, now);
  }
  if (!arrivals.empty()) empty_cv_.notify_all();
}

// The engine thread's last act: the RemotePrefill forgets what is left and
// releases the prefill side.
void EngineWorker::close_remote(std::unique_lock<std::mutex>& lock) {
  if (remote_failed_) return;
  lock.unlock();
  try {
    remote_->close();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "pagedattn serve: closing the prefill ranks failed: %s\n", e.what());
  }
  lock.lock();
}

// Engine thread, after the step released the engine.
void EngineWorker::on_output(const RequestOutput& out) {
  const auto start = Clock::now();
  {
    const std::lock_guard lock(mutex_);
    RequestId key = out.request_id;
    if (remote_ != nullptr) {
      const auto it = key_of_.find(out.request_id);
      key = it == key_of_.end() ? -1 : it->second;  // -1: aborted, no longer held
      if (out.finished && it != key_of_.end()) key_of_.erase(it);
    }
    step_tokens_ += deliver_locked(key, out, start);
    times_.in_callbacks += seconds(Clock::now() - start);
  }
  if (out.finished) empty_cv_.notify_all();
}

std::int64_t EngineWorker::deliver_locked(RequestId key, const RequestOutput& out,
                                          Clock::time_point now) {
  const auto it = held_.find(key);
  if (it == held_.end()) return 0;
  Held& h = it->second;
  std::int64_t tokens = 0;
  for (const SampleOutput& s : out.samples) {
    tokens += std::ssize(s.new_token_ids);
    if (s.index >= 0 && std::size_t(s.index) < h.per_sample.size())
      h.per_sample[std::size_t(s.index)] += std::ssize(s.new_token_ids);
  }
  if (tokens > 0) {
    if (h.generated == 0) h.first_token = now;
    h.last_token = now;
    h.generated += tokens;
  }
  h.channel->push(out);
  if (out.finished) {
    finish_locked(key, h);
    held_.erase(it);
    count_held_locked();
  }
  return tokens;
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
        if (h.engine_id >= 0)
          engine_.abort(h.engine_id);
        else
          remote_cancels_.push_back(id);
      } catch (const std::exception&) {
        // Finished inside the failed step: nothing to free.
      }
    }
    held_.clear();
    key_of_.clear();
    count_held_locked();
  }
  for (auto& [channel, n] : failed)
    channel->close(FinishReason::kAborted, n, "engine step failed: " + message);
  empty_cv_.notify_all();
}

}  // namespace pagedattn::serve
