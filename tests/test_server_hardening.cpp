// `phasekv serve` under hostile clients (issue 20 items 6, 7, 10, 11), over real sockets with
// tiny timeouts so the suite stays fast: chunked and absurd bodies are answered at once without
// being read, stalled and slow clients hold no request thread and are cut at --read-timeout,
// a full queue answers 503 with Retry-After, /health answers throughout, 64 keep-alive clients
// are all served; wrong methods get 405 with Allow; one request's log-probability entries are
// capped; unknown fields are reported and `stop` is refused; --log-requests logs the requests
// refused before they reached a handler.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "served.h"
#include "server/http_front.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
using Clock = std::chrono::steady_clock;
using test::post;
using test::Served;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A raw client socket: what httplib's client cannot send (bad framing, stalls, trickles).
class Raw {
 public:
  explicit Raw(int port, double recv_timeout_s = 5) {
    fd_ = ::socket(AF_INET, SOCK_STREAM, 0);
    timeval tv{static_cast<time_t>(recv_timeout_s),
               static_cast<suseconds_t>((recv_timeout_s - static_cast<int>(recv_timeout_s)) * 1e6)};
    ::setsockopt(fd_, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    timeval snd{2, 0};
    ::setsockopt(fd_, SOL_SOCKET, SO_SNDTIMEO, &snd, sizeof(snd));
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ok_ = ::connect(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
  }
  ~Raw() {
    if (fd_ >= 0) ::close(fd_);
  }
  Raw(const Raw&) = delete;
  Raw& operator=(const Raw&) = delete;
  bool ok() const { return ok_; }
  // False once the server has closed or reset the connection.
  bool send(const std::string& s) {
    size_t off = 0;
    while (off < s.size()) {
      const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
      if (n <= 0) return false;
      off += static_cast<size_t>(n);
    }
    return true;
  }
  // One response: its head and a Content-Length body; "" on timeout or close before any byte.
  std::string response() {
    std::string r;
    char buf[4096];
    for (;;) {
      const size_t head_end = r.find("\r\n\r\n");
      if (head_end != std::string::npos) {
        const size_t cl = r.find("Content-Length: ");
        const size_t len = cl == std::string::npos ? 0 : std::stoul(r.substr(cl + 16));
        if (r.size() >= head_end + 4 + len) return r;
      }
      const ssize_t n = ::recv(fd_, buf, sizeof(buf), 0);
      if (n <= 0) return r;
      r.append(buf, static_cast<size_t>(n));
    }
  }

 private:
  int fd_ = -1;
  bool ok_ = false;
};

int status_of(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0) return 0;
  return std::stoi(response.substr(9, 3));
}

std::string body_of(const std::string& response) {
  const size_t p = response.find("\r\n\r\n");
  return p == std::string::npos ? "" : response.substr(p + 4);
}

std::string head(const std::string& method, const std::string& path, const std::string& extra) {
  return method + " " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\n" + extra + "\r\n";
}

// GET /health through httplib's client: its status and how long it took.
std::pair<int, double> health(int port) {
  httplib::Client c("127.0.0.1", port);
  c.set_connection_timeout(2);
  c.set_read_timeout(2);
  const auto t = Clock::now();
  auto res = c.Get("/health");
  return {res ? res->status : 0, since(t)};
}

ServerOptions small_options() {
  ServerOptions o;
  o.max_body_bytes = 64 << 10;
  o.read_timeout_s = 1.0;
  return o;
}

const std::string kTokenize = R"({"prompt": "k1"})";

// ---------------------------------------------------------------------------------------------
// Item 6: bodies are cut at --max-body-bytes whatever their framing; bad lengths answer at once.

TEST(ServerBodies, ChunkedBodyOverTheLimitIs413WithoutBeingRead) {
  Served s(small_options());
  Raw c(s.port());
  ASSERT_TRUE(c.ok());
  std::atomic<size_t> sent{0};
  std::atomic<bool> done{false};
  const size_t total = size_t{120} << 20;  // the red team's 120 MB
  std::thread writer([&] {
    if (!c.send(head("POST", "/v1/completions",
                     "Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n")))
      return;
    const std::string chunk = "10000\r\n" + std::string(65536, ' ') + "\r\n";
    while (!done && sent < total && c.send(chunk)) sent += 65536;
  });
  const auto t = Clock::now();
  const std::string r = c.response();
  const double took = since(t);
  done = true;
  writer.join();
  EXPECT_EQ(status_of(r), 413) << r.substr(0, 300);
  EXPECT_CONTAINS(body_of(r), "--max-body-bytes") << r;
  EXPECT_CONTAINS(r, "Connection: close");
  EXPECT_LT(took, 3.0);
  // The server stopped reading: the writer got no further than socket buffers and the drain.
  EXPECT_LT(sent.load(), size_t{48} << 20) << "the server read the body on";
}

TEST(ServerBodies, ChunkedBodyUnderTheLimitIsServed) {
  Served s(small_options());
  Raw c(s.port());
  const std::string body = kTokenize;
  char size[16];
  std::snprintf(size, sizeof(size), "%zx", body.size());
  ASSERT_TRUE(c.send(head("POST", "/tokenize", "Transfer-Encoding: chunked\r\n") + size + "\r\n" +
                     body + "\r\n0\r\n\r\n"));
  const std::string r = c.response();
  ASSERT_EQ(status_of(r), 200) << r;
  EXPECT_EQ(json::parse(body_of(r))["count"], 2);
  // The connection stays usable for the next request.
  ASSERT_TRUE(c.send(head("GET", "/health", "")));
  EXPECT_EQ(status_of(c.response()), 200);
}

TEST(ServerBodies, BadOrAbsurdContentLengthIsAnsweredAtOnce) {
  Served s(small_options());
  const std::vector<std::pair<std::string, int>> cases = {{"-5", 400},
                                                          {"abc", 400},
                                                          {"12 34", 400},
                                                          {"1000000000000", 413},
                                                          {"99999999999999999999999999", 413},
                                                          {"65537", 413}};
  for (const auto& [value, status] : cases) {
    Raw c(s.port(), 3);
    const auto t = Clock::now();
    ASSERT_TRUE(c.send(head("POST", "/v1/completions", "Content-Length: " + value + "\r\n")));
    const std::string r = c.response();  // the body never comes; the answer must not wait for it
    EXPECT_EQ(status_of(r), status) << "Content-Length " << value << ": " << r;
    EXPECT_LT(since(t), 1.0) << "Content-Length " << value;
    const json e = json::parse(body_of(r), nullptr, false);
    ASSERT_TRUE(e.is_object() && e.contains("error")) << r;
    EXPECT_CONTAINS(e["error"]["message"].get<std::string>(),
                    status == 413 ? "--max-body-bytes" : "Content-Length")
        << r;
  }
  // Both framings at once (request smuggling), an unknown transfer coding, no length at all.
  const std::vector<std::pair<std::string, int>> framing = {
      {"Content-Length: 5\r\nTransfer-Encoding: chunked\r\n", 400},
      {"Transfer-Encoding: gzip, chunked\r\n", 501},
      {"", 411}};
  for (const auto& [extra, status] : framing) {
    Raw c(s.port(), 3);
    ASSERT_TRUE(c.send(head("POST", "/tokenize", extra)));
    EXPECT_EQ(status_of(c.response()), status) << extra;
  }
}

TEST(ServerBodies, HeadCheckNamesTheProblem) {
  const size_t max = 1000;
  auto check = [&](const std::string& h) { return check_request_head(h, max); };
  EXPECT_EQ(check("GET /health HTTP/1.1\r\nHost: x\r\n\r\n").status, 0);
  EXPECT_EQ(check("GET /health?x=1 HTTP/1.1\r\n\r\n").path, "/health");
  const HeadCheck ok = check("POST /tokenize HTTP/1.1\r\ncontent-length:  1000 \r\n\r\n");
  EXPECT_EQ(ok.status, 0);
  EXPECT_EQ(ok.content_length, 1000u);
  EXPECT_TRUE(check("POST /x HTTP/1.1\r\nTransfer-Encoding: Chunked\r\n\r\n").chunked);
  EXPECT_EQ(check("POST /x HTTP/1.1\r\nContent-Length: 1001\r\n\r\n").status, 413);
  EXPECT_EQ(check("POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 6\r\n\r\n").status,
            400);
  EXPECT_EQ(check("POST /x HTTP/1.1\r\nContent-Length: 5\r\nContent-Length: 5\r\n\r\n").status, 0);
  EXPECT_EQ(check("BROKEN\r\n\r\n").status, 400);
  EXPECT_EQ(check("GET /x HTTP/1.1\r\nno colon here\r\n\r\n").status, 400);
  EXPECT_EQ(check("POST /x HTTP/1.1\r\nContent-Length: -0\r\n\r\n").message,
            "Content-Length '-0' is not a non-negative integer");
}

// ---------------------------------------------------------------------------------------------
// Item 7: slow and stalled clients, a full queue, many keep-alive clients.

TEST(ServerSlowClients, StalledConnectionsDoNotStarveHealthAndAreCutAtTheReadTimeout) {
  Served s(small_options());  // 24 request threads, --read-timeout 1 s
  // 40 clients stop in the middle of their head, 30 after a head announcing a body never sent:
  // more of each than there are request threads.
  std::vector<std::unique_ptr<Raw>> heads, bodies;
  for (int i = 0; i < 40; ++i) {
    heads.push_back(std::make_unique<Raw>(s.port(), 4));
    ASSERT_TRUE(heads.back()->send("POST /v1/completions HTTP/1.1\r\nHost: x\r\n"));
  }
  const auto started = Clock::now();
  for (int i = 0; i < 30; ++i) {
    bodies.push_back(std::make_unique<Raw>(s.port(), 4));
    ASSERT_TRUE(bodies.back()->send(head("POST", "/tokenize", "Content-Length: 100\r\n")));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  for (int i = 0; i < 5; ++i) {
    const auto [status, took] = health(s.port());
    EXPECT_EQ(status, 200);
    EXPECT_LT(took, 0.3) << "GET /health waited behind stalled clients";
  }
  // Every stalled client is answered 408 once its second has passed, naming the flag.
  int timed_out = 0;
  for (auto& c : heads) {
    const std::string r = c->response();
    EXPECT_EQ(status_of(r), 408) << r;
    timed_out += status_of(r) == 408 && body_of(r).find("--read-timeout") != std::string::npos;
  }
  for (auto& c : bodies) {
    const std::string r = c->response();
    EXPECT_EQ(status_of(r), 408) << r;
    timed_out += status_of(r) == 408;
  }
  EXPECT_EQ(timed_out, 70);
  EXPECT_LT(since(started), 3.5);
  EXPECT_EQ(post(s.port(), "/tokenize", kTokenize).status, 200);
}

TEST(ServerSlowClients, TrickledBodyIsCutAtTheReadTimeout) {
  ServerOptions o = small_options();
  o.read_timeout_s = 0.5;
  Served s(o);
  Raw c(s.port(), 4);
  ASSERT_TRUE(c.send(head("POST", "/tokenize", "Content-Length: 100\r\n")));
  const auto t = Clock::now();
  // One byte every 100 ms: each read is quick, the whole body is not.
  std::thread trickle([&] {
    for (int i = 0; i < 60 && c.send("{"); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
  });
  const std::string r = c.response();
  const double took = since(t);
  trickle.join();
  EXPECT_EQ(status_of(r), 408) << r;
  EXPECT_LT(took, 1.5);
}

TEST(ServerSlowClients, FullQueueAnswers503WithRetryAfterAndRecovers) {
  ServerOptions o = small_options();
  o.max_queue = 2;
  o.read_timeout_s = 1.5;
  Served s(o);  // 24 request threads
  std::vector<std::unique_ptr<Raw>> stalled;
  for (int i = 0; i < 26; ++i) {  // 24 hold the threads, 2 fill the queue
    stalled.push_back(std::make_unique<Raw>(s.port(), 4));
    ASSERT_TRUE(stalled.back()->send(head("POST", "/tokenize", "Content-Length: 100\r\n")));
  }
  for (int i = 0; i < 100 && s.server().waiting_requests() < 2; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(s.server().waiting_requests(), 2);
  Raw extra(s.port(), 2);
  const auto t = Clock::now();
  ASSERT_TRUE(extra.send(
      head("POST", "/tokenize", "Content-Length: " + std::to_string(kTokenize.size()) + "\r\n") +
      kTokenize));
  const std::string r = extra.response();
  EXPECT_EQ(status_of(r), 503) << r;
  EXPECT_CONTAINS(r, "Retry-After: 1");
  EXPECT_CONTAINS(body_of(r), "--max-queue") << r;
  EXPECT_LT(since(t), 0.5);
  EXPECT_EQ(health(s.port()).first, 200);
  for (auto& c : stalled) {
    const std::string rr = c->response();
    EXPECT_EQ(status_of(rr), 408) << rr;
  }
  EXPECT_EQ(post(s.port(), "/tokenize", kTokenize).status, 200);
}

TEST(ServerSlowClients, TooManyConnectionsAnswer503) {
  ServerOptions o = small_options();
  o.max_connections = 8;
  Served s(o);
  std::vector<std::unique_ptr<Raw>> idle;
  for (int i = 0; i < 8; ++i) idle.push_back(std::make_unique<Raw>(s.port()));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  Raw ninth(s.port(), 2);
  ASSERT_TRUE(ninth.send(head("GET", "/health", "")));
  const std::string r = ninth.response();
  EXPECT_EQ(status_of(r), 503) << r;
  EXPECT_CONTAINS(body_of(r), "--max-connections") << r;
  idle.clear();
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(health(s.port()).first, 200);
}

TEST(ServerSlowClients, SixtyFourKeepAliveClientsAreAllServed) {
  Served s(small_options());  // 24 request threads for 64 connections
  std::atomic<int> ok{0}, failed{0};
  std::atomic<double> worst{0};
  const auto t = Clock::now();
  std::vector<std::thread> clients;
  for (int i = 0; i < 64; ++i)
    clients.emplace_back([&] {
      httplib::Client c("127.0.0.1", s.port());
      c.set_keep_alive(true);
      c.set_read_timeout(5);
      for (int k = 0; k < 5; ++k) {
        const auto q = Clock::now();
        auto res = c.Post("/tokenize", kTokenize, "application/json");
        (res && res->status == 200 ? ok : failed)++;
        double w = worst, d = since(q);
        while (d > w && !worst.compare_exchange_weak(w, d)) {
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // idle between requests
      }
    });
  for (auto& c : clients) c.join();
  EXPECT_EQ(ok.load(), 320);
  EXPECT_EQ(failed.load(), 0);
  EXPECT_LT(worst.load(), 1.0) << "a keep-alive client waited for a thread";
  EXPECT_LT(since(t), 5.0);
}

// ---------------------------------------------------------------------------------------------
// Item 11: methods; item 10: one request's logprob entries.

TEST(ServerRoutes, WrongMethodOnAKnownPathIs405WithAllow) {
  Served s(small_options());
  httplib::Client c("127.0.0.1", s.port());
  auto get = c.Get("/v1/completions");
  ASSERT_TRUE(get);
  EXPECT_EQ(get->status, 405);
  EXPECT_EQ(get->get_header_value("Allow"), "POST");
  EXPECT_CONTAINS(get->body, "GET is not allowed on /v1/completions");
  auto p = c.Post("/health", "", "application/json");
  ASSERT_TRUE(p);
  EXPECT_EQ(p->status, 405);
  EXPECT_EQ(p->get_header_value("Allow"), "GET, HEAD");
  auto del = c.Delete("/v1/models");
  ASSERT_TRUE(del);
  EXPECT_EQ(del->status, 405);
  auto unknown = c.Get("/v2/nothing");
  ASSERT_TRUE(unknown);
  EXPECT_EQ(unknown->status, 404);
}

TEST(ServerRoutes, LogprobEntriesPerRequestAreCapped) {
  ServerOptions o = small_options();
  o.max_logprob_entries = 1000;
  Served s(o);
  std::vector<int> prompt(20, 3);
  // One prompt: (20 echoed + 1 generated) x (20 + 1) = 441 entries, allowed.
  json one = {{"prompt", prompt}, {"max_tokens", 1}, {"echo", true}, {"logprobs", 20}};
  EXPECT_EQ(post(s.port(), "/v1/completions", one.dump()).status, 200);
  // Three prompts: 1323 entries.
  json three = one;
  three["prompt"] = {prompt, prompt, prompt};
  const auto r = post(s.port(), "/v1/completions", three.dump());
  test::expect_error(r, 400, "logprobs", "1323 log-probability entries");
  EXPECT_CONTAINS(r.body.dump(), "--max-logprob-entries");
  // Chat: max_tokens x (top_logprobs + 1).
  json chat = {{"messages", {{{"role", "user"}, {"content", "k1"}}}},
               {"max_tokens", 10},
               {"logprobs", true},
               {"top_logprobs", 20}};
  EXPECT_EQ(post(s.port(), "/v1/chat/completions", chat.dump()).status, 200);
  ServerOptions tight = small_options();
  tight.max_logprob_entries = 100;
  Served t(tight);
  test::expect_error(post(t.port(), "/v1/chat/completions", chat.dump()), 400, "top_logprobs",
                     "210 log-probability entries");
}

TEST(ServerRoutes, UnknownFieldsAreIgnoredAndNamed) {
  Served s(small_options());
  httplib::Client c("127.0.0.1", s.port());
  json body = {{"prompt", {3, 4, 5}},
               {"max_tokens", 2},
               {"temperature", 0},
               {"presence_penalty", 0.5},
               {"frobnicate", true}};
  auto res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200) << res->body;
  const std::string expected =
      "ignored unknown fields [\"frobnicate\",\"presence_penalty\"] (/v1/completions does not "
      "use them)";
  EXPECT_EQ(res->get_header_value("X-Phasekv-Warning"), expected);
  const json answer = json::parse(res->body);
  EXPECT_EQ(answer["warnings"], json::array({expected}));
  EXPECT_EQ(answer["choices"][0]["text"].get<std::string>().empty(), false);
  // Known fields only: no warning at all.
  body.erase("presence_penalty");
  body.erase("frobnicate");
  res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_FALSE(res->has_header("X-Phasekv-Warning"));
  EXPECT_FALSE(json::parse(res->body).contains("warnings"));
  // Streams carry the header.
  body["stream"] = true;
  body["logit_bias"] = json::object();
  res = c.Post("/v1/completions", body.dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_CONTAINS(res->get_header_value("X-Phasekv-Warning"), "logit_bias");
  // Other routes.
  res = c.Post("/tokenize", R"({"prompt": "k1", "extra": 1})", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(json::parse(res->body)["warnings"][0],
            "ignored unknown field [\"extra\"] (/tokenize does not use them)");
}

TEST(ServerRoutes, StopIsRefusedUnlessEmpty) {
  Served s(small_options());
  const json base = {{"prompt", {3, 4, 5}}, {"max_tokens", 2}};
  for (const json& stop : {json("k1"), json::array({"a", "b"})}) {
    json b = base;
    b["stop"] = stop;
    test::expect_error(post(s.port(), "/v1/completions", b.dump()), 400, "stop",
                       "'stop' is not supported");
  }
  json ids = base;
  ids["stop_token_ids"] = {3};
  test::expect_error(post(s.port(), "/v1/completions", ids.dump()), 400, "stop_token_ids",
                     "not supported");
  json chat = {{"messages", {{{"role", "user"}, {"content", "k1"}}}}, {"stop", {"x"}}};
  test::expect_error(post(s.port(), "/v1/chat/completions", chat.dump()), 400, "stop",
                     "exactly max_tokens");
  json wrong = base;
  wrong["stop"] = 5;
  test::expect_error(post(s.port(), "/v1/completions", wrong.dump()), 400, "stop",
                     "a string or a list of strings");
  // What clients send for "no stop" is accepted.
  for (const json& none : {json(nullptr), json(""), json::array()}) {
    json b = base;
    b["stop"] = none;
    b["stop_token_ids"] = json::array();
    const auto r = post(s.port(), "/v1/completions", b.dump());
    EXPECT_EQ(r.status, 200) << r.body.dump();
    EXPECT_FALSE(r.body.contains("warnings"));
  }
}

// ---------------------------------------------------------------------------------------------
// --log-requests (issue 46): one line per answer, also for those given before a request thread
// ran (503 over --max-connections, 413 by Content-Length, a malformed head) and for a body that
// is not JSON.

// A log the poller and the request threads write while the test reads it.
class LockedLog : public std::streambuf {
 public:
  std::string text() {
    std::lock_guard<std::mutex> lock(mutex_);
    return text_;
  }

 protected:
  int overflow(int c) override {
    std::lock_guard<std::mutex> lock(mutex_);
    if (c != EOF) text_.push_back(static_cast<char>(c));
    return c;
  }
  std::streamsize xsputn(const char* s, std::streamsize n) override {
    std::lock_guard<std::mutex> lock(mutex_);
    text_.append(s, static_cast<size_t>(n));
    return n;
  }

 private:
  std::mutex mutex_;
  std::string text_;
};

TEST(ServerLog, RejectedRequestsAreLogged) {
  LockedLog buf;
  std::ostream log(&buf);
  ServerOptions o = small_options();
  o.max_connections = 3;
  o.log = &log;
  Served s(o);
  EXPECT_EQ(post(s.port(), "/tokenize", "{\"prompt\": ").status, 400);
  {
    Raw r(s.port());
    ASSERT_TRUE(r.send(head("POST", "/v1/completions", "Content-Length: 99999999\r\n")));
    EXPECT_EQ(status_of(r.response()), 413);
  }
  {
    Raw r(s.port());
    ASSERT_TRUE(r.send("NONSENSE\r\n\r\n"));
    EXPECT_EQ(status_of(r.response()), 400);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // the closed ones are gone
  {
    std::vector<std::unique_ptr<Raw>> idle;
    for (int i = 0; i < 3; ++i) idle.push_back(std::make_unique<Raw>(s.port()));
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    Raw fourth(s.port(), 2);
    ASSERT_TRUE(fourth.send(head("GET", "/health", "")));
    EXPECT_EQ(status_of(fourth.response()), 503);
  }
  const std::vector<std::string> want = {
      "POST /tokenize 400\n",
      "POST /v1/completions 413 rejected: the request body of 99999999 bytes (Content-Length) "
      "exceeds the server's limit of 65536 bytes (--max-body-bytes)\n",
      "- 400 rejected: malformed request line (expected: METHOD /path HTTP/1.1)\n",
      "- 503 rejected: the server has 3 open connections (--max-connections); retry later\n"};
  // httplib logs an answer after sending it: give the last line a moment.
  for (int i = 0; i < 100 && buf.text().find(want[0]) == std::string::npos; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  const std::string text = buf.text();
  for (const std::string& line : want) EXPECT_CONTAINS(text, line);
}

}  // namespace
}  // namespace phasekv
