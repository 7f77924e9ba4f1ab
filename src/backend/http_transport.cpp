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

// A 429/503 is busy (not a failure) while some request was answered this recently.
constexpr int64_t kBusyWindowNs = 10'000'000'000;

int64_t steady_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
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
  // The flags' names: every caller (audit, probe, sweep over HTTP) takes them under these names.
  if (options_.slots < 1)
    throw Error("--concurrency is " + std::to_string(options_.slots) + " (allowed: >= 1)");
  if (!(options_.timeout_s > 0))
    throw Error(fmt::format("--timeout-s is {:g} (allowed: > 0 seconds)", options_.timeout_s));
  if (options_.retry.retries < 0)
    throw Error("--retries is " + std::to_string(options_.retry.retries) + " (allowed: >= 0)");
  if (options_.retry.max_total_retries < 0)
    throw Error("--max-total-retries is " + std::to_string(options_.retry.max_total_retries) +
                " (allowed: >= 0)");
  if (!(options_.retry.give_up_after_s >= 0))
    throw Error(fmt::format("--give-up-after-s is {:g} (allowed: >= 0 seconds; 0 = never)",
                            options_.retry.give_up_after_s));
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
  conn_busy_.assign(static_cast<size_t>(options_.slots), 0);
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
    if (res->status == 503) ++http_503_;
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

Transport::Lease Transport::acquire(int slot) {
  if (!options_.adaptive.enabled) return {slot, 0};
  std::unique_lock<std::mutex> lock(limit_mutex_);
  limit_cv_.wait(lock, [&] { return in_flight_ < limit_; });
  ++in_flight_;
  Lease lease{0, decreases_};
  while (conn_busy_[static_cast<size_t>(lease.conn)]) ++lease.conn;  // < slots: in_flight < limit
  conn_busy_[static_cast<size_t>(lease.conn)] = 1;
  return lease;
}

void Transport::release(const Lease& lease, int status) {
  if (!options_.adaptive.enabled) return;
  {
    std::lock_guard<std::mutex> lock(limit_mutex_);
    --in_flight_;
    conn_busy_[static_cast<size_t>(lease.conn)] = 0;
    if (status == 429 || status == 503) {
      successes_ = 0;
      if (limit_ > 1 && lease.generation == decreases_) {  // the first 429/503 of this burst
        limit_ = std::max(1, limit_ / 2);
        min_limit_ = std::min(min_limit_, limit_);
        ++decreases_;
        // Idle connections above the new limit would keep holding the server's capacity.
        for (int c = limit_; c < options_.slots; ++c)
          if (!conn_busy_[static_cast<size_t>(c)]) clients_[static_cast<size_t>(c)]->stop();
      }
    } else if (status >= 200 && status < 300 && limit_ < options_.slots && ++successes_ >= limit_) {
      ++limit_;
      successes_ = 0;
    }
    if (lease.conn >= limit_) clients_[static_cast<size_t>(lease.conn)]->stop();
  }
  limit_cv_.notify_all();
}

void Transport::note_success() {
  last_answer_ns_ = steady_ns();
  if (options_.retry.give_up_after_s <= 0) return;
  std::lock_guard<std::mutex> lock(down_mutex_);
  failing_since_ = {};
}

void Transport::note_failure(const std::string& error, bool budget_spent) {
  if (options_.retry.give_up_after_s <= 0 || down_) return;
  const auto now = std::chrono::steady_clock::now();
  std::lock_guard<std::mutex> lock(down_mutex_);
  if (failing_since_ == std::chrono::steady_clock::time_point{}) failing_since_ = now;
  const double failing_s = std::chrono::duration<double>(now - failing_since_).count();
  if (failing_s < options_.retry.give_up_after_s && !budget_spent) return;
  down_reason_ = fmt::format(
      "{} answered nothing for {:.0f} s: every attempt failed{} (last: {}); stopped instead of "
      "retrying every item (--give-up-after-s {:g})",
      options_.url.origin(), failing_s,
      budget_spent ? fmt::format(" and the run's retry budget of {} is spent",
                                 options_.retry.max_total_retries)
                   : "",
      error, options_.retry.give_up_after_s);
  down_ = true;
}

std::string Transport::down_reason() const {
  if (!down_) return "";
  std::lock_guard<std::mutex> lock(down_mutex_);
  return down_reason_;
}

json Transport::request(int slot, const std::string& method, const std::string& route,
                        const std::string& body) {
  ++requests_;
  const RetryPolicy& p = options_.retry;
  int counted = 0;  // retries that count against p.retries (all but busy ones, see the header)
  for (int k = 0;; ++k) {
    if (down_) {
      ++failed_;
      throw RequestFailed(method + " " + options_.url.url(route) + ": not sent: " + down_reason(),
                          0);
    }
    const Lease lease = acquire(slot);
    Attempt a = attempt(lease.conn, method, route, body);
    release(lease, a.ok ? 200 : a.status);
    if (a.ok) {
      note_success();
      return std::move(a.body);
    }
    // A 429/503 while other requests get answers: the server is alive and busy, not failing.
    const int64_t last = last_answer_ns_.load();
    const bool busy =
        (a.status == 429 || a.status == 503) && last != 0 && steady_ns() - last < kBusyWindowNs;
    if (a.status != 429 && !busy) note_failure(a.error, false);
    std::string why;
    if (!a.retryable)
      why = "";
    else if (a.wait_hint_s > p.max_retry_after_s)
      why = fmt::format(" (Retry-After asks for {:.0f} s, more than the {:.0f} s allowed)",
                        a.wait_hint_s, p.max_retry_after_s);
    else if (down_)
      why = " (" + down_reason() + ")";
    else if (busy)
      ++busy_retries_;
    else if (counted >= p.retries)
      why = " (gave up after " + std::to_string(counted) + " retries)";
    else if (!take_retry()) {
      why = " (the run's retry budget of " + std::to_string(p.max_total_retries) +
            " is spent; --max-total-retries raises it)";
      if (a.status != 429) note_failure(a.error, true);
    } else
      ++counted;
    if (!a.retryable || !why.empty()) {
      ++failed_;
      throw RequestFailed(method + " " + options_.url.url(route) + ": " + a.error + why, a.status,
                          a.raw);
    }
    // Busy retries back off like the others, their exponent capped so a long busy spell keeps
    // polling every few seconds.
    const int exponent = busy ? std::min(k, 4) : k;
    const double cap = std::min(p.max_delay_s, p.base_delay_s * std::pow(2.0, exponent));
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
  s.http_503 = http_503_.load();
  s.busy_retries = busy_retries_.load();
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
