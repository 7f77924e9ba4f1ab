#include "server/http_front.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstring>
#include <deque>
#include <list>
#include <mutex>
#include <thread>

namespace phasekv {
namespace {

using Clock = std::chrono::steady_clock;

thread_local RequestState* tl_request = nullptr;

// A refused connection is read and discarded for up to 1 s or this many bytes before it is
// closed, so that a client still sending its body (httplib's client sends it all before reading)
// gets the answer rather than a reset; past that it only costs the server.
constexpr size_t kDrainBytes = size_t{16} << 20;

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t')) s.remove_suffix(1);
  return s;
}

HeadCheck fail(HeadCheck h, int status, std::string message) {
  h.status = status;
  h.message = std::move(message);
  return h;
}

const char* reason(int status) {
  switch (status) {
    case 400:
      return "Bad Request";
    case 408:
      return "Request Timeout";
    case 411:
      return "Length Required";
    case 413:
      return "Payload Too Large";
    case 431:
      return "Request Header Fields Too Large";
    case 501:
      return "Not Implemented";
    case 503:
      return "Service Unavailable";
    default:
      return "Error";
  }
}

Clock::time_point after(double seconds) {
  return Clock::now() +
         std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

// Milliseconds until t, rounded up, at most 1 s.
int ms_until(Clock::time_point t) {
  const auto d = std::chrono::duration_cast<std::chrono::microseconds>(t - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>((d + 999) / 1000, 0, 1000));
}

}  // namespace

RequestState* current_request() {
  return tl_request;
}

HeadCheck check_request_head(std::string_view head, size_t max_body_bytes) {
  HeadCheck h;
  size_t eol = head.find("\r\n");
  if (eol == std::string_view::npos) return fail(h, 400, "the request head has no line end");
  const std::string_view line = head.substr(0, eol);
  const size_t s1 = line.find(' ');
  const size_t s2 = s1 == std::string_view::npos ? s1 : line.find(' ', s1 + 1);
  if (s1 == 0 || s2 == std::string_view::npos || line.substr(s2 + 1).rfind("HTTP/", 0) != 0)
    return fail(h, 400, "malformed request line (expected: METHOD /path HTTP/1.1)");
  h.method = std::string(line.substr(0, s1));
  const std::string_view target = line.substr(s1 + 1, s2 - s1 - 1);
  h.path = std::string(target.substr(0, target.find('?')));
  bool have_length = false;
  std::string transfer_encoding;
  for (size_t pos = eol + 2; pos < head.size();) {
    eol = head.find("\r\n", pos);
    if (eol == std::string_view::npos) eol = head.size();
    const std::string_view hl = head.substr(pos, eol - pos);
    pos = eol + 2;
    if (hl.empty()) break;
    const size_t colon = hl.find(':');
    if (colon == std::string_view::npos || colon == 0)
      return fail(h, 400, "malformed header line (expected: Name: value)");
    const std::string name = lower(trim(hl.substr(0, colon)));
    const std::string_view value = trim(hl.substr(colon + 1));
    if (name == "content-length") {
      const bool digits = !value.empty() && std::all_of(value.begin(), value.end(), [](char c) {
        return c >= '0' && c <= '9';
      });
      if (!digits)
        return fail(h, 400,
                    "Content-Length '" + std::string(value.substr(0, 40)) +
                        "' is not a non-negative integer");
      // 19 digits always fit in 64 bits; anything longer is over any limit.
      const uint64_t n = value.size() > 19 ? UINT64_MAX : std::stoull(std::string(value));
      if (have_length && n != h.content_length)
        return fail(h, 400, "two different Content-Length headers");
      have_length = true;
      h.content_length = n;
    } else if (name == "transfer-encoding") {
      transfer_encoding = lower(value);
    }
  }
  if (!transfer_encoding.empty()) {
    if (transfer_encoding != "chunked")
      return fail(h, 501,
                  "Transfer-Encoding '" + transfer_encoding.substr(0, 40) +
                      "' is not supported (allowed: chunked)");
    if (have_length)
      return fail(h, 400, "a request may not have both Content-Length and Transfer-Encoding");
    h.chunked = true;
  }
  if (have_length && h.content_length > max_body_bytes)
    return fail(h, 413,
                "the request body of " +
                    (h.content_length == UINT64_MAX ? std::string("over 10^19")
                                                    : std::to_string(h.content_length)) +
                    " bytes (Content-Length) exceeds the server's limit of " +
                    std::to_string(max_body_bytes) + " bytes (--max-body-bytes)");
  if (!have_length && !h.chunked &&
      (h.method == "POST" || h.method == "PUT" || h.method == "PATCH"))
    return fail(h, 411, h.method + " " + h.path + " needs a Content-Length or a chunked body");
  return h;
}

namespace {

struct Conn {
  enum class State { kIdle, kHead, kBusy, kDrain };
  int fd = -1;
  std::string buf;  // bytes received and not yet consumed, from `pos` on
  size_t pos = 0;
  State state = State::kIdle;
  Clock::time_point deadline;
  Clock::time_point request_start;
  int served = 0;
  size_t drained = 0;
  bool light = false;
  size_t available() const { return buf.size() - pos; }
  void compact() {
    buf.erase(0, pos);
    pos = 0;
  }
};

// What a worker hands back: keep the connection for its next request, or drain and close it.
struct Returned {
  Conn* conn;
  bool keep;
};

}  // namespace

class FrontServer::Impl {
 public:
  using Process = std::function<bool(httplib::Stream&, bool, bool&)>;
  Impl(ConnectionOptions o, Process process) : o_(std::move(o)), process_(std::move(process)) {}
  ~Impl() { shutdown(); }

  void start() {
    if (running_) return;
    if (pipe(wake_) != 0) wake_[0] = wake_[1] = -1;
    for (int fd : wake_)
      if (fd >= 0) fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
    stopping_ = false;
    running_ = true;
    main_.workers = o_.workers;
    light_.workers = o_.light_workers;
    poller_ = std::thread([this] { poll_loop(); });
    for (int i = 0; i < o_.workers; ++i) workers_.emplace_back([this] { work(main_); });
    for (int i = 0; i < o_.light_workers; ++i) workers_.emplace_back([this] { work(light_); });
  }

  void adopt(int fd) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      incoming_.push_back(fd);
    }
    wake();
  }

  // In-flight and queued requests finish; then every connection is closed.
  void shutdown() {
    if (!running_) return;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      stopping_ = true;
    }
    main_.cv.notify_all();
    light_.cv.notify_all();
    wake();
    for (auto& t : workers_) t.join();
    workers_.clear();
    poller_exit_ = true;
    wake();
    poller_.join();
    for (int& fd : wake_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
    running_ = false;
    poller_exit_ = false;
  }

  const ConnectionOptions& options() const { return o_; }
  int waiting() {
    std::lock_guard<std::mutex> lock(queue_mutex_);
    return main_.waiting();
  }

 private:
  struct Queue {
    std::deque<Conn*> q;
    std::condition_variable cv;
    int workers = 0;  // threads serving this queue
    int busy = 0;     // of them running a request
    // Requests queued and not about to be taken by an idle thread (a thread woken by notify
    // may not have taken its request yet).
    int waiting() const { return std::max(0, static_cast<int>(q.size()) + busy - workers); }
  };

  class ConnStream;

  void wake() {
    const char c = 1;
    if (wake_[1] >= 0) {
      [[maybe_unused]] const ssize_t n = ::write(wake_[1], &c, 1);
    }
  }

  std::string error_response(int status, const std::string& message, const std::string& extra) {
    const std::string body = o_.error_json ? o_.error_json(status, message) : message;
    return "HTTP/1.1 " + std::to_string(status) + " " + reason(status) +
           "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) +
           "\r\nConnection: close\r\n" + extra + "\r\n" + body;
  }

  // Answers from the poller (the connection never reached a worker), then drains and closes.
  void answer_and_drain(Conn& c, int status, const std::string& message,
                        const std::string& request = "-", const std::string& extra = "") {
    if (o_.on_reject) o_.on_reject(request, status, message);
    const std::string r = error_response(status, message, extra);
    // A few hundred bytes: the socket's send buffer takes them at once.
    [[maybe_unused]] auto n = ::send(c.fd, r.data(), r.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    start_drain(c);
  }

  // Half-close and read what the client still sends for a moment, so that it reads the answer
  // rather than a reset (closing a socket with unread data sends RST).
  void start_drain(Conn& c) {
    ::shutdown(c.fd, SHUT_WR);
    c.state = Conn::State::kDrain;
    c.deadline = after(1.0);
    c.drained = 0;
    c.buf.clear();
    c.pos = 0;
  }

  void close_conn(Conn& c) {
    if (c.fd >= 0) ::close(c.fd);
    c.fd = -1;
  }

  // A complete head goes to a worker; an incomplete one waits (431 when it is already too long).
  void try_dispatch(Conn& c) {
    const std::string_view data(c.buf.data() + c.pos, c.available());
    const size_t end = data.find("\r\n\r\n");
    if (end == std::string_view::npos) {
      if (data.size() > o_.max_head_bytes)
        answer_and_drain(
            c, 431, "the request head exceeds " + std::to_string(o_.max_head_bytes) + " bytes");
      return;
    }
    const HeadCheck h = check_request_head(data.substr(0, end + 4), o_.max_body_bytes);
    const std::string request = h.method.empty() ? "-" : h.method + " " + h.path;
    if (h.status != 0) return answer_and_drain(c, h.status, h.message, request);
    c.light =
        (h.method == "GET" || h.method == "HEAD") &&
        std::find(o_.light_paths.begin(), o_.light_paths.end(), h.path) != o_.light_paths.end();
    Queue& q = c.light ? light_ : main_;
    {
      std::lock_guard<std::mutex> lock(queue_mutex_);
      if (!stopping_ && q.waiting() < o_.max_queue) {
        c.state = Conn::State::kBusy;
        q.q.push_back(&c);
        q.cv.notify_one();
        return;
      }
    }
    answer_and_drain(c, 503,
                     stopping_ ? "the server is stopping"
                               : "the server is busy: " + std::to_string(o_.max_queue) +
                                     " requests are waiting (--max-queue); retry later",
                     request, "Retry-After: 1\r\n");
  }

  void on_readable(Conn& c) {
    char tmp[16384];
    for (int i = 0; i < 64; ++i) {
      const ssize_t n = ::recv(c.fd, tmp, sizeof(tmp), MSG_DONTWAIT);
      if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
        return close_conn(c);
      if (n < 0) break;
      if (c.state == Conn::State::kDrain) {
        c.drained += static_cast<size_t>(n);
        if (c.drained > kDrainBytes) return close_conn(c);
        continue;
      }
      if (c.state == Conn::State::kIdle) {
        c.state = Conn::State::kHead;
        c.request_start = Clock::now();
        c.deadline = after(o_.read_timeout_s);
      }
      c.buf.append(tmp, static_cast<size_t>(n));
      if (c.available() > o_.max_head_bytes) break;
    }
    if (c.state == Conn::State::kHead) try_dispatch(c);
  }

  void on_deadline(Conn& c) {
    if (c.state == Conn::State::kHead)
      answer_and_drain(c, 408,
                       "the request head did not arrive within " + seconds(o_.read_timeout_s) +
                           " (--read-timeout)");
    else
      close_conn(c);
  }

  static std::string seconds(double s) {
    std::string t = std::to_string(s);
    t.erase(t.find_last_not_of('0') + 1);
    if (!t.empty() && t.back() == '.') t.pop_back();
    return t + " s";
  }

  void take_new_and_returned() {
    std::vector<int> incoming;
    std::vector<Returned> returned;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      incoming.swap(incoming_);
      returned.swap(returned_);
    }
    for (const Returned& r : returned) {
      Conn& c = *r.conn;
      if (!r.keep || stopping_) {
        start_drain(c);
        continue;
      }
      c.compact();
      c.state = Conn::State::kIdle;
      c.deadline = after(o_.idle_timeout_s);
      if (c.available() > 0) {  // a pipelined request
        c.state = Conn::State::kHead;
        c.request_start = Clock::now();
        c.deadline = after(o_.read_timeout_s);
        try_dispatch(c);
      }
    }
    for (int fd : incoming) {
      fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
      auto c = std::make_unique<Conn>();
      c->fd = fd;
      c->deadline = after(o_.idle_timeout_s);
      if (stopping_ || static_cast<int>(conns_.size()) >= o_.max_connections) {
        answer_and_drain(*c, 503,
                         stopping_ ? "the server is stopping"
                                   : "the server has " + std::to_string(o_.max_connections) +
                                         " open connections (--max-connections); retry later",
                         "-", "Retry-After: 1\r\n");
      }
      conns_.push_back(std::move(c));
    }
  }

  void poll_loop() {
    std::vector<pollfd> fds;
    std::vector<Conn*> polled;
    for (;;) {
      take_new_and_returned();
      if (poller_exit_) break;
      fds.assign(1, pollfd{wake_[0], POLLIN, 0});
      polled.clear();
      int timeout = 1000;
      for (auto& c : conns_) {
        if (c->state == Conn::State::kBusy || c->fd < 0) continue;
        if (stopping_ && c->state != Conn::State::kDrain) start_drain(*c);
        fds.push_back(pollfd{c->fd, POLLIN, 0});
        polled.push_back(c.get());
        timeout = std::min(timeout, ms_until(c->deadline));
      }
      ::poll(fds.data(), fds.size(), timeout);
      if (fds[0].revents & POLLIN) {
        char drain[256];
        while (::read(wake_[0], drain, sizeof(drain)) > 0) {
        }
      }
      const auto now = Clock::now();
      for (size_t i = 0; i < polled.size(); ++i) {
        Conn& c = *polled[i];
        if (fds[i + 1].revents) on_readable(c);
        if (c.fd >= 0 && c.state != Conn::State::kBusy && c.deadline <= now) on_deadline(c);
      }
      conns_.remove_if([](const std::unique_ptr<Conn>& c) { return c->fd < 0; });
    }
    for (auto& c : conns_) close_conn(*c);
    conns_.clear();
  }

  void work(Queue& q) {
    for (;;) {
      Conn* c = nullptr;
      {
        std::unique_lock<std::mutex> lock(queue_mutex_);
        q.cv.wait(lock, [&] { return !q.q.empty() || stopping_; });
        if (q.q.empty()) return;
        c = q.q.front();
        q.q.pop_front();
        ++q.busy;
      }
      const bool keep = run_request(*c);
      {
        std::lock_guard<std::mutex> lock(queue_mutex_);
        --q.busy;
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        returned_.push_back({c, keep});
      }
      wake();
    }
  }

  bool run_request(Conn& c);

  ConnectionOptions o_;
  Process process_;
  std::thread poller_;
  std::vector<std::thread> workers_;
  std::list<std::unique_ptr<Conn>> conns_;  // the poller's; a busy one belongs to its worker
  std::mutex mutex_;                        // incoming_, returned_
  std::vector<int> incoming_;
  std::vector<Returned> returned_;
  std::mutex queue_mutex_;  // main_, light_, stopping_
  Queue main_, light_;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> poller_exit_{false};
  bool running_ = false;
  int wake_[2] = {-1, -1};
};

// httplib reads and writes a request through this: first the bytes the poller already
// received, then the socket, each read bounded by the request's deadline and the body by a
// byte budget.
class FrontServer::Impl::ConnStream : public httplib::Stream {
 public:
  ConnStream(Conn& c, const ConnectionOptions& o, RequestState& state)
      : c_(c),
        deadline_(c.request_start + std::chrono::duration_cast<Clock::duration>(
                                        std::chrono::duration<double>(o.read_timeout_s))),
        write_timeout_ms_(static_cast<int>(o.write_timeout_s * 1000)),
        // The head, then the body with its chunk framing: the handlers stop a chunked body at
        // max_body_bytes; this also bounds bodies no handler reads.
        budget_(o.max_head_bytes + 2 * o.max_body_bytes + 65536),
        state_(state) {}

  bool is_readable() const override {
    return c_.available() > 0 || wait(POLLIN, deadline_ms()) > 0;
  }
  bool is_writable() const override { return wait(POLLOUT, write_timeout_ms_) > 0; }

  ssize_t read(char* ptr, size_t size) override {
    if (consumed_ >= budget_) {
      state_.over_budget = true;
      return -1;
    }
    if (c_.available() == 0) {
      c_.compact();
      for (;;) {
        const int ready = wait(POLLIN, deadline_ms());
        if (ready == 0 && Clock::now() < deadline_) continue;  // poll woke early
        if (ready == 0) state_.timed_out = true;
        if (ready <= 0) return -1;
        char tmp[16384];
        const ssize_t n = ::recv(c_.fd, tmp, sizeof(tmp), MSG_DONTWAIT);
        if (n > 0) {
          c_.buf.append(tmp, static_cast<size_t>(n));
          break;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) return -1;
      }
    }
    const size_t k = std::min({size, c_.available(), budget_ - consumed_});
    std::memcpy(ptr, c_.buf.data() + c_.pos, k);
    c_.pos += k;
    consumed_ += k;
    return static_cast<ssize_t>(k);
  }

  ssize_t write(const char* ptr, size_t size) override {
    for (;;) {
      const ssize_t n = ::send(c_.fd, ptr, size, MSG_NOSIGNAL | MSG_DONTWAIT);
      if (n >= 0) return n;
      if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return -1;
      if (wait(POLLOUT, write_timeout_ms_) <= 0) return -1;
    }
  }

  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address(::getpeername, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address(::getsockname, ip, port);
  }
  socket_t socket() const override { return c_.fd; }

 private:
  // Milliseconds to the deadline, rounded up (poll must not wake before it).
  int deadline_ms() const {
    const auto d =
        std::chrono::duration_cast<std::chrono::microseconds>(deadline_ - Clock::now()).count();
    return static_cast<int>(std::clamp<int64_t>((d + 999) / 1000, 0, INT32_MAX));
  }
  // 1: ready (or hung up: the read or write then fails), 0: timed out, -1: error.
  int wait(short events, int timeout_ms) const {
    pollfd p{c_.fd, events, 0};
    for (;;) {
      const int r = ::poll(&p, 1, timeout_ms);
      if (r < 0 && errno == EINTR) continue;
      return r < 0 ? -1 : (r == 0 ? 0 : 1);
    }
  }
  template <typename F>
  void address(F get, std::string& ip, int& port) const {
    sockaddr_storage a{};
    socklen_t len = sizeof(a);
    ip.clear();
    port = 0;
    if (get(c_.fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return;
    char text[INET6_ADDRSTRLEN] = {};
    if (a.ss_family == AF_INET) {
      const auto* v4 = reinterpret_cast<const sockaddr_in*>(&a);
      inet_ntop(AF_INET, &v4->sin_addr, text, sizeof(text));
      port = ntohs(v4->sin_port);
    } else if (a.ss_family == AF_INET6) {
      const auto* v6 = reinterpret_cast<const sockaddr_in6*>(&a);
      inet_ntop(AF_INET6, &v6->sin6_addr, text, sizeof(text));
      port = ntohs(v6->sin6_port);
    }
    ip = text;
  }

  Conn& c_;
  Clock::time_point deadline_;
  int write_timeout_ms_;
  size_t budget_;
  size_t consumed_ = 0;
  RequestState& state_;
};

bool FrontServer::Impl::run_request(Conn& c) {
  RequestState state;
  tl_request = &state;
  ConnStream strm(c, o_, state);
  bool connection_closed = false;
  const bool last = ++c.served >= o_.keep_alive_max || stopping_;
  const bool ok = process_(strm, last, connection_closed);
  tl_request = nullptr;
  return ok && !last && !connection_closed && !state.close && !state.timed_out &&
         !state.over_budget;
}

// httplib's accept loop hands each socket to its task queue; this one gives it to the poller.
class InlineQueue : public httplib::TaskQueue {
 public:
  explicit InlineQueue(FrontServer::Impl& impl) : impl_(impl) { impl_.start(); }
  void enqueue(std::function<void()> fn) override { fn(); }
  void shutdown() override { impl_.shutdown(); }

 private:
  FrontServer::Impl& impl_;
};

FrontServer::FrontServer(ConnectionOptions options)
    : impl_(std::make_unique<Impl>(std::move(options),
                                   [this](httplib::Stream& s, bool last, bool& closed) {
                                     return process_request(s, last, closed, nullptr);
                                   })) {
  new_task_queue = [this] { return new InlineQueue(*impl_); };
  const ConnectionOptions& o = impl_->options();
  set_payload_max_length(o.max_body_bytes);
  // Only for the Keep-Alive header httplib writes; the connections here keep to the same values.
  set_keep_alive_max_count(static_cast<size_t>(o.keep_alive_max));
  set_keep_alive_timeout(static_cast<time_t>(o.idle_timeout_s));
}

FrontServer::~FrontServer() = default;

const ConnectionOptions& FrontServer::connection_options() const {
  return impl_->options();
}

int FrontServer::waiting() const {
  return impl_->waiting();
}

bool FrontServer::process_and_close_socket(socket_t sock) {
  impl_->adopt(sock);
  return true;
}

}  // namespace phasekv
