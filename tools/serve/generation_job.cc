#include "generation_job.h"

#include <algorithm>
#include <atomic>
#include <ctime>
#include <string_view>

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

// Characters (code points) in UTF-8 text: its bytes less continuation bytes.
std::int64_t characters(std::string_view text) {
  return std::count_if(text.begin(), text.end(),
                       [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
}

json byte_values(const std::string& text) {
  json bytes = json::array();
  for (const char c : text) bytes.push_back(static_cast<unsigned char>(c));
  return bytes;
}

// Completions: {"tokens", "token_logprobs", "top_logprobs", "text_offset"},
// each top_logprobs entry a {text: logprob} of the most likely tokens and
// the token itself (the legacy API's shape).
json completion_logprobs(const std::vector<LogprobEntry>& entries) {
  json tokens = json::array(), logprobs = json::array(), tops = json::array(),
       offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    offsets.push_back(e.text_offset);
    if (!e.logprob) {  // the prompt's first token
      logprobs.push_back(nullptr);
      tops.push_back(nullptr);
      continue;
    }
    logprobs.push_back(*e.logprob);
    json top = json::object();
    for (const auto& [text, logprob] : e.top)
      if (!top.contains(text)) top[text] = logprob;  // tokens of the same text: the likelier
    if (!top.contains(e.token)) top[e.token] = *e.logprob;
    tops.push_back(std::move(top));
  }
  return {{"tokens", std::move(tokens)},
          {"token_logprobs", std::move(logprobs)},
          {"top_logprobs", std::move(tops)},
          {"text_offset", std::move(offsets)}};
}

// Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}.
json chat_logprobs(const std::vector<LogprobEntry>& entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (const auto& [text, logprob] : e.top)
      top.push_back({{"token", text}, {"logprob", logprob}, {"bytes", byte_values(text)}});
    content.push_back({{"token", e.token},
                       {"logprob", e.logprob.value_or(0.0f)},
                       {"bytes", byte_values(e.token)},
                       {"top_logprobs", std::move(top)}});
  }
  return {{"content", std::move(content)}};
}

// A choice's `logprobs`: null when not asked for, or in a stream's chunk
// that carries no tokens.
json logprobs_of(const GenerationRequest& request, const std::vector<LogprobEntry>& entries,
                 bool streamed) {
  if (!request.params.logprobs || (streamed && entries.empty())) return nullptr;
  return request.endpoint == Endpoint::kChat ? chat_logprobs(entries)
                                             : completion_logprobs(entries);
}

}  // namespace

GenerationJob::GenerationJob(GenerationRequest request, EngineWorker::Ticket ticket,
                             const TextCodec& codec, std::string model_name, EngineWorker& worker,
                             ServerMetrics& metrics)
    : request_(std::move(request)),
      ticket_(std::move(ticket)),
      codec_(codec),
      model_name_(std::move(model_name)),
      id_(next_id(request_.endpoint)),
      created_(std::int64_t(std::time(nullptr))),
      worker_(worker),
      metrics_(metrics) {
  for (std::int32_t id : codec.stop_token_ids()) hidden_tokens_.insert(id);
  for (std::int32_t id : request_.params.stop_token_ids) hidden_tokens_.insert(id);
  for (std::int32_t i = 0; i < request_.params.n; ++i) {
    Sample& s = samples_.emplace_back(
        codec.decoder(), StopMatcher(request_.stop, request_.params.include_stop_str_in_output));
    if (request_.echo) {
      s.text = request_.prompt_text;
      s.characters = characters(request_.prompt_text);
    }
  }
}

LogprobEntry GenerationJob::logprob_entry(const TokenLogprobs& lp, std::int64_t text_offset) const {
  LogprobEntry e{
      .token = codec_.token_text(lp.token), .logprob = lp.logprob, .text_offset = text_offset};
  e.top.reserve(lp.top.size());
  for (const auto& [id, logprob] : lp.top) e.top.emplace_back(codec_.token_text(id), logprob);
  return e;
}

// With echo and logprobs: the prompt's tokens lead every choice's logprobs,
// the first without a logprob (it has no context).
void GenerationJob::absorb_prompt_logprobs(const std::vector<TokenLogprobs>& prompt) {
  if (!request_.echo || request_.prompt_ids.empty() ||
      prompt.size() + 1 != request_.prompt_ids.size())
    return;
  std::vector<LogprobEntry> entries;
  entries.push_back({.token = codec_.token_text(request_.prompt_ids[0])});
  std::int64_t offset = characters(entries[0].token);
  for (const TokenLogprobs& lp : prompt) {
    entries.push_back(logprob_entry(lp, offset));
    offset += characters(entries.back().token);
  }
  for (Sample& s : samples_) s.logprobs.insert(s.logprobs.begin(), entries.begin(), entries.end());
}

void GenerationJob::absorb_sample(const SampleOutput& out) {
  if (out.index < 0 || std::size_t(out.index) >= samples_.size()) return;
  Sample& s = samples_[std::size_t(out.index)];
  if (s.finish != nullptr) return;
  const bool with_logprobs = out.logprobs.size() == out.new_token_ids.size();
  for (std::size_t i = 0; i < out.new_token_ids.size(); ++i) {
    const std::int32_t id = out.new_token_ids[i];
    ++s.tokens;
    if (with_logprobs) s.logprobs.push_back(logprob_entry(out.logprobs[i], s.characters));
    if (hidden_tokens_.contains(id)) continue;
    const std::string piece = s.decoder->push(id);
    s.characters += characters(piece);
    // Stop strings count from min_tokens on, as in vLLM.
    if (s.tokens < request_.params.min_tokens) {
      s.text += piece;
      continue;
    }
    const StopMatcher::Result r = s.matcher.feed(piece);
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
  absorb_prompt_logprobs(news.prompt_logprobs);
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
    json c = {{"index", i},
              {"logprobs", logprobs_of(request_, s.logprobs, false)},
              {"finish_reason", s.finish ? s.finish : "abort"}};
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
  json c = {{"index", index},
            {"logprobs", logprobs_of(request_, s.logprobs, true)},
            {"finish_reason", nullptr}};
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
  s.logprobs.clear();
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
    if (!s.text.empty() || !s.logprobs.empty() || newly_done ||
        (request_.endpoint == Endpoint::kChat && !s.role_sent))
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
