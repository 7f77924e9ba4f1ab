#include "backend/http_transport.h"

#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <functional>
#include <random>
#include <thread>

#include "util/error.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

std::string snippet(const std::string& body) {
  std::string s = body.substr(0, 200);
  for (auto& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  return body.size() > 200 ? s + "..." : s;
}

bool retryable_status(int status) {
  return status == 408 || status == 429 || status >= 500;
}

double jitter(double max_s) {
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return std::uniform_real_distribution<double>(0.0, max_s)(rng);
}

// Retry-After in seconds (the HTTP-date form is rare for APIs and is ignored).
double retry_after(const httplib::Response& res) {
  if (!res.has_header("Retry-After")) return 0.0;
  try {
    return std::max(0.0, std::stod(res.get_header_value("Retry-After")));
  } catch (const std::exception&) {
    return 0.0;
  }
}

}  // namespace

struct Transport::Attempt {
  bool ok = false;
  bool retryable = false;
  int status = 0;
  double wait_hint_s = 0.0;
  json body;
  std::string error;
};

Transport::Transport(TransportOptions options) : options_(std::move(options)) {
  if (options_.slots < 1)
    throw Error("concurrency is " + std::to_string(options_.slots) + " (allowed: >= 1)");
  if (!(options_.timeout_s > 0))
    throw Error("timeout is " + std::to_string(options_.timeout_s) + " s (allowed: > 0)");
  if (options_.retry.retries < 0 || options_.retry.max_total_retries < 0)
    throw Error("retries must be >= 0");
  const auto secs = static_cast<time_t>(options_.timeout_s);
  const auto usecs = static_cast<time_t>((options_.timeout_s - static_cast<double>(secs)) * 1e6);
  for (int i = 0; i < options_.slots; ++i) {
    auto c = std::make_unique<httplib::Client>(options_.url.origin());
    if (!c->is_valid())
      throw Error("endpoint " + options_.url.origin() +
                  ": cannot create an HTTP client (https "
                  "needs cpp-httplib with OpenSSL)");
    c->set_connection_timeout(secs, usecs);
    c->set_read_timeout(secs, usecs);
    c->set_write_timeout(secs, usecs);
    c->set_keep_alive(true);
    // Headers and body go out in separate writes: with Nagle's algorithm the body waits for the
    // server's delayed ACK (40 ms per request on Linux).
    c->set_tcp_nodelay(true);
    if (!options_.api_key.empty()) c->set_bearer_token_auth(options_.api_key);
    clients_.push_back(std::move(c));
  }
}

Transport::~Transport() = default;

Transport::Attempt Transport::attempt(int slot, const std::string& method, const std::string& route,
                                      const std::string& body) {
  Attempt a;
  ++attempts_;
  httplib::Client& c = *clients_.at(static_cast<size_t>(slot));
  const std::string path = options_.url.path(route);
  httplib::Result res = method == "GET" ? c.Get(path) : c.Post(path, body, "application/json");
  if (!res) {
    ++connection_errors_;
    a.retryable = true;
    a.error = "no response (" + httplib::to_string(res.error()) + ")";
    return a;
  }
  a.status = res->status;
  if (res->status < 200 || res->status >= 300) {
    if (res->status == 429) ++http_429_;
    if (res->status >= 500) ++http_5xx_;
    a.retryable = retryable_status(res->status);
    a.wait_hint_s = retry_after(*res);
    a.error = "HTTP " + std::to_string(res->status) + ": " + snippet(res->body);
    return a;
  }
  try {
    a.body = json::parse(res->body);
    a.ok = true;
  } catch (const json::exception&) {
    // A truncated or garbled body (a proxy cutting the stream) is usually transient.
    ++bad_json_;
    a.retryable = true;
    a.error = "HTTP " + std::to_string(res->status) +
              " with a body that is not JSON: " + snippet(res->body);
  }
  return a;
}

bool Transport::take_retry() {
  int64_t used = retries_.load();
  while (used < options_.retry.max_total_retries)
    if (retries_.compare_exchange_weak(used, used + 1)) return true;
  return false;
}

json Transport::request(int slot, const std::string& method, const std::string& route,
                        const std::string& body) {
  ++requests_;
  const RetryPolicy& p = options_.retry;
  for (int k = 0;; ++k) {
    Attempt a = attempt(slot, method, route, body);
    if (a.ok) return std::move(a.body);
    std::string why;
    if (!a.retryable)
      why = "";
    else if (k >= p.retries)
      why = " (gave up after " + std::to_string(k) + " retries)";
    else if (!take_retry())
      why = " (the run's retry budget of " + std::to_string(p.max_total_retries) +
            " is spent; --max-total-retries raises it)";
    if (!a.retryable || !why.empty()) {
      ++failed_;
      throw RequestFailed(method + " " + options_.url.url(route) + ": " + a.error + why, a.status);
    }
    const double cap = std::min(p.max_delay_s, p.base_delay_s * std::pow(2.0, k));
    const double wait = std::max(std::min(a.wait_hint_s, p.max_delay_s), jitter(cap));
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
}

json Transport::post(int slot, const std::string& route, const json& body) {
  return request(slot, "POST", route, body.dump());
}

json Transport::get(int slot, const std::string& route) {
  return request(slot, "GET", route, "");
}

TransportStats Transport::stats() const {
  TransportStats s;
  s.requests = requests_.load();
  s.attempts = attempts_.load();
  s.retries = retries_.load();
  s.failed = failed_.load();
  s.http_429 = http_429_.load();
  s.http_5xx = http_5xx_.load();
  s.connection_errors = connection_errors_.load();
  s.bad_json = bad_json_.load();
  return s;
}

void parallel_for(int slots, size_t n, const std::function<void(int, size_t)>& fn) {
  const size_t threads = std::min(n, static_cast<size_t>(std::max(1, slots)));
  if (threads <= 1) {
    for (size_t i = 0; i < n; ++i) fn(0, i);
    return;
  }
  std::atomic<size_t> next{0};
  std::vector<std::thread> pool;
  for (size_t t = 0; t < threads; ++t)
    pool.emplace_back([&, slot = static_cast<int>(t)] {
      for (size_t i = next++; i < n; i = next++) fn(slot, i);
    });
  for (auto& t : pool) t.join();
}

}  // namespace phasekv
