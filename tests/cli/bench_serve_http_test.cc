// bench-serve --url end to end: the pagedattn binary streams a trace to a fake
// OpenAI-compatible server that runs in this process on 127.0.0.1 (a free
// port), and its table and --json must count what the server did. Plus the
// SSE parser on arbitrary splits.
#include <httplib.h>
#include <sys/wait.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "bench_serve_sse.h"

namespace pagedattn::tools {
namespace {

using Json = nlohmann::json;

// How the fake server misbehaves.
struct Behaviour {
  int fail_every = 0;      // every k-th completion answers HTTP 500
  bool send_usage = true;  // the final usage chunk
  int missing_tokens = 0;  // streams max_tokens - this many tokens
  int cut_after = -1;      // drops the connection after this many tokens
  int token_delay_ms = 2;
};

// What the server saw of one completion request.
struct Seen {
  int prompt_len = 0;
  int max_tokens = 0;
  std::vector<int> prompt;  // the token ids
};

class FakeOpenAiServer {
 public:
  explicit FakeOpenAiServer(Behaviour b) : b_(b) {
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"fake-model","object":"model"}]})",
                      "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      complete(req, res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    // stop() before the accept loop runs would leave it running forever.
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~FakeOpenAiServer() {
    server_.stop();
    thread_.join();
  }
  int port() const { return port_; }
  std::vector<Seen> seen() {
    std::lock_guard lock(mutex_);
    return seen_;
  }
  int peak_in_flight() const { return peak_; }

 private:
  // A valid request as bench-serve sends it, else HTTP 400 with the reason.
  void complete(const httplib::Request& req, httplib::Response& res) {
    const Json body = Json::parse(req.body, nullptr, false);
    const bool valid = body.is_object() && body.value("model", "") == "fake-model" &&
                       body.value("stream", false) && body.value("ignore_eos", false) &&
                       body["stream_options"].value("include_usage", false) &&
                       body["prompt"].is_array() && body["max_tokens"].is_number_integer() &&
                       req.get_header_value("Authorization") == "Bearer sesame";
    if (!valid) {
      res.status = 400;
      res.set_content(R"({"error":{"message":"bad request"}})", "application/json");
      return;
    }
    int number = 0;
    {
      std::lock_guard lock(mutex_);
      seen_.push_back({int(body["prompt"].size()), body["max_tokens"].get<int>(),
                       body["prompt"].get<std::vector<int>>()});
      number = int(seen_.size());
    }
    if (b_.fail_every > 0 && number % b_.fail_every == 0) {
      res.status = 500;
      res.set_content(R"({"error":{"message":"fake overload"}})", "application/json");
      return;
    }
    const int tokens = body["max_tokens"].get<int>() - b_.missing_tokens;
    peak_ = std::max(peak_.load(), ++in_flight_);
    res.set_chunked_content_provider("text/event-stream", [this, tokens](std::size_t,
                                                                         httplib::DataSink& sink) {
      auto event = [&](const Json& j) {
        const std::string e = "data: " + j.dump() + "\n\n";
        return sink.write(e.data(), e.size());
      };
      for (int i = 0; i < tokens; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(b_.token_delay_ms));
        if (i == b_.cut_after) {
          --in_flight_;
          return false;  // drops the connection mid-stream
        }
        const bool sent =
            event({{"object", "text_completion"},
                   {"choices", {{{"index", 0}, {"text", " tok"}, {"finish_reason", nullptr}}}}});
        if (!sent) {  // the client went away
          --in_flight_;
          return false;
        }
      }
      event({{"choices", {{{"index", 0}, {"text", ""}, {"finish_reason", "length"}}}}});
      if (b_.send_usage)
        event({{"choices", Json::array()},
               {"usage", {{"prompt_tokens", 1}, {"completion_tokens", tokens}}}});
      const std::string done = "data: [DONE]\n\n";
      sink.write(done.data(), done.size());
      --in_flight_;
      sink.done();
      return true;
    });
  }

  Behaviour b_;
  httplib::Server server_;
  int port_ = 0;
  std::thread thread_;
  std::mutex mutex_;
  std::vector<Seen> seen_;
  std::atomic<int> in_flight_{0}, peak_{0};
};

struct CliRun {
  int exit_code = -1;
  std::string output;  // stdout and stderr
};

CliRun run_cli(const std::string& args) {
  const std::string command = std::string(PAGEDATTN_CLI) + " bench-serve " + args + " 2>&1";
  CliRun run;
  std::FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) return run;
  char buffer[4096];
  for (std::size_t n; (n = std::fread(buffer, 1, sizeof buffer, pipe)) > 0;)
    run.output.append(buffer, n);
  const int status = pclose(pipe);
  run.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
  return run;
}

// A trace of `count` requests with prompt_len 5 + i and output_len 3 + i % 6.
std::string write_trace(const std::string& name, int count) {
  const std::string path = testing::TempDir() + name;
  std::ofstream out(path);
  for (int i = 0; i < count; ++i)
    out << Json{{"prompt_len", 5 + i}, {"output_len", 3 + i % 6}}.dump() << "\n";
  return path;
}

int trace_tokens(int count) {
  int total = 0;
  for (int i = 0; i < count; ++i) total += 3 + i % 6;
  return total;
}

Json read_json(const std::string& path) {
  std::ifstream in(path);
  return Json::parse(in, nullptr, false);
}

// `text` with every run of spaces folded to one, so that a table row can be
// matched whatever its column padding. (No std::regex: GCC 12 warns falsely
// inside it under the sanitizers, and the build is -Werror.)
std::string fold_spaces(const std::string& text) {
  std::string out;
  for (char c : text)
    if (c != ' ' || out.empty() || out.back() != ' ') out += c;
  return out;
}

std::string url_flags(const FakeOpenAiServer& s) {
  return "--url http://127.0.0.1:" + std::to_string(s.port()) + " --api-key sesame";
}

TEST(BenchServeHttp, CountsWhatTheServerStreamed) {
  FakeOpenAiServer server({.token_delay_ms = 10});
  const std::string json = testing::TempDir() + "bench_serve_http_counts.json";
  const CliRun run = run_cli(url_flags(server) + " --concurrency 4 --workload " +
                             write_trace("counts.jsonl", 12) + " --json " + json);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(fold_spaces(run.output).find("completed requests 12 of 12"), std::string::npos)
      << run.output;
  const Json doc = read_json(json);
  const Json& s = doc["summary"];
  EXPECT_EQ(s["completed_requests"], 12);
  EXPECT_EQ(s["failed_requests"], 0);
  EXPECT_EQ(s["short_outputs"], 0);
  EXPECT_EQ(s["output_tokens"], trace_tokens(12));
  EXPECT_EQ(s["output_tokens_from_usage"], true);
  EXPECT_GT(s["output_tokens_per_s"].get<double>(), 0.0);
  EXPECT_GT(s["ttft_p50_s"].get<double>(), 0.0);
  EXPECT_LE(s["ttft_p50_s"].get<double>(), s["ttft_p99_s"].get<double>());
  EXPECT_GT(s["tpot_p50_s"].get<double>(), 0.0);
  EXPECT_EQ(doc["run"]["model_name"], "fake-model");
  // The server saw each request once, with the trace's lengths.
  std::vector<Seen> seen = server.seen();
  ASSERT_EQ(seen.size(), 12u);
  std::sort(seen.begin(), seen.end(), [](Seen a, Seen b) { return a.prompt_len < b.prompt_len; });
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(seen[std::size_t(i)].prompt_len, 5 + i);
    EXPECT_EQ(seen[std::size_t(i)].max_tokens, 3 + i % 6);
  }
  EXPECT_LE(server.peak_in_flight(), 4);
  EXPECT_GE(server.peak_in_flight(), 2);  // the streams overlap
}

// --seed picks the prompts' token ids: the same seed sends the same prompts,
// another seed none of them (a server that caches prompts, as llama-server
// does, must not find the previous run's).
TEST(BenchServeHttp, TheSeedPicksThePrompts) {
  const std::string trace = write_trace("seeds.jsonl", 6);
  const auto prompts = [&](const std::string& seed) {
    FakeOpenAiServer server({.token_delay_ms = 0});
    const CliRun run = run_cli(url_flags(server) + " --concurrency 1 --workload " + trace + seed);
    EXPECT_EQ(run.exit_code, 0) << run.output;
    std::vector<std::vector<int>> out;
    for (const Seen& s : server.seen()) out.push_back(s.prompt);
    std::sort(out.begin(), out.end());
    return out;
  };
  const auto first = prompts(""), again = prompts(" --seed 1"), other = prompts(" --seed 2");
  ASSERT_EQ(first.size(), 6u);
  EXPECT_EQ(first, again);  // seed 1 is the default
  ASSERT_EQ(other.size(), 6u);
  for (const auto& p : other)
    EXPECT_EQ(std::find(first.begin(), first.end(), p), first.end()) << "a seed-1 prompt again";
}

TEST(BenchServeHttp, WithoutUsageCountsChunksAndFlagsShortOutputs) {
  FakeOpenAiServer server({.send_usage = false, .missing_tokens = 1});
  const std::string json = testing::TempDir() + "bench_serve_http_chunks.json";
  const CliRun run = run_cli(url_flags(server) + " --model-name fake-model --workload " +
                             write_trace("chunks.jsonl", 6) + " --json " + json);
  ASSERT_EQ(run.exit_code, 0) << run.output;
  EXPECT_NE(run.output.find("6 requests returned fewer tokens than max_tokens"), std::string::npos)
      << run.output;
  const Json s = read_json(json)["summary"];
  EXPECT_EQ(s["output_tokens"], trace_tokens(6) - 6);
  EXPECT_EQ(s["output_tokens_from_usage"], false);
  EXPECT_EQ(s["short_outputs"], 6);
}

TEST(BenchServeHttp, ServerErrorsAreCountedAndReported) {
  FakeOpenAiServer server({.fail_every = 3});
  const std::string json = testing::TempDir() + "bench_serve_http_errors.json";
  const CliRun run = run_cli(url_flags(server) + " --concurrency 1 --workload " +
                             write_trace("errors.jsonl", 9) + " --json " + json);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("3 x HTTP 500: fake overload"), std::string::npos) << run.output;
  const Json s = read_json(json)["summary"];
  EXPECT_EQ(s["completed_requests"], 6);
  EXPECT_EQ(s["failed_requests"], 3);
  ASSERT_EQ(s["failures"].size(), 1u);
  EXPECT_EQ(s["failures"][0]["count"], 3);
}

TEST(BenchServeHttp, RejectedRequestsNameTheServersMessage) {
  FakeOpenAiServer server({});
  // No API key: the fake server answers 400.
  const CliRun run = run_cli("--url http://127.0.0.1:" + std::to_string(server.port()) +
                             " --workload " + write_trace("rejected.jsonl", 2));
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("2 x HTTP 400: bad request"), std::string::npos) << run.output;
}

TEST(BenchServeHttp, StreamCutMidwayIsAFailureNotAHang) {
  FakeOpenAiServer server({.cut_after = 1});
  const std::string json = testing::TempDir() + "bench_serve_http_cut.json";
  const CliRun run = run_cli(url_flags(server) + " --timeout 20 --workload " +
                             write_trace("cut.jsonl", 3) + " --json " + json);
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(fold_spaces(run.output).find("failed requests 3"), std::string::npos) << run.output;
  EXPECT_EQ(read_json(json)["summary"]["completed_requests"], 0);
}

TEST(BenchServeHttp, SilentServerTimesOut) {
  FakeOpenAiServer server({.token_delay_ms = 4000});
  const auto start = std::chrono::steady_clock::now();
  const CliRun run =
      run_cli(url_flags(server) + " --timeout 1 --workload " + write_trace("silent.jsonl", 1));
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(run.exit_code, 3) << run.output;
  EXPECT_NE(run.output.find("1 x transport"), std::string::npos) << run.output;
  EXPECT_LT(seconds, 3.5);  // gave up before the first token came
}

TEST(BenchServeHttp, UnreachableUrlFailsCleanly) {
  int port = 0;
  {
    FakeOpenAiServer closed({});  // a port that was free a moment ago
    port = closed.port();
  }
  const CliRun run = run_cli("--url http://127.0.0.1:" + std::to_string(port) + " --quick");
  EXPECT_EQ(run.exit_code, 1) << run.output;
  EXPECT_NE(run.output.find("cannot reach --url = 'http://127.0.0.1:" + std::to_string(port)),
            std::string::npos)
      << run.output;
}

// Every way of cutting a stream into pieces yields the same events.
TEST(SseParser, EventsSurviveAnySplit) {
  const std::string stream =
      ": a comment\r\ndata: {\"a\":1}\r\n\r\nevent: x\ndata: line1\ndata:line2\n\n"
      "id: 3\n\ndata: [DONE]\n\n";
  const std::vector<std::string> expected = {"{\"a\":1}", "line1\nline2", "[DONE]"};
  for (std::size_t piece = 1; piece <= stream.size(); ++piece) {
    SseParser parser;
    std::vector<std::string> events;
    for (std::size_t at = 0; at < stream.size(); at += piece)
      for (std::string& e : parser.feed(std::string_view(stream).substr(at, piece)))
        events.push_back(std::move(e));
    EXPECT_EQ(events, expected) << "pieces of " << piece;
    EXPECT_FALSE(parser.pending());
  }
}

TEST(SseParser, AnUnfinishedEventIsPending) {
  SseParser parser;
  EXPECT_TRUE(parser.feed("data: {\"a\"").empty());
  EXPECT_TRUE(parser.pending());
  EXPECT_TRUE(parser.feed(":1}\n").empty());
  EXPECT_TRUE(parser.pending());
  EXPECT_EQ(parser.feed("\n"), std::vector<std::string>{"{\"a\":1}"});
  EXPECT_FALSE(parser.pending());
}

}  // namespace
}  // namespace pagedattn::tools
