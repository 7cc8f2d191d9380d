#include "generation_job.h"

#include <algorithm>
#include <atomic>
#include <ctime>

#include <nlohmann/json.hpp>

#include "api_error.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;
using Clock = std::chrono::steady_clock;

// Generated text may hold invalid UTF-8 (a model can emit any bytes): it
// becomes U+FFFD rather than failing the response.
std::string dump(const json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

std::string next_id(Endpoint endpoint) {
  static std::atomic<std::uint64_t> counter{0};
  return (endpoint == Endpoint::kChat ? "chatcmpl-" : "cmpl-") + std::to_string(counter++);
}

const char* finish_name(FinishReason r) {
  switch (r) {
    case FinishReason::kLength:
      return "length";
    case FinishReason::kStop:
      return "stop";
    case FinishReason::kError:
      return "error";
    default:
      return "abort";
  }
}

double since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

}  // namespace

GenerationJob::GenerationJob(GenerationRequest request, EngineWorker::Ticket ticket,
                             const TextCodec& codec, std::string model_name, EngineWorker& worker,
                             ServerMetrics& metrics)
    : request_(std::move(request)),
      ticket_(std::move(ticket)),
      model_name_(std::move(model_name)),
      id_(next_id(request_.endpoint)),
      created_(std::int64_t(std::time(nullptr))),
      worker_(worker),
      metrics_(metrics) {
  for (std::int32_t id : codec.stop_token_ids()) hidden_tokens_.insert(id);
  for (std::int32_t id : request_.params.stop_token_ids) hidden_tokens_.insert(id);
  for (std::int32_t i = 0; i < request_.params.n; ++i)
    samples_.emplace_back(codec.decoder(), StopMatcher(request_.stop));
}

void GenerationJob::absorb_sample(const SampleOutput& out) {
  if (out.index < 0 || std::size_t(out.index) >= samples_.size()) return;
  Sample& s = samples_[std::size_t(out.index)];
  if (s.finish != nullptr) return;
  for (std::int32_t id : out.new_token_ids) {
    ++s.tokens;
    if (hidden_tokens_.contains(id)) continue;
    const StopMatcher::Result r = s.matcher.feed(s.decoder->push(id));
    s.text += r.text;
    if (r.stopped) {
      s.finish = "stop";
      return;
    }
  }
  if (out.finish_reason == FinishReason::kNone) return;
  const StopMatcher::Result r = s.matcher.feed(s.decoder->flush());
  s.text += r.text + (r.stopped ? std::string() : s.matcher.finish());
  s.finish = r.stopped ? "stop" : finish_name(out.finish_reason);
}

void GenerationJob::absorb(const RequestChannel::News& news) {
  for (const SampleOutput& out : news.samples) absorb_sample(out);
  if (!news.error.empty()) error_ = news.error;
  if (news.finished) finished_ = true;
  // Every sample met a stop string: the engine need not go on.
  if (!finished_ && all_samples_done()) {
    worker_.abort(ticket_.id);
    finished_ = true;
  }
}

bool GenerationJob::all_samples_done() const {
  for (const Sample& s : samples_)
    if (s.finish == nullptr) return false;
  return true;
}

std::string GenerationJob::usage_json() const {
  std::int64_t completion = 0;
  for (const Sample& s : samples_) completion += s.tokens;
  const std::int64_t prompt = std::ssize(request_.prompt_ids);
  return dump({{"prompt_tokens", prompt},
               {"completion_tokens", completion},
               {"total_tokens", prompt + completion}});
}

bool GenerationJob::wait_finished(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  while (!finished_) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
    if (left.count() <= 0) return false;
    absorb(ticket_.channel->wait(std::min(left, std::chrono::milliseconds(1000))));
  }
  return true;
}

std::string GenerationJob::whole_body() {
  const auto start = Clock::now();
  done_ = true;
  if (!error_.empty()) throw ApiError(500, error_);
  std::string body = final_body();
  metrics_.add_http_seconds(since(start));
  return body;
}

std::string GenerationJob::final_body() {
  const bool chat = request_.endpoint == Endpoint::kChat;
  json choices = json::array();
  for (std::size_t i = 0; i < samples_.size(); ++i) {
    Sample& s = samples_[i];
    json c = {
        {"index", i}, {"logprobs", nullptr}, {"finish_reason", s.finish ? s.finish : "abort"}};
    if (chat)
      c["message"] = {{"role", "assistant"}, {"content", s.text}};
    else
      c["text"] = s.text;
    choices.push_back(std::move(c));
  }
  json body = {{"id", id_},
               {"object", chat ? "chat.completion" : "text_completion"},
               {"created", created_},
               {"model", model_name_},
               {"choices", std::move(choices)},
               {"usage", json::parse(usage_json())}};
  return dump(body);
}

// One SSE event for sample `index`: its unsent text and, once done, its finish reason.
std::string GenerationJob::chunk(std::size_t index, Sample& s) {
  const bool chat = request_.endpoint == Endpoint::kChat;
  json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
  if (s.finish != nullptr) c["finish_reason"] = s.finish;
  if (chat) {
    json delta = json::object();
    if (!s.role_sent) delta["role"] = "assistant";
    if (!s.text.empty() || !s.role_sent) delta["content"] = s.text;
    c["delta"] = std::move(delta);
    s.role_sent = true;
  } else {
    c["text"] = s.text;
  }
  s.text.clear();
  const json event = {{"id", id_},
                      {"object", chat ? "chat.completion.chunk" : "text_completion"},
                      {"created", created_},
                      {"model", model_name_},
                      {"choices", json::array({std::move(c)})}};
  return "data: " + dump(event) + "\n\n";
}

std::string GenerationJob::next_events(std::chrono::milliseconds timeout) {
  if (done_) return {};
  std::vector<const char*> finished_before;
  for (const Sample& s : samples_) finished_before.push_back(s.finish);
  absorb(ticket_.channel->wait(timeout));
  const auto start = Clock::now();
  std::string events;
  for (std::size_t i = 0; i < samples_.size(); ++i) {
    Sample& s = samples_[i];
    const bool newly_done = s.finish != nullptr && finished_before[i] == nullptr;
    if (!s.text.empty() || newly_done || (request_.endpoint == Endpoint::kChat && !s.role_sent))
      events += chunk(i, s);
  }
  if (finished_) {
    if (!error_.empty()) events += "data: " + ApiError(500, error_).to_json() + "\n\n";
    if (request_.include_usage) {
      const json usage = {{"id", id_},
                          {"object", request_.endpoint == Endpoint::kChat ? "chat.completion.chunk"
                                                                          : "text_completion"},
                          {"created", created_},
                          {"model", model_name_},
                          {"choices", json::array()},
                          {"usage", json::parse(usage_json())}};
      events += "data: " + dump(usage) + "\n\n";
    }
    events += "data: [DONE]\n\n";
    done_ = true;
  }
  metrics_.add_http_seconds(since(start));
  return events;
}

void GenerationJob::release(bool delivered) {
  if (finished_) return;
  // The client went away (or the write failed) before the end: free the
  // pages now. Counted first, so that whoever sees the request gone (an idle
  // worker) also sees the abort in /metrics.
  if (!delivered) metrics_.count_client_abort();
  worker_.abort(ticket_.id);
}

}  // namespace pagedattn::serve
