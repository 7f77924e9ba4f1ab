// A llama.cpp `llama-server` look-alike for the audit tests (test_audit_llamacpp.cpp). Its JSON
// follows llama.cpp's tools/server/README.md and what a real llama-server answered (issue 21):
//   GET  /v1/models   {"object":"list","data":[{"id","object":"model","owned_by":"llamacpp",
//                     "meta":{"vocab_type","n_vocab","n_ctx_train","n_embd","n_params","size"}}]}
//   GET  /props       {"default_generation_settings":{"id":0,"n_ctx":<per slot>,...},
//                      "total_slots":2,"model_path",...}
//   POST /tokenize    {content, add_special} -> {"tokens":[ids]}
//   POST /detokenize  {tokens} -> {"content": text}
//   POST /completion  {prompt: ids, n_predict, n_probs, logit_bias, return_tokens, ...} ->
//                     {"content","tokens" (empty unless return_tokens),"id_slot","stop","model",
//                      "tokens_predicted","tokens_evaluated","tokens_cached","stop_type",
//                      "truncated","timings",...,"completion_probabilities":[{"id","logprob",
//                      "token","bytes","top_logprobs":[{"id","logprob","token","bytes"}]}]}
// and the three behaviours the real server showed:
//   - completion_probabilities is omitted when the sampled token is an incomplete UTF-8
//     sequence: {"content":"\ufffd","tokens":[],...}; n_probs come from the logits before
//     sampling, so logit_bias changes the sampled token only;
//   - generation whose text ends inside a UTF-8 character is HTTP 500 {"error":{"code":500,
//     "message":"The model produced output that does not match the expected Content-only
//     format","type":"server_error"}};
//   - a prompt of n_ctx tokens or more is HTTP 400 {"error":{"code":400,"message":"request (N
//     tokens) exceeds the available context size (M tokens), try increasing it","type":
//     "exceed_context_size_error","n_prompt_tokens":N,"n_ctx":M}}.
// Its model reads the text-kv prompts of the audit (backend/http_text_task.h) by induction: the
// answer is what followed the query's last 7 tokens earlier in the prompt. A planted weak spot:
// when that earlier key sits at a position p with p mod 4 == 3 (weak_period: 4), the greedy token
// is the lone UTF-8 lead byte 0xC3 instead (a period-4 artifact that a blind audit must find).
#pragma once
#include <httplib.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "toy_tokenizer.h"

namespace phasekv::test {

class FakeLlamaServer {
 public:
  static constexpr int kSuffix = 7;  // the query's tail that names the record: key .. " value" " "

  explicit FakeLlamaServer(int n_ctx = 4096) : toy_(false), n_ctx_(n_ctx) {
    byte_token_ = toy_.id("\xC3");
    server_.new_task_queue = [] { return new httplib::ThreadPool(32); };
    server_.set_keep_alive_timeout(1);
    server_.set_tcp_nodelay(true);
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"../models/toy-q8_0.gguf","object":"model",
        "created":1735142223,"owned_by":"llamacpp","meta":{"vocab_type":2,"n_vocab":261,
        "n_ctx_train":8192,"n_embd":64,"n_params":1234567,"size":2469134}}]})",
                      "application/json");
    });
    server_.Get("/props", [this](const httplib::Request&, httplib::Response& res) {
      const nlohmann::json j = {{"default_generation_settings",
                                 {{"id", 0},
                                  {"id_task", -1},
                                  {"n_ctx", n_ctx_},
                                  {"speculative", false},
                                  {"is_processing", false},
                                  {"params", {{"n_predict", -1}, {"n_probs", 0}}}}},
                                {"total_slots", 2},
                                {"model_path", "../models/toy-q8_0.gguf"},
                                {"build_info", "b6000-fake"}};
      res.set_content(j.dump(), "application/json");
    });
    server_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      const auto j = nlohmann::json::parse(req.body);
      const auto ids = toy_.encode(j.at("content"), j.value("add_special", false));
      res.set_content(nlohmann::json({{"tokens", ids}}).dump(), "application/json");
    });
    server_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      const auto j = nlohmann::json::parse(req.body);
      res.set_content(nlohmann::json({{"content", toy_.decode(j.at("tokens"))}}).dump(),
                      "application/json");
    });
    server_.Post("/completion", [this](const httplib::Request& req, httplib::Response& res) {
      completion(req, res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FakeLlamaServer() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  ToyTokenizer& toy() { return toy_; }
  int32_t byte_token() const { return byte_token_; }

  std::atomic<int> completions{0};  // POST /completion answered (any status)
  // The prompt length and cache_prompt of every /completion past the rate limits, in order.
  std::vector<std::pair<int, bool>> completion_log() {
    std::lock_guard<std::mutex> lock(mutex_);
    return log_;
  }
  std::atomic<int> refused_utf8{0};  // of them, HTTP 500 for invalid UTF-8 output
  // Rate limiting: more than max_in_flight concurrent /completion requests get 429 with
  // Retry-After: retry_after (0 = off); first_attempt_429 answers every body's first attempt 429.
  std::atomic<int> max_in_flight{0};
  std::string retry_after = "0";
  std::atomic<bool> first_attempt_429{false};
  std::atomic<int> http_429{0};
  std::atomic<int> peak_in_flight{0};
  std::atomic<int> work_ms{0};      // time each /completion takes
  std::atomic<int> weak_period{4};  // the planted weak spot: key positions p mod P == P - 1

  // The model: the answer and the greedy token after `prompt` (the byte token at a weak spot).
  struct Prediction {
    int32_t answer = -1, greedy = -1;
    size_t match = 0;  // where the query's tail occurred earlier
  };
  Prediction predict(const std::vector<int32_t>& prompt) {
    Prediction p;
    if (prompt.size() <= kSuffix) return p;
    const size_t tail = prompt.size() - kSuffix;
    for (size_t i = tail; i-- > 0;) {
      if (std::equal(prompt.begin() + static_cast<long>(tail), prompt.end(),
                     prompt.begin() + static_cast<long>(i))) {
        p.match = i;
        p.answer = prompt[i + kSuffix];
        const size_t period = static_cast<size_t>(weak_period.load());
        p.greedy = i % period == period - 1 ? byte_token_ : p.answer;
        return p;
      }
    }
    return p;
  }

 private:
  static void fail(httplib::Response& res, int status, const nlohmann::json& error) {
    res.status = status;
    res.set_content(nlohmann::json({{"error", error}}).dump(), "application/json");
  }

  nlohmann::json entry(int32_t id, double lp) {
    const std::string piece = toy_.decode({id});
    nlohmann::json bytes = nlohmann::json::array();
    for (unsigned char c : piece) bytes.push_back(c);
    const bool valid = id != byte_token_;
    return {{"id", id}, {"logprob", lp}, {"token", valid ? piece : ""}, {"bytes", bytes}};
  }

  void completion(const httplib::Request& req, httplib::Response& res) {
    ++completions;
    struct InFlight {
      explicit InFlight(FakeLlamaServer& s) : s(s) {
        const int now = ++s.in_flight_;
        int peak = s.peak_in_flight.load();
        while (now > peak && !s.peak_in_flight.compare_exchange_weak(peak, now)) {
        }
      }
      ~InFlight() { --s.in_flight_; }
      FakeLlamaServer& s;
    } in_flight(*this);
    if (work_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(work_ms.load()));
    bool first = false;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      first = seen_.insert(req.body).second;
    }
    if ((max_in_flight > 0 && in_flight_ > max_in_flight) || (first_attempt_429 && first)) {
      ++http_429;
      res.set_header("Retry-After", retry_after);
      return fail(res, 429, {{"code", 429}, {"message", "slow down"}, {"type", "unavailable"}});
    }
    const auto j = nlohmann::json::parse(req.body);
    const std::vector<int32_t> prompt = j.at("prompt");
    const int n = static_cast<int>(prompt.size());
    {
      std::lock_guard<std::mutex> lock(mutex_);
      log_.push_back({n, j.value("cache_prompt", true)});
    }
    if (n >= n_ctx_)
      return fail(res, 400,
                  {{"code", 400},
                   {"message", "request (" + std::to_string(n) +
                                   " tokens) exceeds the available context size (" +
                                   std::to_string(n_ctx_) + " tokens), try increasing it"},
                   {"type", "exceed_context_size_error"},
                   {"n_prompt_tokens", n},
                   {"n_ctx", n_ctx_}});
    const int n_predict = j.value("n_predict", 1);
    const int n_probs = j.value("n_probs", 0);
    int32_t bias_id = -1;
    if (j.contains("logit_bias"))
      for (const auto& b : j["logit_bias"])
        if (b[1].is_number() && b[1].get<double>() > 0) bias_id = b[0];
    // Greedy generation: the record's value by induction, or the lone lead byte at a weak spot.
    const Prediction p = predict(prompt);
    std::vector<int32_t> out;
    for (int k = 0; k < n_predict; ++k) {
      int32_t next = -1;
      if (k == 0) {
        next = bias_id >= 0 ? bias_id : p.greedy;
      } else if (p.answer >= 0 && p.greedy == p.answer) {
        next = prompt[p.match + kSuffix + static_cast<size_t>(k)];  // the value goes on
      }
      if (next < 0) next = toy_.id(".");
      out.push_back(next);
      if (next == byte_token_) break;  // the text now ends inside a character
    }
    std::string text = toy_.decode(out);
    const bool incomplete = !out.empty() && out.back() == byte_token_;
    // One token: the answer is {"content":"\ufffd","tokens":[]} without probabilities (below);
    // more: the output parser refuses the text.
    if (incomplete && n_predict > 1) {
      ++refused_utf8;
      return fail(res, 500,
                  {{"code", 500},
                   {"message",
                    "The model produced output that does not match the expected Content-only "
                    "format"},
                   {"type", "server_error"}});
    }
    nlohmann::json body = {
        {"index", 0},
        {"content", incomplete ? std::string("\xEF\xBF\xBD") : text},
        {"tokens", j.value("return_tokens", false) && !incomplete ? nlohmann::json(out)
                                                                  : nlohmann::json::array()},
        {"id_slot", 0},
        {"stop", true},
        {"model", "../models/toy-q8_0.gguf"},
        {"tokens_predicted", static_cast<int>(out.size())},
        {"tokens_evaluated", n},
        {"generation_settings", {{"n_ctx", n_ctx_}, {"n_predict", n_predict}}},
        {"prompt", toy_.decode(prompt)},
        {"has_new_line", false},
        {"truncated", false},
        {"stop_type", "limit"},
        {"stopping_word", ""},
        {"tokens_cached", n},  // the slot's cache after the request, not the tokens reused
        {"timings",
         {{"cache_n", 0},
          {"prompt_n", n},
          {"prompt_ms", 1.0},
          {"predicted_n", out.size()},
          {"predicted_ms", 1.0}}}};
    // Probabilities only once the generated text is valid UTF-8, from the logits before
    // sampling: the greedy token first, the answer next (when it is another token).
    if (n_probs > 0 && !incomplete) {
      nlohmann::json top = nlohmann::json::array();
      if (p.greedy >= 0) {
        top.push_back(entry(p.greedy, -0.1));
        if (p.answer != p.greedy) top.push_back(entry(p.answer, -2.5));
      }
      for (int32_t filler : {toy_.id(" the"), toy_.id(".")})
        if (static_cast<int>(top.size()) < n_probs) top.push_back(entry(filler, -6.0));
      while (static_cast<int>(top.size()) > n_probs) top.erase(top.size() - 1);
      nlohmann::json first = entry(out.front(), out.front() == p.greedy   ? -0.1
                                                : out.front() == p.answer ? -2.5
                                                                          : -9.0);
      first["top_logprobs"] = top;
      body["completion_probabilities"] = nlohmann::json::array({first});
    }
    res.set_content(body.dump(), "application/json");
  }

  ToyTokenizer toy_;
  int n_ctx_;
  int32_t byte_token_ = -1;
  httplib::Server server_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> in_flight_{0};
  std::mutex mutex_;
  std::set<std::string> seen_;
  std::vector<std::pair<int, bool>> log_;
};

}  // namespace phasekv::test
