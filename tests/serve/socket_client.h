// A bare TCP client for the server tests: what a misbehaving client does
// (partial requests, hanging up mid-stream) needs the socket itself.
#pragma once

#include <chrono>
#include <string>

namespace pagedattn::serve::testing {

class SocketClient {
 public:
  explicit SocketClient(int port);  // connects to 127.0.0.1:port (gtest failure if it cannot)
  ~SocketClient();
  SocketClient(const SocketClient&) = delete;
  SocketClient& operator=(const SocketClient&) = delete;

  void send(const std::string& bytes);
  // Sends what it can; false (and no test failure) once the server closed.
  bool try_send(const std::string& bytes);
  // True when the server has sent something or closed: a client that sends
  // on after that gets a reset, which can cost it the unread answer.
  bool has_input();
  // Reads until `until` appears, the peer closes, or `timeout` passes.
  std::string read_until(const std::string& until, std::chrono::milliseconds timeout);
  // True when the peer closed the connection within `timeout`.
  bool closed_by_peer(std::chrono::milliseconds timeout);
  void close();

 private:
  int fd_ = -1;
};

// A complete HTTP/1.1 POST of a JSON body.
std::string http_post(const std::string& path, const std::string& body);

}  // namespace pagedattn::serve::testing
