// bench-serve --url: one thread and one connection per request in flight; the
// stream is parsed as it arrives, so first-token and finish times are the
// client's.
#include "bench_serve_http.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <map>
#include <thread>

#include "bench_serve_sse.h"
#include "pagedattn/errors.h"
#include "progress_bar.h"
#include "serve_report.h"

namespace pagedattn::tools {
namespace {

using Clock = std::chrono::steady_clock;
using Json = nlohmann::json;

// Prompt token ids stay in [kFirstId, kFirstId + kIdSpan): clear of the special
// tokens at the start of a vocabulary, and inside any vocabulary of >= 32k.
constexpr std::int32_t kFirstId = 1000, kIdSpan = 30000;
constexpr std::size_t kMaxErrorBody = 4096;  // bytes of an error response kept for its message

httplib::Client make_client(const ServerUrl& url, const BenchServeOptions& o) {
  httplib::Client client(url.host, url.port);
  const auto timeout = std::chrono::duration<double>(o.timeout_s);
  client.set_connection_timeout(std::min(timeout, std::chrono::duration<double>(30.0)));
  client.set_read_timeout(timeout);
  client.set_write_timeout(timeout);
  client.set_keep_alive(false);
  if (!o.api_key.empty()) client.set_bearer_token_auth(o.api_key.c_str());
  return client;
}

// An error response's message: OpenAI's {"error": {"message": ...}}, else the
// start of the body.
std::string error_message(const std::string& body) {
  const Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_object() && j.contains("error")) {
    const Json& e = j["error"];
    if (e.is_object() && e.contains("message") && e["message"].is_string())
      return e["message"].get<std::string>();
    return e.dump();
  }
  return body.substr(0, 200);
}

// The state of one streamed completion, event by event.
struct StreamState {
  double first_token = -1.0;
  std::map<std::int64_t, std::int32_t> chunks;  // content chunks per choice index
  std::int64_t usage_tokens = -1;               // usage.completion_tokens, when sent
  bool done = false;                            // "[DONE]" seen
  std::string error;

  // Takes one event's data at time `t`; false (and `error`) when it reports
  // an error or is not a completion chunk.
  bool take(const std::string& data, double t) {
    if (data == "[DONE]") return done = true;
    const Json j = Json::parse(data, nullptr, /*allow_exceptions=*/false);
    if (!j.is_object()) return fail("stream event is not a JSON object: " + data.substr(0, 200));
    if (j.contains("error")) return fail("stream error: " + error_message(data));
    if (j.contains("usage") && j["usage"].is_object()) {
      const Json& u = j["usage"];
      if (u.contains("completion_tokens") && u["completion_tokens"].is_number_integer())
        usage_tokens = u["completion_tokens"].get<std::int64_t>();
    }
    if (!j.contains("choices") || !j["choices"].is_array())
      return usage_tokens >= 0 || fail("stream event without \"choices\": " + data.substr(0, 200));
    for (const Json& c : j["choices"]) {
      const bool has_text = c.is_object() && c.contains("text") && c["text"].is_string() &&
                            !c["text"].get_ref<const std::string&>().empty();
      if (!has_text) continue;
      const std::int64_t index = c.contains("index") && c["index"].is_number_integer()
                                     ? c["index"].get<std::int64_t>()
                                     : 0;
      ++chunks[index];
      if (first_token < 0) first_token = t;
    }
    return true;
  }

  bool fail(std::string why) {
    error = std::move(why);
    return false;
  }
};

// Why a request failed, from the transport's outcome, the status and the
// stream; empty when it completed.
std::string failure(bool sent, httplib::Error error, int status, const std::string& error_body,
                    const StreamState& stream) {
  if (!stream.error.empty()) return stream.error;
  if (!sent && status == 0) return "transport: " + httplib::to_string(error);
  if (status < 200 || status >= 300)
    return detail::concat("HTTP ", status, ": ", error_message(error_body));
  if (!sent) return "transport during the stream: " + httplib::to_string(error);
  if (!stream.done) return "stream ended without data: [DONE]";
  if (stream.first_token < 0) return "stream carried no text";
  return "";
}

HttpRequestResult stream_one(const ServerUrl& url, const BenchServeOptions& o,
                             const std::string& body, const TraceRequest& r,
                             Clock::time_point start) {
  auto now = [&] { return std::chrono::duration<double>(Clock::now() - start).count(); };
  httplib::Client client = make_client(url, o);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body;
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  int status = 0;
  std::string error_body;
  SseParser sse;
  StreamState stream;
  req.response_handler = [&](const httplib::Response& res) {
    status = res.status;
    return true;
  };
  req.content_receiver = [&](const char* data, std::size_t size, std::uint64_t, std::uint64_t) {
    if (status < 200 || status >= 300) {
      const std::size_t room = kMaxErrorBody - std::min(kMaxErrorBody, error_body.size());
      error_body.append(data, std::min(size, room));
      return true;
    }
    const double t = now();
    for (const std::string& event : sse.feed({data, size}))
      if (!stream.take(event, t)) return false;
    return true;
  };
  HttpRequestResult out;
  out.timing.arrival = now();
  httplib::Response res;
  httplib::Error error = httplib::Error::Success;
  const bool sent = client.send(req, res, error);
  out.error = failure(sent, error, status, error_body, stream);
  if (!out.error.empty()) return out;
  RequestTiming& t = out.timing;
  t.first_token = stream.first_token;
  t.finish = now();
  std::int64_t chunk_total = 0;
  for (const auto& [index, n] : stream.chunks) {
    chunk_total += n;
    t.longest_sample = std::max(t.longest_sample, n);
  }
  out.usage_reported = stream.usage_tokens >= 0;
  t.output_tokens = out.usage_reported ? stream.usage_tokens : chunk_total;
  if (out.usage_reported && r.n == 1) t.longest_sample = static_cast<std::int32_t>(t.output_tokens);
  return out;
}

// Failures grouped by message, most frequent first.
std::vector<std::pair<std::string, std::int32_t>> failure_kinds(
    const std::vector<HttpRequestResult>& results) {
  std::map<std::string, std::int32_t> count;
  for (const HttpRequestResult& r : results)
    if (!r.error.empty()) ++count[r.error];
  std::vector<std::pair<std::string, std::int32_t>> kinds(count.begin(), count.end());
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const auto& a, const auto& b) { return a.second > b.second; });
  return kinds;
}

}  // namespace

Json completion_body(const TraceRequest& r, std::size_t index, const std::string& model,
                     bool text_prompts) {
  Json prompt;
  if (text_prompts) {
    std::string text = "hello";
    for (std::int32_t i = 1; i < r.prompt_len; ++i) text += " hello";
    prompt = text;
  } else {
    prompt =
        synthetic_prompt(r, index, kFirstId, kIdSpan);  // a shared-prefix's system prompt first
  }
  Json body = {{"model", model},
               {"prompt", std::move(prompt)},
               {"max_tokens", r.output_len},
               {"ignore_eos", true},
               {"temperature", r.n > 1 ? 1.0 : 0.0},
               {"stream", true},
               {"stream_options", {{"include_usage", true}}}};
  if (r.n > 1) body["n"] = r.n;
  return body;
}

std::string resolve_model_name(const ServerUrl& url, const BenchServeOptions& o) {
  httplib::Client client = make_client(url, o);
  const httplib::Result res = client.Get("/v1/models");
  require(static_cast<bool>(res), "bench-serve: cannot reach --url = '", o.url,
          "' (GET /v1/models: ", httplib::to_string(res.error()), ")");
  if (!o.model_name.empty()) return o.model_name;
  require(res->status >= 200 && res->status < 300, "bench-serve: GET /v1/models on '", o.url,
          "' answered HTTP ", res->status, " (", error_message(res->body),
          "); name the model with --model-name");
  const Json j = Json::parse(res->body, nullptr, /*allow_exceptions=*/false);
  const bool listed = j.is_object() && j.contains("data") && j["data"].is_array() &&
                      !j["data"].empty() && j["data"][0].is_object() &&
                      j["data"][0].contains("id") && j["data"][0]["id"].is_string();
  require(listed, "bench-serve: GET /v1/models on '", o.url,
          "' lists no model id; name the model with --model-name");
  return j["data"][0]["id"].get<std::string>();
}

std::vector<HttpRequestResult> run_over_http(const ServerUrl& url, const BenchServeOptions& o,
                                             const std::string& model,
                                             const std::vector<TraceRequest>& trace) {
  std::vector<std::string> bodies;
  // Seed 1 (the default) keeps the prompts of earlier runs; each other seed
  // draws its own token ids, so that runs against a server that caches
  // prompts (llama-server's cache_prompt) do not repeat one another's.
  const std::size_t first_stream = std::size_t(o.seed - 1) << 32;
  for (std::size_t i = 0; i < trace.size(); ++i)
    bodies.push_back(completion_body(trace[i], first_stream + i, model, o.text_prompts).dump());
  std::vector<HttpRequestResult> results(trace.size());
  std::atomic<std::size_t> next{0};
  std::atomic<std::int64_t> finished{0};
  const auto start = Clock::now();
  auto worker = [&] {
    for (std::size_t i; (i = next++) < trace.size();) {
      std::this_thread::sleep_until(start + std::chrono::duration<double>(trace[i].arrival));
      results[i] = stream_one(url, o, bodies[i], trace[i], start);
      ++finished;
    }
  };
  const std::size_t workers =
      std::min(trace.size(), std::size_t(o.concurrency > 0 ? o.concurrency : kMaxConcurrency));
  std::vector<std::jthread> threads;
  for (std::size_t w = 0; w < workers; ++w) threads.emplace_back(worker);
  ProgressBar bar(stderr, std::ssize(trace));
  while (finished < std::ssize(trace)) {
    const std::size_t started = std::min(next.load(), trace.size());
    bar.update(finished, detail::concat(started - std::size_t(finished), " in flight"));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  threads.clear();
  bar.update(finished, "0 in flight");
  bar.finish();
  return results;
}

int run_bench_serve_http(const BenchServeOptions& o, const std::vector<TraceRequest>& trace) {
  const ServerUrl url = parse_server_url(o.url);
  std::ofstream json_file;
  if (!o.json.empty()) json_file = open_json_output(o.json);
  const std::string model = resolve_model_name(url, o);
  std::printf("pagedattn bench-serve: %s, model '%s', %s prompts\n", o.url.c_str(), model.c_str(),
              o.text_prompts ? "text" : "token-id");
  std::printf("  workload %s: %zu requests, %s; %s\n", o.workload.c_str(), trace.size(),
              o.request_rate > 0 ? detail::concat("Poisson ", o.request_rate, " req/s").c_str()
                                 : "arrivals from the trace",
              o.concurrency > 0 ? detail::concat("at most ", o.concurrency, " in flight").c_str()
                                : "no concurrency limit");
  std::fflush(stdout);
  const std::vector<HttpRequestResult> results = run_over_http(url, o, model, trace);
  std::vector<RequestTiming> timing;
  ClientTally tally;
  double duration = 0.0;
  for (std::size_t i = 0; i < results.size(); ++i) {
    const HttpRequestResult& r = results[i];
    timing.push_back(r.timing);
    if (!r.error.empty()) continue;
    duration = std::max(duration, r.timing.finish);
    tally.counted_from_chunks += r.usage_reported ? 0 : 1;
    tally.short_outputs += r.timing.output_tokens < std::int64_t{trace[i].output_len} * trace[i].n;
  }
  tally.failures = failure_kinds(results);
  for (const auto& [message, n] : tally.failures) tally.failed += n;
  const ServeSummary summary = summarize_requests(timing, duration);
  print_client_report(stdout, summary, tally);
  if (!o.json.empty()) {
    const RunInfo info = {{"url", o.url},
                          {"model_name", model},
                          {"workload", o.workload},
                          {"requests", trace.size()},
                          {"request_rate", o.request_rate > 0 ? Json(o.request_rate) : nullptr},
                          {"concurrency", o.concurrency > 0 ? Json(o.concurrency) : nullptr},
                          {"prompts", o.text_prompts ? "text" : "token_ids"},
                          {"seed", o.seed}};
    std::vector<std::string> errors;
    for (const HttpRequestResult& r : results) errors.push_back(r.error);
    write_json(json_file, o.json, client_json(info, summary, tally, timing, errors));
    std::printf("\n  wrote %s\n", o.json.c_str());
  }
  return tally.failed > 0 ? 3 : 0;
}

}  // namespace pagedattn::tools
