// JSON over HTTP with the failure handling a long audit needs: one keep-alive connection per
// worker slot, a per-request timeout, retries with exponential backoff and full jitter on
// transient failures (connection errors, 408, 429, 5xx, a body that is not JSON), Retry-After
// honoured, and a cap on the retries of the whole run so a dead server ends the run in minutes
// instead of hours. The API key goes into the Authorization header only: it is never part of a
// message, an error or describe().
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/http_url.h"

namespace httplib {
class Client;
}

namespace phasekv {

struct RetryPolicy {
  int retries = 5;             // per request, after the first attempt
  double base_delay_s = 0.25;  // attempt k waits U(0, min(max, base * 2^k))
  double max_delay_s = 20.0;
  int64_t max_total_retries = 2000;  // over the transport's lifetime
};

struct TransportOptions {
  EndpointUrl url;
  int slots = 8;          // connections, one per concurrent worker
  double timeout_s = 60;  // connect, read and write timeout of one attempt
  RetryPolicy retry;
  std::string api_key;  // "" = no Authorization header
};

// Counters over the transport's lifetime (all attempts of all requests).
struct TransportStats {
  int64_t requests = 0;  // calls of get/post
  int64_t attempts = 0;
  int64_t retries = 0;
  int64_t failed = 0;  // requests that failed for good
  int64_t http_429 = 0, http_5xx = 0, connection_errors = 0, bad_json = 0;
};

// A request that failed for good. `retryable` tells whether the last failure was transient.
class RequestFailed : public std::runtime_error {
 public:
  RequestFailed(const std::string& what, int status) : std::runtime_error(what), status(status) {}
  int status;  // HTTP status of the last attempt, 0 when there was no response
};

class Transport {
 public:
  explicit Transport(TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // `slot` in [0, slots): the connection to use; a slot must not be used by two threads at once.
  // Returns the parsed JSON body of a 2xx answer; throws RequestFailed after the last attempt.
  nlohmann::json post(int slot, const std::string& route, const nlohmann::json& body);
  nlohmann::json get(int slot, const std::string& route);

  TransportStats stats() const;
  const EndpointUrl& url() const { return options_.url; }
  int slots() const { return options_.slots; }

 private:
  struct Attempt;
  nlohmann::json request(int slot, const std::string& method, const std::string& route,
                         const std::string& body);
  Attempt attempt(int slot, const std::string& method, const std::string& route,
                  const std::string& body);
  bool take_retry();

  TransportOptions options_;
  std::vector<std::unique_ptr<httplib::Client>> clients_;
  std::atomic<int64_t> requests_{0}, attempts_{0}, retries_{0}, failed_{0};
  std::atomic<int64_t> http_429_{0}, http_5xx_{0}, connection_errors_{0}, bad_json_{0};
};

// Runs fn(slot, i) for i in [0, n) on `slots` threads (fewer when n is smaller); each thread owns
// one slot. fn must not throw.
void parallel_for(int slots, size_t n, const std::function<void(int, size_t)>& fn);

}  // namespace phasekv
