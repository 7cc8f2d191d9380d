// `pagedattn serve`'s HTTP side: OpenAI's completions, chat completions and
// models endpoints, /health and /metrics, over cpp-httplib. Handlers parse
// and check the request, hand it to the EngineWorker, and write what its
// channel brings (whole, or as Server-Sent Events).
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "engine_worker.h"
#include "server_metrics.h"
#include "text_codec.h"

namespace httplib {
class Server;
}

namespace pagedattn::serve {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;                         // 0: any free port (see bound_port)
  std::string api_key;                     // "": no authentication
  std::string model_name = "pagedattn";    // what /v1/models lists and responses name
  std::int32_t max_connections = 128;      // HTTP threads: requests served at once
  std::int32_t max_queued_requests = 256;  // requests held (waiting + running); more: 429
  std::size_t max_body_bytes = 8u << 20;   // larger bodies: 413
  int read_timeout_seconds = 10;           // a client silent this long mid-request is dropped
  // Deadlines on a request's arrival, however steadily the client sends:
  // its headers from their first byte, its body from the headers' end.
  int header_timeout_seconds = 10;
  int body_timeout_seconds = 30;
  int write_timeout_seconds = 10;
  int shutdown_grace_seconds = 30;  // in-flight requests may finish for this long
  // A client that left is noticed when a write to it fails: a stream or a
  // non-streamed response still being made writes a keep-alive this often.
  int keep_alive_ms = 1000;
};

// True when `given` equals `secret`, in a time that depends on the lengths
// only: no exit at the first differing byte nor on a length difference, so a
// client cannot find the API key byte by byte by timing its 401s.
bool secret_matches(std::string_view given, std::string_view secret);

// Caps glibc's malloc arenas, which keep what they grew to (see
// http_server.cc); an operator's MALLOC_ARENA_MAX is left to rule.
// Process-wide, and too late once glibc has fixed its limit (when it first
// needs more than a few arenas): the serve command calls it before loading
// the model, whose threads may make arenas; HttpServer's constructor calls
// it too.
void limit_malloc_arenas();

class HttpServer {
 public:
  // `remote`: where prompts are prefilled (serve --disaggregate); null: here.
  HttpServer(EngineConfig engine, std::unique_ptr<TextCodec> codec, ServerOptions options,
             std::unique_ptr<RemotePrefill> remote = nullptr);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds the socket; Error when the address cannot be bound.
  void bind();
  int bound_port() const { return port_; }
  // Serves until shutdown(); call bind() first.
  void listen();
  // Graceful: new requests get 503, in-flight ones finish (aborted after
  // the grace period), then the listener stops and listen() returns.
  void shutdown();

  const EngineWorker& worker() const { return *worker_; }
  std::string metrics_text() const;

 private:
  void install_routes();
  void install_limits();
  int live_streams() const { return live_streams_.load(); }

  ServerOptions options_;
  std::unique_ptr<TextCodec> codec_;
  ServerMetrics metrics_;
  std::unique_ptr<EngineWorker> worker_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = -1;
  int listen_fd_ = -1;
  std::atomic<bool> draining_{false};
  // listen() runs (set under listen_mutex_ unless shutdown came first).
  std::mutex listen_mutex_;
  bool shutdown_requested_ = false;  // under listen_mutex_
  std::atomic<bool> listening_{false};
  std::atomic<int> live_streams_{0};  // SSE responses not yet released
};

}  // namespace pagedattn::serve
