#include "backend/http_transport.h"

#include <fmt/format.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <functional>
#include <random>
#include <thread>

#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"

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

}  // namespace

// Retry-After: delay-seconds, or an HTTP date (RFC 9110: "Sun, 06 Nov 1994 08:49:37 GMT"); -1
// when absent or unreadable.
double parse_retry_after(const std::string& value, std::time_t now) {
  if (value.empty()) return -1.0;
  if (value.find_first_not_of("0123456789") == std::string::npos) {
    try {
      return std::stod(value);
    } catch (const std::exception&) {
      return -1.0;
    }
  }
  std::tm tm{};
  const char* end = strptime(value.c_str(), "%a, %d %b %Y %H:%M:%S GMT", &tm);
  if (end == nullptr || *end != '\0') return -1.0;
  return std::max(0.0, std::difftime(timegm(&tm), now));
}

namespace {

double retry_after(const httplib::Response& res) {
  if (!res.has_header("Retry-After")) return -1.0;
  return parse_retry_after(res.get_header_value("Retry-After"), std::time(nullptr));
}

}  // namespace

struct Transport::Attempt {
  bool ok = false;
  bool retryable = false;
  int status = 0;
  double wait_hint_s = -1.0;  // Retry-After, -1 when none
  json body;
  std::string raw;  // the body of a failed answer (first 4 KiB)
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
  limit_ = min_limit_ = options_.slots;
  if (!options_.cache_dir.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(options_.cache_dir, ec);
    if (ec || !std::filesystem::is_directory(options_.cache_dir))
      throw Error("--request-cache " + options_.cache_dir + ": cannot create the directory (" +
                  ec.message() + ")");
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
    // A read error is also what a timeout looks like: name the limit, since a long prompt's
    // prefill (minutes at 128K tokens on a CPU server) outlasts the default.
    if (res.error() == httplib::Error::Read)
      a.error += ": the connection closed or nothing came within --timeout-s " +
                 fmt::format("{:g}", options_.timeout_s) +
                 " s (a long prompt may need a larger one)";
    return a;
  }
  a.status = res->status;
  if (res->status < 200 || res->status >= 300) {
    if (res->status == 429) ++http_429_;
    if (res->status >= 500) ++http_5xx_;
    a.raw = res->body.substr(0, 4096);
    a.retryable = retryable_status(res->status) &&
                  !(options_.permanent && options_.permanent(res->status, res->body));
    if (res->status == 429 || res->status == 503) a.wait_hint_s = retry_after(*res);
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

int64_t Transport::acquire() {
  if (!options_.adaptive.enabled) return 0;
  std::unique_lock<std::mutex> lock(limit_mutex_);
  limit_cv_.wait(lock, [&] { return in_flight_ < limit_; });
  ++in_flight_;
  return decreases_;
}

void Transport::release(int status, int64_t generation) {
  if (!options_.adaptive.enabled) return;
  {
    std::lock_guard<std::mutex> lock(limit_mutex_);
    --in_flight_;
    if (status == 429) {
      successes_ = 0;
      if (limit_ > 1 && generation == decreases_) {  // the first 429 of this burst
        limit_ = std::max(1, limit_ / 2);
        min_limit_ = std::min(min_limit_, limit_);
        ++decreases_;
      }
    } else if (status >= 200 && status < 300 && limit_ < options_.slots && ++successes_ >= limit_) {
      ++limit_;
      successes_ = 0;
    }
  }
  limit_cv_.notify_all();
}

json Transport::request(int slot, const std::string& method, const std::string& route,
                        const std::string& body) {
  ++requests_;
  const RetryPolicy& p = options_.retry;
  for (int k = 0;; ++k) {
    const int64_t generation = acquire();
    Attempt a = attempt(slot, method, route, body);
    release(a.ok ? 200 : a.status, generation);
    if (a.ok) return std::move(a.body);
    std::string why;
    if (!a.retryable)
      why = "";
    else if (a.wait_hint_s > p.max_retry_after_s)
      why = fmt::format(" (Retry-After asks for {:.0f} s, more than the {:.0f} s allowed)",
                        a.wait_hint_s, p.max_retry_after_s);
    else if (k >= p.retries)
      why = " (gave up after " + std::to_string(k) + " retries)";
    else if (!take_retry())
      why = " (the run's retry budget of " + std::to_string(p.max_total_retries) +
            " is spent; --max-total-retries raises it)";
    if (!a.retryable || !why.empty()) {
      ++failed_;
      throw RequestFailed(method + " " + options_.url.url(route) + ": " + a.error + why, a.status,
                          a.raw);
    }
    const double cap = std::min(p.max_delay_s, p.base_delay_s * std::pow(2.0, k));
    double wait = jitter(cap);
    if (a.wait_hint_s >= 0) {  // the server said when: at least that long
      wait = std::max(wait, a.wait_hint_s);
      ++retry_after_waits_;
      std::lock_guard<std::mutex> lock(limit_mutex_);
      retry_after_wait_s_ += a.wait_hint_s;
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(wait));
  }
}

json Transport::post(int slot, const std::string& route, const json& body, bool* from_cache) {
  if (from_cache) *from_cache = false;
  if (options_.cache_dir.empty()) return request(slot, "POST", route, body.dump());
  json keyed = body;
  if (keyed.is_object()) keyed.erase("cache_salt");  // random per request, not part of the ask
  const std::string key = "POST " + options_.url.url(route) + "\n" + keyed.dump();
  const std::string path =
      (std::filesystem::path(options_.cache_dir) / (fnv1a64_hex(key) + ".json")).string();
  if (std::filesystem::exists(path)) {
    try {
      json entry = json::parse(read_file(path));
      if (entry.value("request", "") == key && entry.contains("response")) {
        ++cache_hits_;
        if (from_cache) *from_cache = true;
        return std::move(entry["response"]);
      }
    } catch (const std::exception&) {  // a torn or foreign file: ask the server again
    }
  }
  json response = request(slot, "POST", route, body.dump());
  write_file_atomic(path, json({{"request", key}, {"response", response}}).dump() + "\n");
  ++cache_stores_;
  return response;
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
  s.retry_after_waits = retry_after_waits_.load();
  s.cache_hits = cache_hits_.load();
  s.cache_stores = cache_stores_.load();
  std::lock_guard<std::mutex> lock(limit_mutex_);
  s.retry_after_wait_s = retry_after_wait_s_;
  s.concurrency_limit = limit_;
  s.min_concurrency_limit = min_limit_;
  s.concurrency_decreases = decreases_;
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
