// An httplib::Server that clients which dribble their requests cannot starve.
// httplib gives each connection a thread for its whole life and only drops a
// client that goes silent, so clients sending a header byte now and then hold
// every thread. Here a connection waits for its complete request headers in
// one poll thread (a "waiting room") that holds no HTTP thread, under a
// deadline counted from the request's first byte; only then does an HTTP
// thread serve it, and its body must arrive within a deadline too. At most
// half of the HTTP threads may wait on clients' bytes at once, so the others
// always serve requests whose bytes are in.
#pragma once

#include <httplib.h>

#include <chrono>
#include <cstddef>
#include <memory>

namespace pagedattn::serve {

struct GateOptions {
  std::size_t threads = 128;                // HTTP threads serving admitted requests
  std::chrono::seconds header_timeout{10};  // from a request's first byte to its blank line
  std::chrono::seconds body_timeout{30};    // from the headers to the body's last byte
};

class ConnectionGate;
struct Connection;
namespace gating {
struct RoomTimeouts;
}

class GatedServer : public httplib::Server {
 public:
  explicit GatedServer(GateOptions options);
  ~GatedServer() override;
  GatedServer(const GatedServer&) = delete;
  GatedServer& operator=(const GatedServer&) = delete;

 private:
  // httplib calls this on its accept thread for each new connection (through
  // the task queue the constructor installs, which runs it at once): the
  // socket goes to the waiting room and the accept thread goes back to
  // accepting. Private in httplib but virtual (its SSLServer overrides it
  // too); the request itself is httplib's protected process_request, which
  // reads and answers one request from any Stream: here one that serves the
  // bytes the waiting room read, then the socket under the body's deadline.
  bool process_and_close_socket(socket_t sock) override;
  // Serves the request whose headers are in; back to the waiting room for
  // the next one (keep-alive) or closed.
  void serve_request(Connection connection);
  // httplib's keep-alive and read timeouts (set after construction) and ours.
  gating::RoomTimeouts room_timeouts() const;

  GateOptions options_;
  std::unique_ptr<ConnectionGate> gate_;
};

}  // namespace pagedattn::serve
