// The server over real sockets on 127.0.0.1 (a free port), with the synthetic
// tiny model: every endpoint, streaming, n > 1, stop strings, errors, limits,
// clients that hang up or dawdle, and 64 clients at once.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <atomic>
#include <condition_variable>
#include <fstream>
#include <mutex>
#include <thread>

#include <nlohmann/json.hpp>

#include "core/sanitizers.h"
#include "http_server.h"
#include "pagedattn/llama.h"
#include "serve_cli.h"
#include "socket_client.h"

namespace pagedattn::serve {
namespace {

using nlohmann::json;
using testing::SocketClient;
using namespace std::chrono_literals;

constexpr const char* kKey = "test-key";

// A server on its own thread for the life of the object.
class RunningServer {
 public:
  // max_position > 0: the tiny model with that context (long requests).
  explicit RunningServer(ServerOptions o = {}, double kv_mib = 4, std::int32_t max_position = 0) {
    signal(SIGPIPE, SIG_IGN);
    o.port = 0;
    o.model_name = "tiny";
    EngineConfig ec;
    LlamaConfig c = llama_preset("tiny");
    if (max_position > 0) c.max_position = max_position;
    ec.model = make_llama_model(c);
    ec.kv_memory_bytes = static_cast<std::int64_t>(kv_mib * (1 << 20));
    server_ = std::make_unique<HttpServer>(ec, make_byte_codec(c.vocab_size, c.eos_token_id), o);
    server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
  }
  // A server the CLI built (make_server).
  explicit RunningServer(std::unique_ptr<HttpServer> server) : server_(std::move(server)) {
    signal(SIGPIPE, SIG_IGN);
    server_->bind();
    thread_ = std::thread([this] { server_->listen(); });
  }
  ~RunningServer() {
    server_->shutdown();
    thread_.join();
  }
  int port() const { return server_->bound_port(); }
  HttpServer& server() { return *server_; }
  httplib::Client client(const char* key = kKey) const {
    httplib::Client c("127.0.0.1", port());
    c.set_read_timeout(60, 0);
    if (key != nullptr) c.set_bearer_token_auth(key);
    return c;
  }
  // Every request done and every page back in the pool (waits a little:
  // the engine thread frees pages on its own schedule).
  bool idle_and_empty(std::chrono::milliseconds timeout = 10s) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    while (std::chrono::steady_clock::now() < deadline) {
      if (server_->worker().in_flight() == 0 && server_->worker().stats().pages_in_use == 0)
        return true;
      std::this_thread::sleep_for(10ms);
    }
    return false;
  }

 private:
  std::unique_ptr<HttpServer> server_;
  std::thread thread_;
};

// pagedattn_client_aborts_total as /metrics reports it now.
double client_aborts(RunningServer& server) {
  const std::string m = server.server().metrics_text();
  const std::string name = "\npagedattn_client_aborts_total ";
  return std::stod(m.substr(m.find(name) + name.size()));
}

ServerOptions keyed() {
  ServerOptions o;
  o.api_key = kKey;
  o.max_body_bytes = 64 << 10;
  return o;
}

class ServerTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { server_ = new RunningServer(keyed()); }
  static void TearDownTestSuite() {
    delete server_;
    server_ = nullptr;
  }
  static json post(const std::string& path, const json& body, int expect_status = 200) {
    auto res = server_->client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res) << "no response";
    if (!res) return {};
    EXPECT_EQ(res->status, expect_status) << res->body;
    return json::parse(res->body);
  }
  // The data lines of a Server-Sent Events stream, "[DONE]" included.
  static std::vector<std::string> post_stream(const std::string& path, json body) {
    body["stream"] = true;
    auto res = server_->client().Post(path, body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (!res) return {};
    EXPECT_EQ(res->status, 200);
    EXPECT_EQ(res->get_header_value("Content-Type"), "text/event-stream");
    std::vector<std::string> data;
    std::size_t at = 0;
    while ((at = res->body.find("data: ", at)) != std::string::npos) {
      const std::size_t end = res->body.find("\n\n", at);
      data.push_back(res->body.substr(at + 6, end - at - 6));
      at = end;
    }
    return data;
  }
  static RunningServer* server_;
};
RunningServer* ServerTest::server_ = nullptr;

// Texts per choice index of a streamed completion, and the finish reasons.
struct Streamed {
  std::map<int, std::string> text;
  std::map<int, std::string> finish;
  json usage;
};

Streamed collect(const std::vector<std::string>& events, bool chat) {
  Streamed s;
  EXPECT_FALSE(events.empty());
  if (events.empty()) return s;
  EXPECT_EQ(events.back(), "[DONE]");
  for (std::size_t i = 0; i + 1 < events.size(); ++i) {
    const json e = json::parse(events[i]);
    if (e.contains("usage")) s.usage = e["usage"];
    for (const json& c : e["choices"]) {
      const int index = c["index"];
      if (chat) {
        if (c["delta"].contains("content"))
          s.text[index] += c["delta"]["content"].get<std::string>();
      } else {
        s.text[index] += c["text"].get<std::string>();
      }
      if (!c["finish_reason"].is_null()) s.finish[index] = c["finish_reason"];
    }
  }
  return s;
}

TEST_F(ServerTest, HealthModelsAndMetrics) {
  auto c = server_->client(nullptr);  // no key needed outside /v1
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
  auto models = server_->client().Get("/v1/models");
  ASSERT_TRUE(models);
  ASSERT_EQ(models->status, 200);
  EXPECT_EQ(json::parse(models->body)["data"][0]["id"], "tiny");
  post("/v1/completions", {{"prompt", "warm"}, {"max_tokens", 3}});
  auto metrics = c.Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name :
       {"pagedattn_running_sequences ", "pagedattn_waiting_requests ", "pagedattn_kv_pages_used ",
        "pagedattn_kv_pages_free ", "pagedattn_generation_tokens_per_second ",
        "pagedattn_time_to_first_token_seconds_bucket",
        "pagedattn_time_per_output_token_seconds_count", "pagedattn_preemptions_total ",
        "pagedattn_server_overhead_ratio ", "pagedattn_http_responses_total{status=\"200\"}"})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  EXPECT_EQ(metrics->body.find("pagedattn_generation_tokens_total 0\n"), std::string::npos);
}

TEST_F(ServerTest, CompletionCountsTokensAndStopsAtMaxTokens) {
  const json r =
      post("/v1/completions", {{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 7}});
  EXPECT_EQ(r["object"], "text_completion");
  EXPECT_EQ(r["model"], "tiny");
  ASSERT_EQ(r["choices"].size(), 1u);
  EXPECT_EQ(r["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(r["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r["usage"]["completion_tokens"], 7);
  EXPECT_EQ(r["usage"]["total_tokens"], 12);
  EXPECT_FALSE(r["choices"][0]["text"].get<std::string>().empty());
}

TEST_F(ServerTest, StreamedTextEqualsTheWholeResponse) {
  const json body = {
      {"prompt", {1, 2, 3, 4}}, {"max_tokens", 9}, {"stream_options", {{"include_usage", true}}}};
  const json whole = post("/v1/completions", body);
  const Streamed s = collect(post_stream("/v1/completions", body), false);
  EXPECT_EQ(s.text.at(0), whole["choices"][0]["text"]);
  EXPECT_EQ(s.finish.at(0), "length");
  EXPECT_EQ(s.usage["completion_tokens"], 9);
  EXPECT_EQ(s.usage["prompt_tokens"], 4);
}

TEST_F(ServerTest, ChatWholeAndStreamed) {
  const json body = {
      {"messages",
       {{{"role", "system"}, {"content", "be brief"}}, {{"role", "user"}, {"content", "hi"}}}},
      {"max_tokens", 6}};
  const json whole = post("/v1/chat/completions", body);
  EXPECT_EQ(whole["object"], "chat.completion");
  EXPECT_EQ(whole["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(whole["usage"]["completion_tokens"], 6);
  const auto events = post_stream("/v1/chat/completions", body);
  const Streamed s = collect(events, true);
  EXPECT_EQ(s.text.at(0), whole["choices"][0]["message"]["content"]);
  EXPECT_EQ(json::parse(events.front())["choices"][0]["delta"]["role"], "assistant");
  EXPECT_EQ(json::parse(events.front())["object"], "chat.completion.chunk");
}

TEST_F(ServerTest, SeveralSamplesEachWithItsIndex) {
  const json body = {
      {"prompt", "abc"}, {"max_tokens", 5}, {"n", 3}, {"temperature", 1.0}, {"seed", 7}};
  const json whole = post("/v1/completions", body);
  ASSERT_EQ(whole["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(whole["choices"][i]["index"], i);
  EXPECT_EQ(whole["usage"]["completion_tokens"], 15);
  const Streamed s = collect(post_stream("/v1/completions", body), false);
  ASSERT_EQ(s.text.size(), 3u);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(s.text.at(i), whole["choices"][i]["text"]) << i;  // same seed, same text
}

TEST_F(ServerTest, StopStringsCutTheTextStreamedOrNot) {
  const json plain = post("/v1/completions", {{"prompt", "Hello"}, {"max_tokens", 12}});
  const std::string text = plain["choices"][0]["text"];
  ASSERT_GE(text.size(), 6u);
  const std::string stop = text.substr(3, 3);  // spans token boundaries for multi-character tokens
  const std::string expected = text.substr(0, text.find(stop));
  const json body = {{"prompt", "Hello"}, {"max_tokens", 12}, {"stop", {"never-there", stop}}};
  const json cut = post("/v1/completions", body);
  EXPECT_EQ(cut["choices"][0]["text"], expected);
  EXPECT_EQ(cut["choices"][0]["finish_reason"], "stop");
  const Streamed s = collect(post_stream("/v1/completions", body), false);
  EXPECT_EQ(s.text.at(0), expected);
  EXPECT_EQ(s.finish.at(0), "stop");
  EXPECT_TRUE(server_->idle_and_empty());
}

TEST_F(ServerTest, StopTokenIds) {
  std::vector<int> all(1024);
  for (int i = 0; i < 1024; ++i) all[std::size_t(i)] = i;
  const json r =
      post("/v1/completions", {{"prompt", "x"}, {"max_tokens", 10}, {"stop_token_ids", all}});
  EXPECT_EQ(r["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(r["usage"]["completion_tokens"], 1);
  EXPECT_EQ(r["choices"][0]["text"], "");  // the stop token is not text
}

TEST_F(ServerTest, BadRequestsGetOpenAiErrors) {
  auto c = server_->client();
  auto check = [&](const httplib::Result& res, int status, const char* param) {
    ASSERT_TRUE(res);
    EXPECT_EQ(res->status, status) << res->body;
    const json e = json::parse(res->body)["error"];
    EXPECT_TRUE(e["message"].is_string());
    if (param != nullptr) {
      EXPECT_EQ(e["param"], param);
    }
  };
  check(c.Post("/v1/completions", "{\"prompt\": ", "application/json"), 400, nullptr);
  check(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": "many"})", "application/json"),
        400, "max_tokens");
  check(c.Post("/v1/chat/completions", R"({"messages": "hi"})", "application/json"), 400,
        "messages");
  check(c.Post("/v1/completions", R"({"prompt": "a", "max_tokens": 5000})", "application/json"),
        413, "max_tokens");
  check(c.Post("/v1/completions", std::string(100 << 10, ' '), "application/json"), 413, nullptr);
  check(c.Get("/v1/nothing-here"), 404, nullptr);
  check(server_->client("wrong").Get("/v1/models"), 401, nullptr);
  check(server_->client(nullptr).Post("/v1/completions", R"({"prompt": "a"})", "application/json"),
        401, nullptr);
  EXPECT_TRUE(server_->idle_and_empty());
}

// A body of brackets or a prompt longer than the context would make work and
// memory many times the body's size; each is refused before that work.
TEST_F(ServerTest, DeepNestingAndOverlongPromptsAreRefusedBeforeTheWork) {
  auto c = server_->client();
  auto deep = c.Post("/v1/completions", R"({"prompt": "a", "x": )" + std::string(60 << 10, '['),
                     "application/json");
  ASSERT_TRUE(deep);
  EXPECT_EQ(deep->status, 400);
  EXPECT_EQ(json::parse(deep->body)["error"]["message"],
            "the request body nests JSON deeper than 64 levels");
  // The tiny model's context is 4096 tokens, a token of the byte codec one byte.
  auto long_prompt = c.Post("/v1/completions", json{{"prompt", std::string(60 << 10, 'a')}}.dump(),
                            "application/json");
  ASSERT_TRUE(long_prompt);
  EXPECT_EQ(long_prompt->status, 413);
  const json e = json::parse(long_prompt->body)["error"];
  EXPECT_EQ(e["param"], "prompt");
  EXPECT_EQ(e["code"], "context_length_exceeded");
  EXPECT_EQ(e["message"],
            "the prompt's text has 61440 bytes; the model's context of 4096 tokens holds at most "
            "4095 bytes (1 per token)");
}

// httplib would read "-5" as 2^64 - 5 and 20 digits as 2^64 - 1, then wait a
// read timeout (10 s here) for the body before its 413; and of two lengths it
// trusts the first. Each is refused before the body, and the connection closed.
TEST_F(ServerTest, AMalformedContentLengthIs400AtOnceAndClosesTheConnection) {
  for (const char* lengths : {"Content-Length: -5", "Content-Length: 99999999999999999999",
                              "Content-Length: 2\r\nContent-Length: 5"}) {
    SocketClient s(server_->port());
    const auto start = std::chrono::steady_clock::now();
    s.send(std::string("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n") +
           "Authorization: Bearer " + kKey + "\r\nContent-Type: application/json\r\n" + lengths +
           "\r\n\r\n");
    // Returns when the server closes the connection (or after 5 s).
    const std::string reply = s.read_until("never sent", 5s);
    EXPECT_LT(std::chrono::steady_clock::now() - start, 1s) << lengths;
    ASSERT_TRUE(reply.starts_with("HTTP/1.1 400 ")) << lengths << ": " << reply;
    const std::size_t body = reply.find("\r\n\r\n");
    ASSERT_NE(body, std::string::npos) << reply;
    const json e = json::parse(reply.substr(body + 4))["error"];
    EXPECT_EQ(e["type"], "invalid_request_error");
    EXPECT_NE(e["message"].get<std::string>().find("Content-Length"), std::string::npos) << e;
  }
}

TEST(ApiKey, SecretMatchesOnlyTheWholeSecret) {
  EXPECT_TRUE(secret_matches("Bearer key-123", "Bearer key-123"));
  EXPECT_FALSE(secret_matches("Bearer key-124", "Bearer key-123"));  // last byte
  EXPECT_FALSE(secret_matches("bearer key-123", "Bearer key-123"));  // first byte
  EXPECT_FALSE(secret_matches("Bearer key-12", "Bearer key-123"));   // a prefix
  EXPECT_FALSE(secret_matches("Bearer key-123x", "Bearer key-123"));
  // The secret repeated is still a different length.
  EXPECT_FALSE(secret_matches("abcabc", "abc"));
  EXPECT_FALSE(secret_matches("", "abc"));
  EXPECT_FALSE(secret_matches("abc", ""));
  EXPECT_TRUE(secret_matches("", ""));
}

TEST_F(ServerTest, AClientThatHangsUpAbortsItsRequestAndFreesItsPages) {
  SocketClient s(server_->port());
  const json body = {
      {"prompt", "go"}, {"max_tokens", 2000}, {"stream", true}, {"ignore_eos", true}};
  std::string request = testing::http_post("/v1/completions", body.dump());
  request.insert(request.find("\r\n") + 2, std::string("Authorization: Bearer ") + kKey + "\r\n");
  s.send(request);
  const std::string got = s.read_until("data: ", 30s);
  ASSERT_NE(got.find("data: "), std::string::npos) << got;
  EXPECT_GT(server_->server().worker().in_flight(), 0);
  s.close();
  EXPECT_TRUE(server_->idle_and_empty()) << "the request kept running after its client left";
  const std::string metrics = server_->server().metrics_text();
  EXPECT_EQ(metrics.find("pagedattn_client_aborts_total 0\n"), std::string::npos);
}

TEST_F(ServerTest, SixtyFourClientsAtOnce) {
  constexpr int kClients = 64;
  std::atomic<int> ok{0};
  std::vector<std::thread> clients;
  for (int i = 0; i < kClients; ++i)
    clients.emplace_back([&, i] {
      json body = {
          {"prompt", "client " + std::to_string(i)}, {"max_tokens", 6}, {"ignore_eos", true}};
      if (i % 2 == 0) body["stream"] = true;
      auto res = server_->client().Post("/v1/completions", body.dump(), "application/json");
      if (!res || res->status != 200) {
        ADD_FAILURE() << "client " << i << ": "
                      << (res ? res->body : httplib::to_string(res.error()));
        return;
      }
      if (i % 2 == 0) {
        if (res->body.ends_with("data: [DONE]\n\n")) ++ok;
      } else if (json::parse(res->body)["usage"]["completion_tokens"] == 6) {
        ++ok;
      }
    });
  for (std::thread& t : clients) t.join();
  EXPECT_EQ(ok.load(), kClients);
  EXPECT_TRUE(server_->idle_and_empty());
}

// Slowloris: clients that send part of a request and go quiet are dropped
// after the read timeout, and others are served meanwhile.
TEST(ServerLimits, PartialRequestsTimeOutWithoutBlockingOthers) {
  ServerOptions o;
  o.read_timeout_seconds = 1;
  RunningServer server(o);
  SocketClient slow(server.port());
  slow.send("POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Len");
  SocketClient slow_body(server.port());
  slow_body.send(testing::http_post("/v1/completions", R"({"prompt": "abcdefgh"})").substr(0, 120));
  auto res = server.client(nullptr).Post(
      "/v1/completions", R"({"prompt": "meanwhile", "max_tokens": 2})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 2);
  EXPECT_TRUE(slow.closed_by_peer(5s)) << "the server kept a silent half-request open";
  EXPECT_TRUE(slow_body.closed_by_peer(5s));
  EXPECT_TRUE(server.idle_and_empty());
}

// Clients that each send a byte of a request every `interval`, from their own
// thread, until stopped or `longest` has passed (the server may never close
// them); stopped and joined however the test ends.
class Tricklers {
 public:
  Tricklers(int port, int count, std::string request, std::chrono::milliseconds interval,
            std::chrono::seconds longest)
      : request_(std::move(request)) {
    for (int i = 0; i < count; ++i) clients_.push_back(std::make_unique<SocketClient>(port));
    send_byte(0);
    thread_ = std::thread([this, interval, longest] {
      const auto until = std::chrono::steady_clock::now() + longest;
      for (std::size_t at = 1; at < request_.size() && !stop_; ++at) {
        std::this_thread::sleep_for(interval);
        if (std::chrono::steady_clock::now() > until) break;
        send_byte(at);
      }
    });
  }
  ~Tricklers() {
    stop_ = true;
    thread_.join();
  }
  std::vector<std::unique_ptr<SocketClient>>& clients() { return clients_; }

 private:
  void send_byte(std::size_t at) {
    for (auto& c : clients_)
      if (!c->has_input()) c->try_send(request_.substr(at, 1));
  }
  std::string request_;
  std::vector<std::unique_ptr<SocketClient>> clients_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

// Clients that send a header byte every 300 ms (never silent for the read
// timeout) take no HTTP thread while their headers come in: with 2 threads
// and 24 of them, a request is answered at once. At the header deadline,
// counted from their first byte, they get 408 and are closed.
TEST(ServerLimits, TricklingHeadersTakeNoThreadAndEndAtTheHeaderDeadline) {
  ServerOptions o;
  o.max_connections = 2;
  o.read_timeout_seconds = 2;
  o.header_timeout_seconds = 4;
  RunningServer server(o);
  const auto start = std::chrono::steady_clock::now();
  Tricklers slow(
      server.port(), 24,
      "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Pad: " + std::string(200, 'a'), 300ms,
      15s);
  std::this_thread::sleep_for(500ms);
  httplib::Client client = server.client(nullptr);
  client.set_read_timeout(10, 0);
  auto res = client.Post("/v1/completions", R"({"prompt": "meanwhile", "max_tokens": 2})",
                         "application/json");
  const auto answered = std::chrono::steady_clock::now();
  ASSERT_TRUE(res) << "no answer while clients trickled their headers";
  EXPECT_EQ(res->status, 200);
  EXPECT_LT(answered - start, 4s) << "answered only once trickling clients were dropped";

  const std::string first = slow.clients().front()->read_until(" 408 ", 15s);
  const auto first_closed = std::chrono::steady_clock::now();
  EXPECT_NE(first.find(" 408 "), std::string::npos) << first;
  EXPECT_GE(first_closed - start, 4s) << "closed before the header deadline";
  for (auto& c : slow.clients())
    EXPECT_TRUE(c->closed_by_peer(std::chrono::duration_cast<std::chrono::milliseconds>(
        start + 12s - std::chrono::steady_clock::now())))
        << "a client still sending its headers after the header deadline was kept";
  EXPECT_TRUE(server.idle_and_empty());
}

// A body sent a byte every 300 ms is cut at the body deadline (400, closed).
TEST(ServerLimits, TricklingBodiesEndAtTheBodyDeadline) {
  ServerOptions o;
  o.max_connections = 4;
  o.read_timeout_seconds = 2;
  o.body_timeout_seconds = 2;
  RunningServer server(o);
  const std::string body = R"({"prompt": ")" + std::string(100, 'a') + R"("})";
  const std::string request = testing::http_post("/v1/completions", body);
  const std::size_t headers_end = request.find("\r\n\r\n") + 4;
  SocketClient slow_client(server.port());
  slow_client.send(request.substr(0, headers_end));
  const auto start = std::chrono::steady_clock::now();
  std::atomic<bool> stop{false};
  std::thread trickle([&] {
    for (std::size_t at = headers_end; at < request.size() && !stop; ++at) {
      std::this_thread::sleep_for(300ms);
      if (slow_client.has_input() || !slow_client.try_send(request.substr(at, 1))) break;
    }
  });
  const std::string got = slow_client.read_until(" 400 ", 15s);
  const auto cut = std::chrono::steady_clock::now();
  stop = true;
  trickle.join();
  EXPECT_NE(got.find(" 400 "), std::string::npos) << got;
  EXPECT_GE(cut - start, 2s) << "cut before the body deadline";
  EXPECT_LT(cut - start, 10s);
  EXPECT_TRUE(slow_client.closed_by_peer(5s));
  EXPECT_TRUE(server.idle_and_empty());
}

// Resident memory of this process, which the server runs in, in MiB.
double resident_mib() {
  std::ifstream statm("/proc/self/statm");
  long size_pages = 0, resident_pages = 0;
  statm >> size_pages >> resident_pages;
  return double(resident_pages) * double(sysconf(_SC_PAGESIZE)) / double(1 << 20);
}

// A request of about `bytes` that the server takes, whose DOM is many times
// its size: arrays nested 48 deep (50 levels with the body's), side by side.
std::string nested_padding_body(std::size_t bytes) {
  const std::string nest = std::string(48, '[') + std::string(48, ']');
  std::string body = R"({"prompt": "x", "max_tokens": 1, "padding": [)" + nest;
  while (body.size() + nest.size() + 3 < bytes) body += "," + nest;
  return body + "]}";
}

// Large bodies leave no memory behind: resident memory after many is what it
// was after the first few. (glibc keeps each malloc arena at its peak, and
// the HTTP threads take turns: each large request grew another arena.)
TEST(ServerLimits, LargeBodiesDoNotGrowResidentMemory) {
  if (core::kAddressSanitizer)
    GTEST_SKIP() << "ASan's allocator holds freed memory in its quarantine by design";
  ServerOptions o;
  o.max_body_bytes = 512 << 10;
  RunningServer server(o);
  const std::string nested = nested_padding_body(o.max_body_bytes - 1024);
  const std::string long_prompt =
      json{{"prompt", std::string(o.max_body_bytes - 1024, 'a')}, {"max_tokens", 1}}.dump();
  httplib::Client client = server.client(nullptr);
  const auto send = [&](int count) {
    for (int i = 0; i < count; ++i) {
      const bool even = i % 2 == 0;
      auto res = client.Post("/v1/completions", even ? nested : long_prompt, "application/json");
      ASSERT_TRUE(res);
      ASSERT_EQ(res->status, even ? 200 : 413) << res->body.substr(0, 200);
    }
  };
  // Growth over what the server holds before any request (its K/V pool is
  // resident from the start: KVCacheConfig::prefault_pages).
  const double at_start = resident_mib();
  send(10);
  const double after_first = resident_mib() - at_start;
  send(200);
  const double after_all = resident_mib() - at_start;
  EXPECT_LE(after_all, after_first * 1.1 + 16)
      << "MiB grown after 10 large requests: " << after_first << "; after 210: " << after_all;
  EXPECT_TRUE(server.idle_and_empty());
}

// A non-streamed response that takes longer than a keep-alive interval goes
// out chunked, white space before its JSON: a client that leaves meanwhile is
// noticed and its request aborted; one that stays gets the whole object.
TEST(ServerLimits, LongWholeResponsesKeepAliveAndAbortWhenTheClientLeaves) {
  ServerOptions o;
  o.keep_alive_ms = 20;
  // A long context: requests long enough to outlast keep-alives on any build.
  RunningServer server(o, 128, 65536);
  auto res = server.client(nullptr).Post(
      "/v1/completions", R"({"prompt": "x", "max_tokens": 1000, "ignore_eos": true})",
      "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  ASSERT_FALSE(res->body.empty());
  EXPECT_EQ(res->body.front(), ' ')
      << "1000 tokens came within one keep-alive: not the chunked path";
  EXPECT_EQ(json::parse(res->body)["usage"]["completion_tokens"], 1000) << res->body.substr(0, 200);

  const double before = client_aborts(server);
  SocketClient leaver(server.port());
  // 60000 tokens take many seconds even on a fast build; the client's
  // leaving is noticed within a few keep-alives.
  leaver.send(testing::http_post("/v1/completions",
                                 R"({"prompt": "go", "max_tokens": 60000, "ignore_eos": true})"));
  // The headers come after one keep-alive interval, while the request runs.
  ASSERT_NE(leaver.read_until("\r\n\r\n", 30s).find(" 200 "), std::string::npos);
  EXPECT_GT(server.server().worker().in_flight(), 0);
  leaver.close();
  EXPECT_TRUE(server.idle_and_empty()) << "the request kept running after its client left";
  EXPECT_EQ(client_aborts(server), before + 1);
}

// The same for a client that accepts gzip (the openai client does): the
// keep-alive spaces reach it as they are written instead of waiting in a
// compressor, so its leaving is noticed too.
TEST(ServerLimits, LongWholeResponsesAreNotCompressedSoALeavingClientIsNoticed) {
  ServerOptions o;
  o.keep_alive_ms = 20;
  RunningServer server(o, 128, 65536);
  const double before = client_aborts(server);
  SocketClient leaver(server.port());
  std::string request = testing::http_post(
      "/v1/completions", R"({"prompt": "go", "max_tokens": 60000, "ignore_eos": true})");
  request.insert(request.find("\r\n") + 2, "Accept-Encoding: gzip, deflate, br\r\n");
  leaver.send(request);
  const std::string head = leaver.read_until("\r\n\r\n", 30s);
  ASSERT_NE(head.find(" 200 "), std::string::npos) << head;
  EXPECT_EQ(head.find("Content-Encoding"), std::string::npos) << head;
  // A chunk of one keep-alive space.
  EXPECT_NE(leaver.read_until("1\r\n \r\n", 10s).find("1\r\n \r\n"), std::string::npos);
  EXPECT_GT(server.server().worker().in_flight(), 0);
  leaver.close();
  EXPECT_TRUE(server.idle_and_empty()) << "the request kept running after its client left";
  EXPECT_EQ(client_aborts(server), before + 1);
}

// The tiny model, except that a forward waits while the test holds it (for
// at most kLongest): an engine step as long as a test wants, without a big model.
class HoldableModel final : public Model {
 public:
  static constexpr auto kLongest = 5s;
  explicit HoldableModel(std::shared_ptr<Model> inner) : inner_(std::move(inner)) {}
  const ModelSpec& spec() const override { return inner_->spec(); }
  void attach_cache(PagedKVCache& cache) override { inner_->attach_cache(cache); }
  void forward(const ForwardBatch& batch, PagedKVCache& cache, std::span<float> logits) override {
    {
      std::unique_lock lock(mutex_);
      entered_ = true;
      cv_.notify_all();
      cv_.wait_for(lock, kLongest, [this] { return !held_; });
    }
    inner_->forward(batch, cache, logits);
  }
  void hold() {
    const std::lock_guard lock(mutex_);
    held_ = true;
  }
  void release() {
    {
      const std::lock_guard lock(mutex_);
      held_ = false;
    }
    cv_.notify_all();
  }
  bool wait_until_a_step_runs(std::chrono::seconds timeout) {
    std::unique_lock lock(mutex_);
    return cv_.wait_for(lock, timeout, [this] { return entered_; });
  }

 private:
  std::shared_ptr<Model> inner_;
  std::mutex mutex_;
  std::condition_variable cv_;
  bool held_ = false, entered_ = false;
};

// /health and /metrics read what the engine thread published after its last
// step: they answer while a step runs (here held for up to 5 s, as a long
// prefill would), not when it ends.
TEST(ServerLiveness, HealthAndMetricsAnswerWhileAStepRuns) {
  const LlamaConfig c = llama_preset("tiny");
  auto model = std::make_shared<HoldableModel>(make_llama_model(c));
  EngineConfig ec;
  ec.model = model;
  ec.kv_memory_bytes = 4 << 20;
  ServerOptions o;
  o.port = 0;
  RunningServer server(
      std::make_unique<HttpServer>(ec, make_byte_codec(c.vocab_size, c.eos_token_id), o));
  model->hold();
  std::thread request([&] {
    auto res = server.client(nullptr).Post(
        "/v1/completions", R"({"prompt": "a long prefill", "max_tokens": 2})", "application/json");
    EXPECT_TRUE(res && res->status == 200);
  });
  const bool step_runs = model->wait_until_a_step_runs(30s);
  auto timed_get = [&](const char* path) {
    const auto start = std::chrono::steady_clock::now();
    auto res = server.client(nullptr).Get(path);
    const auto took = std::chrono::steady_clock::now() - start;
    EXPECT_TRUE(res && res->status == 200) << path;
    EXPECT_LT(took, 1s) << path << " waited for the engine step";
    return res ? res->body : "";
  };
  const std::string metrics = timed_get("/metrics");
  timed_get("/health");
  model->release();
  request.join();
  EXPECT_TRUE(step_runs);
  EXPECT_NE(metrics.find("\npagedattn_requests_in_flight 1\n"), std::string::npos) << metrics;
  EXPECT_TRUE(server.idle_and_empty());
}

TEST(ServerLimits, AFullQueueIs429) {
  ServerOptions o;
  o.max_queued_requests = 1;
  RunningServer server(o);
  // One long request holds the only slot.
  SocketClient hold(server.port());
  hold.send(testing::http_post(
      "/v1/completions",
      R"({"prompt": "x", "max_tokens": 1500, "stream": true, "ignore_eos": true})"));
  ASSERT_NE(hold.read_until("data: ", 30s).find("data: "), std::string::npos);
  auto res =
      server.client(nullptr).Post("/v1/completions", R"({"prompt": "y"})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 429);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "rate_limit_error");
  hold.close();
  EXPECT_TRUE(server.idle_and_empty());
}

TEST(ServerLimits, ShutdownLetsInFlightStreamsFinish) {
  auto server = std::make_unique<RunningServer>();
  SocketClient s(server->port());
  s.send(testing::http_post("/v1/completions",
                            R"({"prompt": "x", "max_tokens": 40, "stream": true})"));
  ASSERT_NE(s.read_until("data: ", 30s).find("data: "), std::string::npos);
  server.reset();  // shutdown(): drains, then stops
  EXPECT_NE(s.read_until("data: [DONE]", 5s).find("data: [DONE]"), std::string::npos);
}

}  // namespace
}  // namespace pagedattn::serve

namespace pagedattn::serve {
namespace {

// The value of a /metrics line `name value`.
double metric(const std::string& body, const std::string& name) {
  const std::size_t at = body.find("\n" + name + " ");
  EXPECT_NE(at, std::string::npos) << name;
  return at == std::string::npos ? -1.0 : std::stod(body.substr(at + name.size() + 2));
}

// The serve CLI's prefix-caching flags reach the engine, and a request's
// cache_salt keeps its cached pages from other tenants.
TEST(ServeCli, PrefixCachingFlagsAndCacheSalt) {
  const char* argv[] = {"pagedattn",
                        "serve",
                        "--model",
                        "tiny",
                        "--port",
                        "0",
                        "--kv-memory-mib",
                        "4",
                        "--enable-prefix-caching",
                        "--host-kv-memory-mib",
                        "2"};
  const ServeOptions o = parse_serve_options(std::size(argv), const_cast<char**>(argv), 2);
  EXPECT_TRUE(o.enable_prefix_caching);
  EXPECT_EQ(o.host_kv_memory_mib, 2.0);
  RunningServer server(make_server(o));
  EXPECT_TRUE(server.server().worker().engine().config().enable_prefix_caching);
  EXPECT_FALSE(server.server().worker().engine().config().bf16_products);
  EXPECT_GT(server.server().worker().stats().num_host_pages, 0);
  const std::string prompt(100, 'p');  // 6 full pages of 16 byte tokens
  auto hits_after = [&](const char* salt) {
    json body = {{"prompt", prompt}, {"max_tokens", 2}};
    if (salt != nullptr) body["cache_salt"] = salt;
    auto res = server.client(nullptr).Post("/v1/completions", body.dump(), "application/json");
    EXPECT_TRUE(res);
    if (res) {
      EXPECT_EQ(res->status, 200) << res->body;
    }
    auto metrics = server.client(nullptr).Get("/metrics");
    return metric(metrics ? metrics->body : "", "pagedattn_prefix_cache_hits_total");
  };
  EXPECT_EQ(hits_after("tenant-a"), 0);
  EXPECT_EQ(hits_after("tenant-b"), 0);  // the same prompt, another tenant
  EXPECT_EQ(hits_after(nullptr), 0);     // no salt is a tenant of its own
  EXPECT_EQ(hits_after("tenant-a"), 96);
  auto metrics = server.client(nullptr).Get("/metrics");
  ASSERT_TRUE(metrics);
  for (const char* name : {"pagedattn_prefix_cache_hit_rate ", "pagedattn_prefix_cache_pages ",
                           "pagedattn_swap_outs_total ", "pagedattn_host_kv_pages_free "})
    EXPECT_NE(metrics->body.find(name), std::string::npos) << name;
  const char* off[] = {"pagedattn",
                       "serve",
                       "--model",
                       "tiny",
                       "--enable-prefix-caching",
                       "--no-enable-prefix-caching"};
  EXPECT_FALSE(
      parse_serve_options(std::size(off), const_cast<char**>(off), 2).enable_prefix_caching);
}

TEST(ServeCli, Bf16ProductsFlagReachesTheEngine) {
  const char* argv[] = {"pagedattn", "serve",           "--model", "tiny",           "--port",
                        "0",         "--kv-memory-mib", "4",       "--bf16-products"};
  const ServeOptions o = parse_serve_options(std::size(argv), const_cast<char**>(argv), 2);
  EXPECT_TRUE(o.bf16_products);
  RunningServer server(make_server(o));
  EXPECT_TRUE(server.server().worker().engine().config().bf16_products);
}

}  // namespace
}  // namespace pagedattn::serve
