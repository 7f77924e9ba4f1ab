// JSON over HTTP with the failure handling a long audit needs: one keep-alive connection per
// worker slot, a per-request timeout, retries with exponential backoff and full jitter on
// transient failures (connection errors, 408, 429, 5xx, a body that is not JSON), Retry-After on
// 429/503 honoured (bounded), adaptive concurrency that halves the requests in flight on 429s
// and creeps back on successes, a cap on the retries of the whole run, and a circuit breaker: when
// no attempt has been answered for `give_up_after_s` while attempts keep failing (or the retry
// budget is spent during such a run of failures), the endpoint counts as down and every later
// request fails at once, so a dead server ends the run in about a minute instead of hours
// (down_reason(); the runner stops and keeps what was scored). The API key goes into the
// Authorization header only: it is never part of a message, an error or describe().
#pragma once
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <ctime>
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
  // A Retry-After (seconds or an HTTP date) on a 429 or 503 is waited out up to this long; a
  // longer one fails the request at once (the server asks for more than the run can give).
  double max_retry_after_s = 120.0;
  // The circuit breaker: attempts that all failed (connection errors, timeouts, 5xx, 408, bodies
  // that are not JSON; a 429 proves the server alive) for this long with no 2xx in between mark
  // the endpoint down. 0 turns it off.
  double give_up_after_s = 60.0;
};

// A 429 or a 503 is back-pressure: the server is alive but busy. Retried as any transient failure,
// but while other requests are answered (one in the last 10 s), its retries use neither the
// request's `retries` nor the run's budget (an audit at --concurrency 16 against a server that
// takes 6 loses no item), and it lowers the adaptive concurrency. Adaptive concurrency on 429s and
// 503s (AIMD): one of them halves the number of requests allowed in flight, once per burst (429s or
// 503s of requests sent before the last halving do not halve it again), and every `limit` successes
// in a row add one back, never above the transport's slots nor below 1.
struct AdaptiveConcurrency {
  bool enabled = true;
};

struct TransportOptions {
  EndpointUrl url;
  int slots = 8;          // connections, one per concurrent worker
  double timeout_s = 60;  // connect, read and write timeout of one attempt
  RetryPolicy retry;
  AdaptiveConcurrency adaptive;
  std::string api_key;  // "" = no Authorization header
  // Failures that must not be retried although their status is (a 5xx that the same request
  // will always get again, such as llama.cpp refusing invalid UTF-8 output): (status, body).
  std::function<bool(int, const std::string&)> permanent;
  // Opt-in cache of successful POST answers (--request-cache DIR): one file per request, keyed
  // by the endpoint, the route and the exact body (vLLM's random cache_salt left out), so a
  // rerun sends nothing it has an answer for. "" = off.
  std::string cache_dir;
};

// Counters over the transport's lifetime (all attempts of all requests).
struct TransportStats {
  int64_t requests = 0;  // calls of get/post
  int64_t attempts = 0;
  int64_t retries = 0;
  int64_t failed = 0;  // requests that failed for good
  int64_t http_429 = 0, http_503 = 0, http_5xx = 0, connection_errors = 0, bad_json = 0;
  int64_t busy_retries = 0;  // 429/503 retries while other requests were answered (not budgeted)
  int64_t retry_after_waits = 0;             // retries that waited out a Retry-After header
  double retry_after_wait_s = 0.0;           // the seconds those waits asked for
  int concurrency_limit = 0;                 // requests allowed in flight now (adaptive)
  int min_concurrency_limit = 0;             // the lowest the limit went
  int64_t concurrency_decreases = 0;         // halvings on 429
  int64_t cache_hits = 0, cache_stores = 0;  // --request-cache
};

// A request that failed for good. `retryable` tells whether the last failure was transient.
class RequestFailed : public std::runtime_error {
 public:
  RequestFailed(const std::string& what, int status, std::string body = "")
      : std::runtime_error(what), status(status), body(std::move(body)) {}
  int status;        // HTTP status of the last attempt, 0 when there was no response
  std::string body;  // the last answer's body (its first 4 KiB), "" when there was none
};

class Transport {
 public:
  explicit Transport(TransportOptions options);
  ~Transport();
  Transport(const Transport&) = delete;
  Transport& operator=(const Transport&) = delete;

  // `slot` in [0, slots): the connection to use; a slot must not be used by two threads at once.
  // Returns the parsed JSON body of a 2xx answer; throws RequestFailed after the last attempt.
  // `from_cache`, when given, says whether the answer came from the request cache.
  nlohmann::json post(int slot, const std::string& route, const nlohmann::json& body,
                      bool* from_cache = nullptr);
  nlohmann::json get(int slot, const std::string& route);

  TransportStats stats() const;
  // Why the endpoint counts as down (the circuit breaker of RetryPolicy::give_up_after_s);
  // "" while it does not.
  std::string down_reason() const;
  const EndpointUrl& url() const { return options_.url; }
  int slots() const { return options_.slots; }

 private:
  struct Attempt;
  nlohmann::json request(int slot, const std::string& method, const std::string& route,
                         const std::string& body);
  Attempt attempt(int slot, const std::string& method, const std::string& route,
                  const std::string& body);
  bool take_retry();
  // The circuit breaker: note an answered attempt, or a failed one (may mark the endpoint down).
  void note_success();
  void note_failure(const std::string& error, bool budget_spent);
  // The adaptive in-flight limit: acquire before an attempt, release after it with its status.
  // With adaptive concurrency the lease's connection is the lowest free one, so the requests in
  // flight use connections [0, limit): a server that caps connections (phasekv serve
  // --max-connections, llama.cpp's slots behind a proxy) counts idle keep-alive connections
  // too, and those above the limit are closed when it drops. Without it, the caller's slot.
  struct Lease {
    int conn = 0;
    int64_t generation = 0;  // halvings so far, handed back to release()
  };
  Lease acquire(int slot);
  void release(const Lease& lease, int status);

  TransportOptions options_;
  std::vector<std::unique_ptr<httplib::Client>> clients_;
  std::atomic<int64_t> requests_{0}, attempts_{0}, retries_{0}, failed_{0};
  std::atomic<int64_t> http_429_{0}, http_503_{0}, http_5xx_{0}, connection_errors_{0},
      bad_json_{0}, busy_retries_{0};
  std::atomic<int64_t> retry_after_waits_{0}, cache_hits_{0}, cache_stores_{0};
  mutable std::mutex limit_mutex_;
  std::condition_variable limit_cv_;
  int limit_ = 1, in_flight_ = 0, min_limit_ = 1, successes_ = 0;
  std::vector<char> conn_busy_;  // per connection: a request is in flight on it
  int64_t decreases_ = 0;
  double retry_after_wait_s_ = 0.0;
  mutable std::mutex down_mutex_;
  std::chrono::steady_clock::time_point failing_since_{};  // epoch: not failing
  std::string down_reason_;
  std::atomic<bool> down_{false};
  std::atomic<int64_t> last_answer_ns_{0};  // steady clock of the latest 2xx, 0: none yet
};

// A Retry-After header's value in seconds from `now`: delay-seconds or an HTTP date (RFC 9110);
// -1 when unreadable.
double parse_retry_after(const std::string& value, std::time_t now);

// Runs fn(slot, i) for i in [0, n) on `slots` threads (fewer when n is smaller); each thread owns
// one slot. fn must not throw.
void parallel_for(int slots, size_t n, const std::function<void(int, size_t)>& fn);

}  // namespace phasekv
