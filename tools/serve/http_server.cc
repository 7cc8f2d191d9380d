#include "http_server.h"

#include <httplib.h>
#include <sys/socket.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <charconv>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <thread>

#include <nlohmann/json.hpp>

#include "api_error.h"
#include "gated_server.h"
#include "generation_job.h"
#include "openai_request.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {
namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kStreamPoll{100};
// A body made over time must reach the client as it is written: a client
// that left is noticed only when a write to it fails. httplib compresses an
// "application/json" body (that exact type) for a client that accepts gzip
// or br, and its compressor keeps the keep-alive spaces until it has a block
// to emit, so nothing is written and the request runs on. This type is JSON
// too, and httplib leaves it alone (as it does text/event-stream).
constexpr const char* kUncompressedJson = "application/json; charset=utf-8";

// glibc gives threads their own malloc arenas (several per core) and keeps
// what each grew to: a large request parsed on one HTTP thread leaves its
// arena large, and the next on another thread grows another, so resident
// memory climbs to the arenas' count times a large request's peak. A few
// shared arenas bound that product; the trim below hands the peak back.
constexpr int kMallocArenas = 4;
// Bodies at least this large make a DOM and a prompt many times their size:
// once such a request is parsed, the memory it freed goes back to the system.
constexpr std::size_t kReturnMemoryAfterBodyBytes = 256 << 10;

// Hands the memory freed in every arena back to the system (free keeps it for
// reuse; the pages of a large request's DOM would stay resident).
void return_freed_memory() {
#ifdef __GLIBC__
  malloc_trim(0);
#endif
}

// Returns the memory a large request's parsing freed when the handler ends,
// however it ends.
class ReturnMemoryAfterLargeBody {
 public:
  explicit ReturnMemoryAfterLargeBody(std::size_t body_bytes)
      : large_(body_bytes >= kReturnMemoryAfterBodyBytes) {}
  ~ReturnMemoryAfterLargeBody() {
    if (large_) return_freed_memory();
  }
  ReturnMemoryAfterLargeBody(const ReturnMemoryAfterLargeBody&) = delete;
  ReturnMemoryAfterLargeBody& operator=(const ReturnMemoryAfterLargeBody&) = delete;

 private:
  bool large_;
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status();
  res.set_content(e.to_json(), "application/json");
}

RequestLimits limits_of(const Engine& engine) {
  const ModelSpec& spec = engine.config().model->spec();
  return {.vocab_size = spec.vocab_size,
          .max_position = spec.max_position,
          .num_pages = engine.cache().config().num_pages,
          .page_size = engine.config().page_size,
          .max_n = std::min(256, engine.config().max_num_seqs)};
}

bool authorized(const httplib::Request& req, const std::string& key) {
  return key.empty() || secret_matches(req.get_header_value("Authorization"), "Bearer " + key);
}

// httplib reads Content-Length with strtoull: "-5" wraps to a huge length and
// 20 digits saturate, and either makes it wait a read timeout for a body that
// never comes before its 413. One plain decimal that fits 64 bits is trusted.
// Returns what is wrong, or "" when nothing is.
std::string content_length_problem(const httplib::Request& req) {
  const std::size_t count = req.get_header_value_count("Content-Length");
  if (count == 0) return "";
  // Two lengths: a proxy and this server could delimit the body differently.
  if (count > 1) return "the request has " + std::to_string(count) + " Content-Length headers";
  const std::string value = req.get_header_value("Content-Length");
  const char* end = value.data() + value.size();
  std::uint64_t length = 0;
  const auto [stop, error] = std::from_chars(value.data(), end, length);
  if (!value.empty() && error == std::errc() && stop == end) return "";
  constexpr std::size_t kShown = 40;  // the value is the client's: echo a bounded part
  const std::string shown = value.size() > kShown ? value.substr(0, kShown) + "..." : value;
  return "Content-Length = '" + shown + "' must be a decimal integer in [0, 2^64)";
}

// Answers `e` and closes the connection: the body after the headers (if any)
// cannot be delimited, so it must not be read as the next request. httplib
// closes a connection whose content provider fails, so the provider writes
// the whole body and then reports a failure.
void refuse_and_close(httplib::Response& res, const ApiError& e) {
  const auto body = std::make_shared<const std::string>(e.to_json());
  res.status = e.status();
  res.set_header("Connection", "close");
  res.set_content_provider(body->size(), "application/json",
                           [body](std::size_t offset, std::size_t, httplib::DataSink& sink) {
                             sink.write(body->data() + offset, body->size() - offset);
                             return false;
                           });
}

}  // namespace

void limit_malloc_arenas() {
#ifdef __GLIBC__
  if (std::getenv("MALLOC_ARENA_MAX") == nullptr) mallopt(M_ARENA_MAX, kMallocArenas);
#endif
}

bool secret_matches(std::string_view given, std::string_view secret) {
  // Every byte of `given` is compared, against the secret repeated as needed,
  // and the length difference is folded into the same accumulator.
  unsigned char differ = given.size() == secret.size() ? 0 : 1;
  std::size_t j = 0;
  for (const char c : given) {
    const char s = secret.empty() ? '\0' : secret[j];
    differ |= static_cast<unsigned char>(c ^ s);
    j = j + 1 == secret.size() ? 0 : j + 1;
  }
  return differ == 0;
}

HttpServer::HttpServer(EngineConfig engine, std::unique_ptr<TextCodec> codec, ServerOptions options,
                       std::unique_ptr<RemotePrefill> remote)
    : options_(std::move(options)),
      codec_(std::move(codec)),
      http_(std::make_unique<GatedServer>(
          GateOptions{.threads = std::size_t(std::max(1, options_.max_connections)),
                      .header_timeout = std::chrono::seconds(options_.header_timeout_seconds),
                      .body_timeout = std::chrono::seconds(options_.body_timeout_seconds)})) {
  require(codec_ != nullptr, "serve: no text codec");
  require(options_.max_connections >= 1, "serve: --max-connections = ", options_.max_connections,
          " must be >= 1");
  require(options_.header_timeout_seconds >= 1,
          "serve: --header-timeout = ", options_.header_timeout_seconds, " must be >= 1");
  require(options_.body_timeout_seconds >= 1,
          "serve: --body-timeout = ", options_.body_timeout_seconds, " must be >= 1");
  require(options_.max_queued_requests >= 1,
          "serve: --max-queued-requests = ", options_.max_queued_requests, " must be >= 1");
  limit_malloc_arenas();
  worker_ = std::make_unique<EngineWorker>(std::move(engine), options_.max_queued_requests,
                                           metrics_, std::move(remote));
  install_limits();
  install_routes();
}

HttpServer::~HttpServer() {
  http_->stop();
  worker_.reset();  // aborts what is left, joins the engine thread
}

void HttpServer::install_limits() {
  // The HTTP threads (--max-connections) and the header and body deadlines
  // are GatedServer's.
  http_->set_payload_max_length(options_.max_body_bytes);
  http_->set_read_timeout(options_.read_timeout_seconds, 0);
  // An idle keep-alive connection waits in GatedServer's waiting room (no
  // thread), but no longer than a read.
  http_->set_keep_alive_timeout(std::min(5, options_.read_timeout_seconds));
  http_->set_write_timeout(options_.write_timeout_seconds, 0);
  http_->set_tcp_nodelay(true);  // SSE chunks are small: send each at once
  // Keep the listening socket: bind() widens its accept backlog.
  http_->set_socket_options([this](int fd) {
    httplib::default_socket_options(fd);
    listen_fd_ = fd;
  });
  // Errors httplib makes itself (no route, body too large, bad request line)
  // get OpenAI's JSON shape too.
  const httplib::Server::HandlerWithResponse on_error = [](const httplib::Request& req,
                                                           httplib::Response& res) {
    // Ours already (refuse_and_close's body comes from its content provider).
    if (!res.body.empty() || res.content_provider_)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string what = res.status == 404 ? "no route " + req.method + " " + req.path
                             : res.status == 413
                                 ? "the request body exceeds the limit (--max-body-bytes)"
                                 : "the request could not be served";
    send_error(res, ApiError(res.status, what));
    return httplib::Server::HandlerResponse::Handled;
  };
  http_->set_error_handler(on_error);
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string what = "internal error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, what));
      });
  // Runs after the headers, before httplib reads the body.
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (const std::string problem = content_length_problem(req); !problem.empty()) {
      refuse_and_close(res, ApiError(400, problem));
      return httplib::Server::HandlerResponse::Handled;
    }
    if (req.path.starts_with("/v1/") && !authorized(req, options_.api_key)) {
      send_error(res, ApiError(401, "missing or wrong API key (Authorization: Bearer KEY)", "",
                               "invalid_api_key"));
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_logger([this](const httplib::Request&, const httplib::Response& res) {
    metrics_.count_response(res.status);
  });
}

void HttpServer::install_routes() {
  auto generate = [this](Endpoint endpoint) {
    return [this, endpoint](const httplib::Request& req, httplib::Response& res) {
      const ReturnMemoryAfterLargeBody return_memory(req.body.size());
      try {
        const auto start = Clock::now();
        GenerationRequest g =
            parse_generation_request(req.body, endpoint, *codec_, limits_of(worker_->engine()));
        SamplingParams params = g.params;
        if (!params.ignore_eos)
          for (std::int32_t id : codec_->stop_token_ids()) params.stop_token_ids.push_back(id);
        EngineWorker::Ticket ticket = worker_->submit(g.prompt_ids, params);
        const bool stream = g.stream;
        auto job = std::make_shared<GenerationJob>(std::move(g), std::move(ticket), *codec_,
                                                   options_.model_name, *worker_, metrics_);
        metrics_.add_http_seconds(std::chrono::duration<double>(Clock::now() - start).count());
        const std::chrono::milliseconds keep_alive(options_.keep_alive_ms);
        if (!stream) {
          // Made within one keep-alive interval: answered whole, with its status.
          if (job->wait_finished(keep_alive)) {
            res.set_content(job->whole_body(), "application/json");
            return;
          }
          // Longer: sent chunked, spaces before the JSON (which allows leading
          // white space) now and then, so that a client that left is noticed
          // (the write fails) and its request aborted. The status is 200 by
          // then: an engine failure becomes the body's OpenAI error object.
          ++live_streams_;
          res.set_chunked_content_provider(
              kUncompressedJson,
              [job, keep_alive](std::size_t, httplib::DataSink& sink) {
                if (!job->wait_finished(keep_alive)) return sink.write(" ", 1);
                std::string body;
                try {
                  body = job->whole_body();
                } catch (const ApiError& e) {
                  body = e.to_json();
                }
                if (!sink.write(body.data(), body.size())) return false;
                sink.done();
                return true;
              },
              [this, job](bool success) {
                job->release(success);
                --live_streams_;
              });
          return;
        }
        auto last_write = std::make_shared<Clock::time_point>(Clock::now());
        res.set_header("Cache-Control", "no-cache");
        ++live_streams_;
        res.set_chunked_content_provider(
            "text/event-stream",
            [job, last_write, keep_alive](std::size_t, httplib::DataSink& sink) {
              std::string events = job->next_events(std::min(kStreamPoll, keep_alive));
              // A comment line now and then: a client that left is noticed
              // (the write fails) even while the request makes no tokens.
              if (events.empty() && Clock::now() - *last_write > keep_alive)
                events = ": keep-alive\n\n";
              if (!events.empty()) {
                if (!sink.write(events.data(), events.size())) return false;
                *last_write = Clock::now();
              }
              if (job->done()) sink.done();
              return true;
            },
            [this, job](bool success) {
              job->release(success);
              --live_streams_;
            });
      } catch (const ApiError& e) {
        send_error(res, e);
      } catch (const InvalidArgument& e) {
        send_error(res, ApiError(400, e.what()));
      }
    };
  };
  http_->Post("/v1/completions", generate(Endpoint::kCompletions));
  http_->Post("/v1/chat/completions", generate(Endpoint::kChat));
  http_->Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const nlohmann::json model = {
        {"id", options_.model_name},
        {"object", "model"},
        {"created", std::int64_t(std::time(nullptr))},
        {"owned_by", "pagedattn"},
        {"max_model_len", worker_->engine().config().model->spec().max_position}};
    res.set_content(nlohmann::json{{"object", "list"}, {"data", {model}}}.dump(),
                    "application/json");
  });
  http_->Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    const bool up = !draining_;
    res.status = up ? 200 : 503;
    res.set_content(up ? "{\"status\":\"ok\"}" : "{\"status\":\"shutting down\"}",
                    "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_text(), "text/plain; version=0.0.4");
  });
}

// Reads only the worker's snapshot and atomics: answers while a step runs.
std::string HttpServer::metrics_text() const {
  const auto snapshot = worker_->snapshot();
  return metrics_.render(snapshot->engine, snapshot->thread, worker_->in_flight());
}

void HttpServer::bind() {
  port_ = options_.port == 0
              ? http_->bind_to_any_port(options_.host)
              : (http_->bind_to_port(options_.host, options_.port) ? options_.port : -1);
  require(port_ > 0, "serve: cannot listen on ", options_.host, ":", options_.port);
  // Debian's libcpp-httplib is built with an accept backlog of 5: a burst of
  // clients would overflow it and see resets. listen() again takes a new one.
  if (listen_fd_ >= 0) ::listen(listen_fd_, std::max(64, options_.max_connections));
}

void HttpServer::listen() {
  {
    std::lock_guard lock(listen_mutex_);
    if (shutdown_requested_) return;
    listening_ = true;
  }
  http_->listen_after_bind();
  listening_ = false;
}

void HttpServer::shutdown() {
  draining_ = true;
  worker_->stop_accepting();
  worker_->drain(std::chrono::seconds(options_.shutdown_grace_seconds));
  // Streams of aborted requests write their last events before the
  // listener stops (httplib cuts streams off once it stops).
  const auto deadline = Clock::now() + std::chrono::seconds(2);
  while (live_streams() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  // httplib's stop() does nothing before its listener runs, which then never
  // returns: a listen() that has not begun does not start, one that has is
  // waited for until it runs.
  {
    std::lock_guard lock(listen_mutex_);
    shutdown_requested_ = true;
  }
  while (listening_ && !http_->is_running())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  http_->stop();
}

}  // namespace pagedattn::serve
