#include "gated_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "api_error.h"
#include "pagedattn/errors.h"

namespace pagedattn::serve {

// A client's connection between requests: its socket, and what the waiting
// room read of its next request (the headers, maybe body bytes after them).
struct Connection {
  int fd = -1;
  std::string received;
  std::size_t requests_served = 0;
};

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// Past httplib's own limits on a request line and a header line: a client
// that sends this much without ending its headers is not sending HTTP.
constexpr std::size_t kMaxHeaderBytes = 64 << 10;
constexpr std::size_t kReadChunk = 16 << 10;
constexpr milliseconds kBriefWait{200};

void close_socket(int fd) {
  ::shutdown(fd, SHUT_RDWR);
  ::close(fd);
}

bool headers_complete(const std::string& received) {
  return received.find("\r\n\r\n") != std::string::npos;
}

// Answers `status` and closes. Best effort: the send does not wait, and a
// client whose receive window is full does not get the answer.
void refuse(int fd, int status, const char* reason, const std::string& what) {
  const std::string body = ApiError(status, what).to_json();
  const std::string response = "HTTP/1.1 " + std::to_string(status) + " " + reason +
                               "\r\nConnection: close\r\nContent-Type: application/json"
                               "\r\nContent-Length: " +
                               std::to_string(body.size()) + "\r\n\r\n" + body;
  [[maybe_unused]] const ssize_t sent =
      ::send(fd, response.data(), response.size(), MSG_DONTWAIT | MSG_NOSIGNAL);
  close_socket(fd);
}

int poll_one(int fd, short events, milliseconds timeout) {
  pollfd p{fd, events, 0};
  int ready = 0;
  do {
    ready = ::poll(&p, 1, int(std::max<milliseconds::rep>(0, timeout.count())));
  } while (ready < 0 && errno == EINTR);
  return ready;
}

milliseconds timeval_ms(time_t seconds, time_t microseconds) {
  return milliseconds(seconds * 1000 + microseconds / 1000);
}

milliseconds until(Clock::time_point deadline, Clock::time_point now) {
  return std::chrono::ceil<milliseconds>(deadline - now);
}

void address_of(const sockaddr_storage& address, std::string& ip, int& port) {
  char text[INET6_ADDRSTRLEN] = {};
  if (address.ss_family == AF_INET) {
    const auto& v4 = reinterpret_cast<const sockaddr_in&>(address);
    ::inet_ntop(AF_INET, &v4.sin_addr, text, sizeof text);
    port = ntohs(v4.sin_port);
  } else if (address.ss_family == AF_INET6) {
    const auto& v6 = reinterpret_cast<const sockaddr_in6&>(address);
    ::inet_ntop(AF_INET6, &v6.sin6_addr, text, sizeof text);
    port = ntohs(v6.sin6_port);
  }
  ip = text;
}

}  // namespace

// The gate's parts: named, not anonymous, as ConnectionGate (declared in the
// header) holds them.
namespace gating {

// HTTP threads blocked on a client's bytes (a body still coming): at most
// `limit` at once, so that the other threads serve requests already in.
class ClientWaitSlots {
 public:
  explicit ClientWaitSlots(std::size_t limit) : limit_(limit) {}
  bool try_acquire() {
    if (in_use_.fetch_add(1) < limit_) return true;
    in_use_.fetch_sub(1);
    return false;
  }
  void release() { in_use_.fetch_sub(1); }

 private:
  const std::size_t limit_;
  std::atomic<std::size_t> in_use_{0};
};

struct StreamLimits {
  Clock::time_point body_deadline;  // reads past it fail
  milliseconds read_timeout;        // silence that fails a read
  milliseconds write_timeout;
};

// httplib's view of one request on a connection: the bytes the waiting room
// read come first, then the socket, each read bounded by the read timeout
// and the body's deadline.
class ConnectionStream final : public httplib::Stream {
 public:
  ConnectionStream(Connection& connection, StreamLimits limits, ClientWaitSlots& slots)
      : connection_(connection), limits_(limits), slots_(slots) {}

  bool is_readable() const override { return unread() > 0 || wait_for_client(); }
  bool is_writable() const override {
    return poll_one(connection_.fd, POLLOUT, limits_.write_timeout) > 0;
  }

  ssize_t read(char* ptr, size_t size) override {
    if (unread() > 0) {
      const std::size_t n = std::min(size, unread());
      std::copy_n(connection_.received.data() + consumed_, n, ptr);
      consumed_ += n;
      return ssize_t(n);
    }
    if (!wait_for_client()) {
      gave_up_reading_ = true;
      return -1;
    }
    ssize_t n = 0;
    do {
      n = ::recv(connection_.fd, ptr, size, 0);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  ssize_t write(const char* ptr, size_t size) override {
    if (!is_writable()) return -1;
    ssize_t n = 0;
    do {
      n = ::send(connection_.fd, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getpeername(connection_.fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      address_of(address, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    sockaddr_storage address{};
    socklen_t length = sizeof address;
    if (::getsockname(connection_.fd, reinterpret_cast<sockaddr*>(&address), &length) == 0)
      address_of(address, ip, port);
  }
  socket_t socket() const override { return connection_.fd; }

  // Drops what this request read: what is left (a pipelined next request)
  // stays with the connection.
  void keep_only_unread() { connection_.received.erase(0, consumed_); }
  // A read failed for time or for want of a thread: the rest of the request
  // may still come, and must not be read as a next request.
  bool gave_up_reading() const { return gave_up_reading_; }

 private:
  std::size_t unread() const { return connection_.received.size() - consumed_; }

  // True when the client's bytes are there to read, at once or before the
  // read timeout and the body's deadline (or, past the share of threads that
  // may wait on clients, after a brief wait).
  bool wait_for_client() const {
    if (poll_one(connection_.fd, POLLIN, milliseconds(0)) > 0) return true;
    const milliseconds left =
        std::min(limits_.read_timeout, until(limits_.body_deadline, Clock::now()));
    if (left.count() <= 0) return false;
    // Past the share, a thread waits only as long as bytes take to follow
    // the headers from a client that sent them together.
    if (!slots_.try_acquire())
      return poll_one(connection_.fd, POLLIN, std::min(left, kBriefWait)) > 0;
    const bool ready = poll_one(connection_.fd, POLLIN, left) > 0;
    slots_.release();
    return ready;
  }

  Connection& connection_;
  StreamLimits limits_;
  ClientWaitSlots& slots_;
  std::size_t consumed_ = 0;
  bool gave_up_reading_ = false;
};

// How long a connection may wait: idle before a request, for a request's
// headers from their first byte, and silent in their middle.
struct RoomTimeouts {
  milliseconds idle, header, silence;
};

// Holds connections until their next request's headers are all in, on one
// thread polling them all: a connection waiting here holds no HTTP thread.
// One that is idle past the keep-alive timeout is closed; one whose headers
// take longer than the header timeout from their first byte, or that goes
// silent for the read timeout in their middle, is answered 408 and closed.
class WaitingRoom {
 public:
  using Ready = std::function<void(Connection)>;

  WaitingRoom(RoomTimeouts timeouts, Ready ready)
      : timeouts_(timeouts),
        ready_(std::move(ready)),
        wake_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {
    require(wake_fd_ >= 0, "serve: cannot create an eventfd");
    thread_ = std::thread([this] { run(); });
  }
  ~WaitingRoom() {
    stop();
    ::close(wake_fd_);
  }
  WaitingRoom(const WaitingRoom&) = delete;
  WaitingRoom& operator=(const WaitingRoom&) = delete;

  // Closed at once once the room has stopped.
  void admit(Connection connection) {
    {
      const std::lock_guard lock(mutex_);
      if (!stopped_) {
        admitted_.push_back(std::move(connection));
        connection.fd = -1;
      }
    }
    if (connection.fd >= 0) close_socket(connection.fd);
    wake();
  }

  // Closes the connections waiting; later ones are closed as they come.
  void stop() {
    {
      const std::lock_guard lock(mutex_);
      if (stopped_) return;
      stopped_ = true;
    }
    wake();
    thread_.join();
  }

 private:
  struct Waiting {
    Connection connection;
    Clock::time_point headers_due;  // set at the request's first byte
    Clock::time_point deadline;     // the sooner of headers_due and the silence's end
  };

  void wake() {
    const std::uint64_t one = 1;
    [[maybe_unused]] const ssize_t n = ::write(wake_fd_, &one, sizeof one);
  }

  void run() {
    std::vector<pollfd> polled;
    while (take_admitted()) {
      polled.assign(1, pollfd{wake_fd_, POLLIN, 0});
      for (const Waiting& w : waiting_) polled.push_back(pollfd{w.connection.fd, POLLIN, 0});
      const int ready = ::poll(polled.data(), polled.size(), poll_timeout_ms());
      if (ready < 0 && errno != EINTR) break;
      std::uint64_t wakes = 0;
      [[maybe_unused]] const ssize_t n = ::read(wake_fd_, &wakes, sizeof wakes);
      const Clock::time_point now = Clock::now();
      std::vector<Waiting> still;
      for (std::size_t i = 0; i < waiting_.size(); ++i) {
        Waiting& w = waiting_[i];
        if (ready > 0 && polled[i + 1].revents != 0 && !receive(w, now)) continue;
        if (!settle(w, now)) still.push_back(std::move(w));
      }
      waiting_.swap(still);
    }
    for (const Waiting& w : waiting_) close_socket(w.connection.fd);
    waiting_.clear();
  }

  // Moves newly admitted connections in; false once stopped.
  bool take_admitted() {
    std::vector<Connection> admitted;
    {
      const std::lock_guard lock(mutex_);
      if (stopped_) {
        for (const Connection& c : admitted_) close_socket(c.fd);
        admitted_.clear();
        return false;
      }
      admitted.swap(admitted_);
    }
    const Clock::time_point now = Clock::now();
    for (Connection& c : admitted) {
      Waiting w{std::move(c), {}, now + timeouts_.idle};
      // Bytes already in (a pipelined request) start its header clock now.
      if (!w.connection.received.empty()) start_headers(w, now);
      if (!settle(w, now)) waiting_.push_back(std::move(w));
    }
    return true;
  }

  // Reads what the client sent; false when it closed (or failed).
  bool receive(Waiting& w, Clock::time_point now) {
    char chunk[kReadChunk];
    const ssize_t n = ::recv(w.connection.fd, chunk, sizeof chunk, MSG_DONTWAIT);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return true;
    if (n <= 0) {
      close_socket(w.connection.fd);
      return false;
    }
    // The request's first byte: its headers' deadline starts.
    if (w.connection.received.empty()) start_headers(w, now);
    w.connection.received.append(chunk, std::size_t(n));
    w.deadline = std::min(w.headers_due, now + timeouts_.silence);
    return true;
  }

  void start_headers(Waiting& w, Clock::time_point now) const {
    w.headers_due = now + timeouts_.header;
    w.deadline = std::min(w.headers_due, now + timeouts_.silence);
  }

  // Hands the connection on, refuses or closes it; false: it keeps waiting.
  bool settle(Waiting& w, Clock::time_point now) {
    Connection& c = w.connection;
    if (headers_complete(c.received)) {
      ready_(std::move(c));
    } else if (c.received.size() >= kMaxHeaderBytes) {
      refuse(c.fd, 431, "Request Header Fields Too Large",
             "the request headers exceed " + std::to_string(kMaxHeaderBytes) + " bytes");
    } else if (now < w.deadline) {
      return false;
    } else if (c.received.empty()) {
      close_socket(c.fd);  // idle past the keep-alive timeout
    } else {
      refuse(c.fd, 408, "Request Timeout",
             "the request headers did not arrive in time (--header-timeout, --read-timeout)");
    }
    return true;
  }

  int poll_timeout_ms() const {
    if (waiting_.empty()) return -1;  // until a connection is admitted
    Clock::time_point first = waiting_.front().deadline;
    for (const Waiting& w : waiting_) first = std::min(first, w.deadline);
    // Rounded up: woken at a deadline, not just before it.
    return int(std::max<milliseconds::rep>(0, until(first, Clock::now()).count()));
  }

  const RoomTimeouts timeouts_;
  const Ready ready_;
  const int wake_fd_;
  std::mutex mutex_;
  std::vector<Connection> admitted_;  // under mutex_
  bool stopped_ = false;              // under mutex_
  std::vector<Waiting> waiting_;      // the room's thread only
  std::thread thread_;
};

}  // namespace gating

using gating::ClientWaitSlots, gating::RoomTimeouts, gating::WaitingRoom;

// The waiting room and the HTTP threads, for one listen().
class ConnectionGate {
 public:
  ConnectionGate(const GateOptions& options, RoomTimeouts timeouts,
                 std::function<void(Connection)> serve)
      : serve_(std::move(serve)),
        slots_(std::max<std::size_t>(1, options.threads / 2)),
        pool_(options.threads),
        room_(timeouts, [this](Connection c) { hand_to_pool(std::move(c)); }) {}
  ~ConnectionGate() { stop(); }
  ConnectionGate(const ConnectionGate&) = delete;
  ConnectionGate& operator=(const ConnectionGate&) = delete;

  void admit(Connection connection) { room_.admit(std::move(connection)); }
  ClientWaitSlots& slots() { return slots_; }

  // The room first, so that nothing reaches the pool after it; the pool then
  // finishes the requests it has (a connection it gives back is closed).
  void stop() {
    room_.stop();
    if (!pool_stopped_.exchange(true)) pool_.shutdown();
  }

 private:
  void hand_to_pool(Connection connection) {
    // std::function needs a copyable task.
    auto shared = std::make_shared<Connection>(std::move(connection));
    pool_.enqueue([this, shared] { serve_(std::move(*shared)); });
  }

  const std::function<void(Connection)> serve_;
  ClientWaitSlots slots_;
  httplib::ThreadPool pool_;
  std::atomic<bool> pool_stopped_{false};
  WaitingRoom room_;  // last: its thread hands connections to the pool
};

namespace {

// httplib's task queue for accepted sockets: runs the task at once on the
// accept thread (it only hands the socket to the waiting room). Its shutdown,
// when listen() ends, stops the gate: listen() returns once the requests in
// flight are done, as with httplib's own pool.
class HandOffQueue final : public httplib::TaskQueue {
 public:
  explicit HandOffQueue(ConnectionGate& gate) : gate_(gate) {}
  void enqueue(std::function<void()> task) override { task(); }
  void shutdown() override { gate_.stop(); }

 private:
  ConnectionGate& gate_;
};

}  // namespace

GatedServer::GatedServer(GateOptions options) : options_(options) {
  require(options_.threads >= 1, "serve: no HTTP threads");
  new_task_queue = [this] {
    gate_ = std::make_unique<ConnectionGate>(options_, room_timeouts(),
                                             [this](Connection c) { serve_request(std::move(c)); });
    return new HandOffQueue(*gate_);
  };
}

gating::RoomTimeouts GatedServer::room_timeouts() const {
  return {.idle = std::chrono::seconds(keep_alive_timeout_sec_),
          .header = options_.header_timeout,
          .silence = timeval_ms(read_timeout_sec_, read_timeout_usec_)};
}

GatedServer::~GatedServer() {
  if (gate_ != nullptr) gate_->stop();
}

bool GatedServer::process_and_close_socket(socket_t sock) {
  gate_->admit(Connection{.fd = sock, .received = {}, .requests_served = 0});
  return true;
}

void GatedServer::serve_request(Connection connection) {
  const bool last = ++connection.requests_served >= keep_alive_max_count_;
  const gating::StreamLimits limits{
      .body_deadline = Clock::now() + options_.body_timeout,
      .read_timeout = timeval_ms(read_timeout_sec_, read_timeout_usec_),
      .write_timeout = timeval_ms(write_timeout_sec_, write_timeout_usec_)};
  bool client_closes = false;
  bool served = false;
  {
    gating::ConnectionStream stream(connection, limits, gate_->slots());
    served = process_request(stream, last, client_closes, nullptr) && !stream.gave_up_reading();
    stream.keep_only_unread();
  }
  if (!served || client_closes || last || svr_sock_ == INVALID_SOCKET)
    close_socket(connection.fd);
  else
    gate_->admit(std::move(connection));
}

}  // namespace pagedattn::serve
