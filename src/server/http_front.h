// The connection layer of `phasekv serve`: httplib parses requests and runs the routes, but the
// connections are held here, so that slow, stalled or idle clients cannot hold the threads that
// run requests, and so that no body is read past the size limit.
//
// One poller thread owns every connection that is not running a request: idle keep-alive
// connections, and requests whose head (request line and headers) has not fully arrived. A
// request reaches a worker thread only once its head is complete; the head is checked first
// (check_request_head: Content-Length, Transfer-Encoding, size), so an oversize or malformed body
// is answered at once without reading it. Each request's head and body must arrive within
// read_timeout_s (408 after it); a connection idle longer than idle_timeout_s is closed. The
// cheap GET routes (light_paths: /health, /v1/models, /version) have their own threads, so they
// answer while every request worker is busy. When the request queue or the connection table is
// full the answer is 503 with Retry-After, at once. An answer after which the connection's
// framing is unknown (408, 413, 4xx before the body) closes it after a short drain, so that the
// client reads the answer instead of a reset.
//
// Torch-free (httplib and POSIX sockets only).
#pragma once
#include <httplib.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

namespace phasekv {

struct ConnectionOptions {
  int workers = 32;       // threads that run requests (the model work)
  int light_workers = 2;  // threads for the GET routes in light_paths
  int max_connections = 512;
  int max_queue = 64;           // requests with a complete head waiting for a worker; more: 503
  double read_timeout_s = 10;   // a request's head and body must arrive within this
  double idle_timeout_s = 5;    // a keep-alive connection without a request is closed after this
  double write_timeout_s = 60;  // a client that reads nothing for this long is dropped
  size_t max_body_bytes = size_t{8} << 20;
  size_t max_head_bytes = size_t{16} << 10;
  int keep_alive_max = 10000;  // requests per connection
  std::vector<std::string> light_paths;
  // The JSON body of an error answer (status, message); the server's error_body.
  std::function<std::string(int, const std::string&)> error_json;
  // Called (on the poller thread) for each answer given here, without a worker: 503 (queue or
  // connection table full), 408 (head too slow), 413 (Content-Length over the limit), 400, 411,
  // 431, 501 (a malformed head). `request`: "METHOD /path", or "-" before a head was read.
  std::function<void(const std::string& request, int status, const std::string& message)> on_reject;
};

// A complete request head (through the blank line), checked before its body is read.
struct HeadCheck {
  int status = 0;  // 0: fine; else the status to answer at once, with `message`
  std::string message;
  std::string method, path;  // path without the query
  bool chunked = false;
  uint64_t content_length = 0;
};
HeadCheck check_request_head(std::string_view head, size_t max_body_bytes);

// What happened to the request running on this thread; the routes' handlers and error handler
// read and set it (nullptr outside a request, e.g. in unit tests of the handlers).
struct RequestState {
  bool timed_out = false;    // the body did not arrive within read_timeout_s
  bool over_budget = false;  // more body bytes than max_body_bytes (chunked or unframed)
  bool close = false;        // the body was not read to its end: close after the answer
};
RequestState* current_request();

class FrontServer : public httplib::Server {
 public:
  explicit FrontServer(ConnectionOptions options);
  ~FrontServer() override;
  const ConnectionOptions& connection_options() const;
  // Requests with a complete head waiting for a request thread (tests wait for a full queue).
  int waiting() const;

  class Impl;

 private:
  bool process_and_close_socket(socket_t sock) override;
  std::unique_ptr<Impl> impl_;
};

}  // namespace phasekv
