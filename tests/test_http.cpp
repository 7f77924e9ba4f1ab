// The HTTP path end to end: `phasekv serve` in-process on a loopback port with a tiny random
// model, the HttpBackend against it (it must score exactly like the in-process backend), a
// fault-injecting server (drops, 429, 500, malformed JSON, slow answers), the server's request
// validation, the dialect parsers on canned responses and the text rendering of the task.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <httplib.h>
#include <unistd.h>

#include <atomic>
#include <cctype>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <mutex>
#include <set>
#include <thread>

#include "backend/http_client.h"
#include "backend/http_dialect.h"
#include "backend/http_text_task.h"
#include "backend/http_url.h"
#include "backend/local_backend.h"
#include "eval/sweep.h"
#include "model/model_dir.h"
#include "io/tokenizer.h"
#include "server/server.h"
#include "served.h"
#include "toy_tokenizer.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

TaskConfig small_task() { return test::small_kv_task(); }

fs::path temp_dir(const std::string& name) { return test::temp_dir("http_" + name); }
using test::expect_error;
using test::post;
using test::Reply;
using test::Served;
using test::ToyTokenizer;

HttpBackendOptions options_for(const std::string& endpoint, const std::string& model,
                               const std::string& dialect = "auto") {
  HttpBackendOptions o;
  o.endpoint = endpoint;
  o.model = model;
  o.dialect = dialect;
  o.concurrency = 4;
  o.timeout_s = 10;
  return o;
}

// Contexts as a sweep sends them: every phase of a few examples, ending at the target key.
std::vector<ScoreRequest> sweep_requests(int examples, int modulus) {
  std::vector<ScoreRequest> out;
  for (int e = 0; e < examples; ++e) {
    const auto lg = make_logical_example(small_task(), 3, static_cast<uint64_t>(e));
    for (int r = 0; r < modulus; ++r) {
      const TaskExample ex = materialize(lg, modulus, r, PaddingMode::kPrefix, false);
      out.push_back({ex.tokens, ex.target().answer});
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// 1. HttpBackend against `phasekv serve` equals the in-process backend.

class ServeTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { served_ = new Served(); }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  static Served* served_;
};
Served* ServeTest::served_ = nullptr;

TEST_F(ServeTest, ScoresEqualLocalBackendInBothDialectModes) {
  const auto requests = sweep_requests(3, 8);
  const auto local = served_->local().score(requests);
  for (const std::string dialect : {"vllm", "auto"}) {
    auto http = HttpBackend::open(options_for(served_->endpoint(), served_->name(), dialect));
    EXPECT_EQ(http->dialect(), Dialect::kVllm);
    // vLLM's rule: prompt (context + the echoed target) + max_tokens 1 <= max_model_len.
    EXPECT_EQ(http->max_context(), served_->local().max_context() - 2);
    EXPECT_EQ(http->context_limit()->tokens, served_->local().max_context());
    EXPECT_EQ(http->context_limit()->source, "/v1/models max_model_len");
    const auto remote = http->score(requests);
    ASSERT_EQ(remote.size(), local.size());
    for (size_t i = 0; i < local.size(); ++i) {
      ASSERT_TRUE(remote[i].error.empty()) << remote[i].error;
      EXPECT_EQ(remote[i].argmax, local[i].argmax) << "request " << i;
      EXPECT_NEAR(remote[i].target_logprob, local[i].target_logprob, 1e-4) << "request " << i;
      EXPECT_NEAR(remote[i].argmax_logprob, local[i].argmax_logprob, 1e-4) << "request " << i;
      EXPECT_FALSE(remote[i].censored);
    }
    const json d = http->describe();
    EXPECT_EQ(d["prefix_cache"], "salted per request (cache_salt)");
    EXPECT_FALSE(d.contains("stride")) << "an audit must find the stride blind";
    EXPECT_EQ(d["config_hash"], served_->local().describe()["config_hash"]);
  }
}

TEST_F(ServeTest, TokenizeDetokenizeAndGenerateMatchLocal) {
  auto http = HttpBackend::open(options_for(served_->endpoint(), served_->name()));
  const std::string text = "<bos> f1 k2 v3 f0 <q> k2";
  EXPECT_EQ(http->tokenize(text), served_->local().tokenize(text));
  const auto ids = served_->local().tokenize(text);
  EXPECT_EQ(http->detokenize(ids), text);
  EXPECT_EQ(http->generate(ids, 4), served_->local().generate(ids, 4));
  // Generate mode scores by the greedy token: the argmax, with no target logprob.
  auto o = options_for(served_->endpoint(), served_->name());
  o.mode = ScoreMode::kGenerate;
  auto gen = HttpBackend::open(o);
  const auto requests = sweep_requests(1, 4);
  const auto got = gen->score(requests);
  const auto want = served_->local().score(requests);
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].argmax, want[i].argmax);
    EXPECT_TRUE(std::isnan(got[i].target_logprob));
  }
}

TEST_F(ServeTest, SweepOverHttpEqualsInProcessSweep) {
  auto http = HttpBackend::open(options_for(served_->endpoint(), served_->name()));
  SweepOptions o;
  o.task = small_task();
  o.examples = 4;
  o.modulus = 8;
  o.seed = 5;
  o.stats.bootstrap_reps = 50;
  o.stats.permutations = 50;
  const fs::path root = temp_dir("sweep");
  o.out_dir = (root / "http").string();
  run_sweep(*http, o);
  o.out_dir = (root / "local").string();
  run_sweep(served_->local(), o);
  const auto a = read_results((root / "http" / "results.jsonl").string()).records;
  const auto b = read_results((root / "local" / "results.jsonl").string()).records;
  ASSERT_EQ(a.size(), 32u);
  std::map<std::pair<int64_t, int>, EvalRecord> local;
  for (const auto& r : b) local[{r.example_id, r.phase}] = r;
  for (const auto& r : a) {
    const EvalRecord& l = local.at({r.example_id, r.phase});
    EXPECT_EQ(r.prediction, l.prediction);
    EXPECT_EQ(r.correct, l.correct);
    EXPECT_NEAR(*r.target_logprob, *l.target_logprob, 1e-4);
    EXPECT_EQ(r.key_pos, l.key_pos);
  }
  fs::remove_all(root);
}

// `phasekv audit` (the binary) against the in-process server: blind, resumable, audit.json.
TEST_F(ServeTest, AuditCommandRunsBlindAndResumes) {
  const fs::path out = temp_dir("audit");
  const std::string cmd = std::string(PHASEKV_BINARY) + " audit --endpoint " + served_->endpoint() +
                          " --model '" + served_->name() + "' --out " + out.string() +
                          " --examples 3 --modulus 8 --bootstrap 50 --permutations 50 "
                          "--concurrency 4 > " +
                          (out / "log.txt").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file((out / "log.txt").string());
  const json audit = json::parse(read_file((out / "audit.json").string()));
  EXPECT_EQ(audit["render"], "ids");
  EXPECT_TRUE(audit["stride_given"].is_null());
  EXPECT_TRUE(audit["period"].contains("detected_period"));
  EXPECT_TRUE(audit["period"].contains("p_value"));
  EXPECT_EQ(audit["records"]["errors"], 0);
  EXPECT_EQ(read_results((out / "results.jsonl").string()).records.size(), 24u);
  const std::string log = read_file((out / "log.txt").string());
  EXPECT_CONTAINS(log, "items/s");
  EXPECT_CONTAINS(log, "detected period");
  // A rerun finds everything done and scores nothing.
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file((out / "log.txt").string());
  EXPECT_EQ(read_results((out / "results.jsonl").string()).records.size(), 24u);
  fs::remove_all(out);
}

// The SLA gate on an audit: exit 4 with one verdict line after audit.json is written when the
// worst phase's CI lower bound is below --min-worst, or when the model does not do the task; a
// resumed rerun with limits it meets exits 0.
TEST_F(ServeTest, AuditSlaGateFailsAndPasses) {
  const fs::path out = temp_dir("audit_sla");
  const std::string log = (out / "log.txt").string();
  auto audit = [&](Served& served, const std::string& run, const std::string& gate) {
    const std::string cmd = std::string(PHASEKV_BINARY) + " audit --endpoint " +
                            served.endpoint() + " --model '" + served.name() + "' --out " +
                            (out / run).string() +
                            " --examples 3 --modulus 8 --bootstrap 50 --permutations 20 "
                            "--concurrency 4 " +
                            gate + " > " + log + " 2>&1";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  // The tiny random model does not do the task (accuracy 0.000 at every phase): no limit passes
  // it, however loose, and the verdict says why instead of "no periodic weak spot detected".
  ASSERT_EQ(audit(*served_, "random", "--max-gap 100 --min-worst 0"), 4) << read_file(log);
  EXPECT_CONTAINS(read_file(log), "SLA FAILED: uninformative");
  EXPECT_CONTAINS(read_file(log), "\nuninformative: accuracy at or below the shortcut");
  // A trained model (the bundled kv-chunked, weak at its boundary phases) fails a limit it
  // misses and passes one it meets.
  Served trained({}, 40, [](const std::string& dir) {
    fs::copy(std::string(PHASEKV_SOURCE_DIR) + "/models/kv-chunked", dir,
             fs::copy_options::recursive);
  });
  ASSERT_EQ(audit(trained, "trained", "--min-worst 0.9"), 4) << read_file(log);
  EXPECT_TRUE(fs::exists(out / "trained" / "audit.json"));
  EXPECT_CONTAINS(read_file(log), "SLA FAILED: worst phase ");
  EXPECT_EQ(audit(trained, "trained", "--max-gap 100 --min-worst 0"), 0) << read_file(log);
  EXPECT_CONTAINS(read_file(log), "SLA passed: gap ");
  fs::remove_all(out);
}

// Many clients at once: every answer is a 200 and equals the serial one.
TEST_F(ServeTest, ConcurrentClientsGetConsistentAnswers) {
  const auto requests = sweep_requests(2, 4);
  const auto want = served_->local().score(requests);
  std::atomic<int> failures{0};
  std::vector<std::thread> clients;
  for (int c = 0; c < 16; ++c)
    clients.emplace_back([&] {
      auto o = options_for(served_->endpoint(), served_->name(), "vllm");
      o.concurrency = 1;
      auto http = HttpBackend::open(o);
      const auto got = http->score(requests);
      for (size_t i = 0; i < got.size(); ++i)
        if (!got[i].error.empty() || got[i].argmax != want[i].argmax) ++failures;
    });
  for (auto& t : clients) t.join();
  EXPECT_EQ(failures.load(), 0);
}

// ---------------------------------------------------------------------------------------------
// 3. Validation: JSON 4xx errors naming the field.

TEST_F(ServeTest, ValidationErrorsAreJson4xx) {
  const int port = served_->port();
  const std::string p = "/v1/completions";
  expect_error(post(port, p, R"({"prompt": 5})"), 400, "prompt", "must be");
  expect_error(post(port, p, R"({"prompt": [1, 2], "max_tokens": "3"})"), 400, "max_tokens",
               "integer");
  expect_error(post(port, p, R"({"prompt": [1, 2], "temperature": "hot"})"), 400, "temperature",
               "number");
  expect_error(post(port, p, R"({"prompt": [1, 2], "echo": 1})"), 400, "echo", "true or false");
  expect_error(post(port, p, R"({"prompt": [1, 999]})"), 400, "prompt", "outside the vocabulary");
  expect_error(post(port, p, R"({"prompt": [1, -1]})"), 400, "prompt", "outside the vocabulary");
  expect_error(post(port, p, R"({"prompt": [1, 2.5]})"), 400, "prompt", "token id");
  expect_error(post(port, p, R"({"prompt": "k1 nosuchword"})"), 400, "prompt", "nosuchword");
  expect_error(post(port, p, json({{"prompt", std::vector<int>(41, 1)}}).dump()), 400, "prompt",
               "maximum context length is 40");
  expect_error(
      post(port, p, json({{"prompt", std::vector<int>(30, 1)}, {"max_tokens", 20}}).dump()), 400,
      "max_tokens", "maximum context length");
  expect_error(post(port, p, R"({"prompt": [1, 2], "max_tokens": 5000})"), 400, "max_tokens",
               "max-tokens-limit");
  expect_error(post(port, p, R"({"prompt": [1, 2], "max_tokens": 0})"), 400, "max_tokens", "echo");
  expect_error(post(port, p, R"({"prompt": [1, 2], "logprobs": 50})"), 400, "logprobs", "0..20");
  expect_error(post(port, p, R"({"prompt": [1, 2], "stream": "yes"})"), 400, "stream",
               "true or false");
  expect_error(post(port, p, R"({"prompt": [1, 2], "stream_options": {"include_usage": true}})"),
               400, "stream_options", "only allowed with 'stream': true");
  expect_error(post(port, p, R"({"prompt": [1, 2], "model": "other"})"), 404, "model", "other");
  expect_error(post(port, p, R"({"prompt": [1, 2)"), 400, "", "not valid JSON");
  expect_error(post(port, p, R"([1, 2])"), 400, "", "JSON object");
  expect_error(post(port, "/tokenize", R"({"prompt": 3})"), 400, "prompt", "string");
  expect_error(post(port, "/detokenize", R"({"tokens": [1, 99]})"), 400, "tokens", "outside");
  expect_error(post(port, "/nope", "{}"), 404, "", "no route");
  const std::string big = R"({"prompt": ")" + std::string(9u << 20, 'a') + R"("})";
  expect_error(post(port, p, big), 413, "", "exceeds");
}

TEST_F(ServeTest, CompletionShapesFollowVllm) {
  const int port = served_->port();
  // Echo with logprobs over a text prompt: one entry per prompt and generated token.
  Reply r = post(port, "/v1/completions",
                 R"({"prompt": "f1 k2 v3 <q> k2", "max_tokens": 2, "temperature": 0,
                     "echo": true, "logprobs": 3, "add_special_tokens": false})");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  const json& lp = r.body["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 7u);
  EXPECT_TRUE(lp["token_logprobs"][0].is_null());
  EXPECT_TRUE(lp["top_logprobs"][0].is_null());
  EXPECT_TRUE(lp["token_logprobs"][1].is_number());
  EXPECT_GE(lp["top_logprobs"][1].size(), 3u);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], 5);
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 2);
  EXPECT_EQ(r.body["choices"][0]["text"].get<std::string>().rfind("f1 k2 v3 <q> k2 ", 0), 0u);
  // Sampling is reproducible with a seed.
  const std::string sample = R"({"prompt": [1, 5, 6], "max_tokens": 6, "temperature": 1.5,
                                 "seed": 42, "return_token_ids": true})";
  const Reply a = post(port, "/v1/completions", sample), b = post(port, "/v1/completions", sample);
  ASSERT_EQ(a.status, 200);
  EXPECT_EQ(a.body["choices"][0]["token_ids"], b.body["choices"][0]["token_ids"]);
  EXPECT_EQ(a.body["choices"][0]["token_ids"].size(), 6u);
  // /tokenize adds <bos> by default, as vLLM does for text.
  r = post(port, "/tokenize", R"({"prompt": "k1 v2"})");
  ASSERT_EQ(r.status, 200);
  const TaskVocab v = task_vocab(small_task());
  EXPECT_EQ(r.body["tokens"], json({TaskVocab::kBos, v.key(1), v.value(2)}));
  EXPECT_EQ(r.body["count"], 3);
  httplib::Client c("127.0.0.1", port);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json card = json::parse(models->body)["data"][0];
  EXPECT_EQ(card["owned_by"], "phasekv");
  EXPECT_EQ(card["max_model_len"], 40);
  EXPECT_EQ(card["phasekv"]["task"], task_config_to_json(small_task()));
  auto health = c.Get("/health");
  ASSERT_TRUE(health);
  EXPECT_EQ(health->status, 200);
}

TEST(TextTask, PutsTheKeyAtEveryPhaseAndFlagsRetokenizationShifts) {
  for (const bool merge : {false, true}) {
    for (const PaddingMode padding : {PaddingMode::kPrefix, PaddingMode::kInSequence}) {
      ToyTokenizer toy(merge);
      TextTaskOptions o;
      o.records = 4;
      o.context_tokens = 80;
      o.modulus = 8;
      o.padding = padding;
      TextKvTask task(toy.fns(), o);
      EXPECT_EQ(task.describe()["padding_text"], " the");
      EXPECT_EQ(task.describe()["bos"], json({0}));
      std::vector<std::pair<int64_t, int>> pairs;
      for (int r = 0; r < 8; ++r) pairs.push_back({2, r});
      const auto items = task.build(pairs);
      const auto checks = task.verify(items);
      for (size_t i = 0; i < items.size(); ++i) {
        const TextItem& it = items[i];
        EXPECT_EQ(it.key_pos % 8, it.phase);
        EXPECT_EQ(it.tokens.size(), items[0].tokens.size()) << "same length at every phase";
        // The key token is the number's first digits, the value's likewise.
        const std::string key = toy.decode({it.tokens[static_cast<size_t>(it.key_pos)]});
        const std::string value = toy.decode({it.tokens[static_cast<size_t>(it.value_pos)]});
        EXPECT_TRUE(std::isdigit((unsigned char)key[0])) << key;
        EXPECT_TRUE(std::isdigit((unsigned char)value[0])) << value;
        EXPECT_EQ(it.target, it.tokens[static_cast<size_t>(it.value_pos)]);
        EXPECT_EQ(toy.decode({it.tokens.back()}), " ") << "the blank before the value is prompt";
        EXPECT_EQ(it.query_pos + 1, static_cast<int>(it.tokens.size()));
        if (merge) {
          EXPECT_FALSE(checks[i].identical);
          EXPECT_FALSE(checks[i].position_ok()) << "'.\\n' merges before the key";
          EXPECT_LT(checks[i].measured_key_pos, it.key_pos);
        } else {
          EXPECT_TRUE(checks[i].identical);
          EXPECT_TRUE(checks[i].position_ok());
        }
      }
    }
  }
}

// Every example draws from its own stream: consecutive examples share keys only by chance. (A
// generator seeded with id * c and advanced by c made example id + 1 example id shifted by one:
// 7 of 8 keys shared.) 8 keys out of 9000 each: the expected overlap is 8 * 8 / 9000 = 0.007.
TEST(TextTask, ConsecutiveExamplesShareNoMoreKeysThanChance) {
  ToyTokenizer toy(false);
  TextTaskOptions o;
  o.records = 8;
  o.context_tokens = 80;
  o.modulus = 4;
  TextKvTask task(toy.fns(), o);
  const int n = 60;
  std::vector<std::pair<int64_t, int>> pairs;
  for (int e = 0; e < n; ++e) pairs.push_back({e, 0});
  const auto items = task.build(pairs);
  const std::regex key_re("key (\\d{4}) ->");
  std::vector<std::set<std::string>> keys;
  for (const auto& it : items) {
    const std::string text = toy.decode(it.tokens);
    std::set<std::string> k;
    for (std::sregex_iterator m(text.begin(), text.end(), key_re), end; m != end; ++m)
      k.insert((*m)[1]);
    ASSERT_EQ(k.size(), 8u) << text;
    keys.push_back(k);
  }
  int shared = 0;
  for (int e = 0; e + 1 < n; ++e)
    for (const auto& k : keys[static_cast<size_t>(e)]) shared += keys[static_cast<size_t>(e) + 1].count(k) ? 1 : 0;
  EXPECT_LE(shared, 3) << "over " << n - 1 << " consecutive pairs (chance: about 0.4)";
}

// ---------------------------------------------------------------------------------------------
// 2. A fault-injecting vLLM look-alike. Requests to /v1/completions cycle through: ok, 429,
// ok, 500, malformed JSON, a dropped connection (the body cut short), a slow answer (past the
// client's timeout), ok. A context containing `poison` always gets 500 (it must end as an
// error); `healthy` turns every fault off. Its model: the toy tokenizer's answer is correct
// unless the number of leading padding tokens k has k mod 4 == 3 (a planted period 4).

class FaultServer {
 public:
  FaultServer() : toy_(false) {
    // Plenty of threads: idle keep-alive connections and slow answers each hold one.
    server_.new_task_queue = [] { return new httplib::ThreadPool(64); };
    server_.set_keep_alive_timeout(1);
    server_.set_tcp_nodelay(true);
    server_.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(R"({"object":"list","data":[{"id":"toy","object":"model",
                         "owned_by":"vllm","max_model_len":4096}]})",
                      "application/json");
    });
    server_.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (dead()) return fail(res, 502, "upstream is down");
      const json j = json::parse(req.body);
      const auto ids = toy_.encode(j["prompt"], j.value("add_special_tokens", true));
      res.set_content(json({{"tokens", ids}, {"count", ids.size()}}).dump(), "application/json");
    });
    server_.Post("/detokenize", [this](const httplib::Request& req, httplib::Response& res) {
      if (dead()) return fail(res, 502, "upstream is down");
      const json j = json::parse(req.body);
      res.set_content(json({{"prompt", toy_.decode(j["tokens"])}}).dump(), "application/json");
    });
    server_.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      completions(req, res);
    });
    port_ = server_.bind_to_any_port("127.0.0.1");
    thread_ = std::thread([this] { server_.listen_after_bind(); });
    while (!server_.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ~FaultServer() {
    server_.stop();
    thread_.join();
  }
  std::string endpoint() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::atomic<bool> healthy{false};
  std::atomic<int32_t> poison{-1};
  std::atomic<bool> always_slow{false};  // every answer takes 800 ms
  std::atomic<int> served_ok{0};
  // After this many answered completions every POST gets 502 (a proxy whose model server died);
  // -1: never.
  std::atomic<int> dead_after{-1};
  bool dead() const { return dead_after >= 0 && served_ok >= dead_after; }
  // More completions in flight than this get 503 (a server at its --max-connections); 0: no cap.
  // Each answer then takes 20 ms, so requests overlap.
  std::atomic<int> max_in_flight{0};
  std::atomic<int> rejected_busy{0};
  ToyTokenizer& toy() { return toy_; }

 private:
  void completions(const httplib::Request& req, httplib::Response& res) {
    if (dead()) return fail(res, 502, "upstream is down");
    if (max_in_flight > 0) {
      struct InFlight {
        std::atomic<int>& n;
        ~InFlight() { --n; }
      } held{in_flight_};
      if (++in_flight_ > max_in_flight) {
        ++rejected_busy;
        return fail(res, 503, "too many connections");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      ++served_ok;
      return res.set_content(answer(json::parse(req.body)["prompt"]).dump(), "application/json");
    }
    const json j = json::parse(req.body);
    const std::vector<int32_t> prompt = j["prompt"];
    const int n = counter_++;
    const bool poisoned = std::find(prompt.begin(), prompt.end(), poison.load()) != prompt.end();
    if (poisoned && !healthy) return fail(res, 500, "poisoned");
    if (always_slow) std::this_thread::sleep_for(std::chrono::milliseconds(800));
    // Faults hit the first two attempts of a request only (retries resend the same salted
    // body), so every other request succeeds within the test's retries whatever the timing.
    int attempt = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      attempt = attempts_[j.value("cache_salt", req.body)]++;
    }
    switch (healthy || attempt >= 2 ? 0 : n % 8) {
      case 1:
        res.set_header("Retry-After", "0");
        return fail(res, 429, "slow down");
      case 3:
        return fail(res, 500, "boom");
      case 4:
        return res.set_content(R"({"choices": [{"logprobs": )", "application/json");
      case 5: {
        const std::string body = answer(prompt).dump();
        res.set_content_provider(body.size(), "application/json",
                                 [body](size_t, size_t, httplib::DataSink& sink) {
                                   sink.write(body.data(), body.size() / 2);
                                   return false;  // drops the connection mid-body
                                 });
        return;
      }
      case 6:
        std::this_thread::sleep_for(std::chrono::milliseconds(800));
        break;
      default:
        break;
    }
    // Check and count under one lock: two requests in flight at served_ok = dead_after - 1
    // must not both be answered (the dead-server audit saw 21 answers from a server dead after 20).
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (dead()) return fail(res, 502, "upstream is down");
      ++served_ok;
    }
    res.set_content(answer(prompt).dump(), "application/json");
  }
  void fail(httplib::Response& res, int status, const std::string& what) {
    res.status = status;
    res.set_content(json({{"error", {{"message", what}}}}).dump(), "application/json");
  }
  // vLLM echo shape over prompt = ctx + [target]. The toy model is right unless the target
  // record's key sits at a phase r with r mod 4 == 3: the record's value token (the target,
  // after " value" and a blank) is 7 tokens after the key's first token.
  json answer(const std::vector<int32_t>& prompt) {
    const int32_t target = prompt.back();
    bool right = true;
    const int32_t value_word = toy_.id(" value");
    for (size_t i = 2; i + 1 < prompt.size(); ++i)
      if (prompt[i] == target && prompt[i - 2] == value_word) {
        right = (i - 7) % 8 % 4 != 3;
        break;
      }
    const int32_t argmax = right ? target : target + 1;
    json tokens = json::array(), lps = json::array(), tops = json::array();
    for (size_t i = 0; i < prompt.size(); ++i) {
      tokens.push_back("token_id:" + std::to_string(prompt[i]));
      lps.push_back(i == 0 ? json(nullptr) : json(-1.0));
      tops.push_back(i == 0 ? json(nullptr)
                            : json({{"token_id:" + std::to_string(argmax), -0.5},
                                    {"token_id:" + std::to_string(prompt[i]), -1.0}}));
    }
    lps.back() = right ? -0.5 : -2.0;
    return {
        {"choices",
         {{{"index", 0},
           {"logprobs", {{"tokens", tokens}, {"token_logprobs", lps}, {"top_logprobs", tops}}}}}},
        {"usage", {{"prompt_tokens", prompt.size()}}}};
  }

  ToyTokenizer toy_;
  httplib::Server server_;
  std::mutex mutex_;
  std::map<std::string, int> attempts_;
  std::thread thread_;
  int port_ = 0;
  std::atomic<int> counter_{0};
  std::atomic<int> in_flight_{0};
};

HttpBackendOptions fault_options(const std::string& endpoint) {
  HttpBackendOptions o = options_for(endpoint, "toy");
  o.timeout_s = 0.5;  // the slow answers time out
  o.retries = 6;
  o.retry_base_delay_s = 0.01;
  return o;
}

TEST(FaultInjection, EveryRequestSucceedsOrFailsWithItsErrorAndRetriesAreCounted) {
  FaultServer server;
  auto http = HttpBackend::open(fault_options(server.endpoint()));
  EXPECT_EQ(http->dialect(), Dialect::kVllm);
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 40; ++i) requests.push_back({{0, 5, 6, 7 + i % 3}, 9});
  server.poison = 8;  // requests i % 3 == 1 always get 500
  const auto results = http->score(requests);
  int ok = 0, failed = 0;
  for (size_t i = 0; i < results.size(); ++i) {
    if (i % 3 == 1) {
      ++failed;
      EXPECT_CONTAINS(results[i].error, "HTTP 500");
      EXPECT_CONTAINS(results[i].error, "gave up after 6 retries");
      EXPECT_CONTAINS(results[i].error, "/v1/completions");
    } else {
      ++ok;
      EXPECT_TRUE(results[i].error.empty()) << results[i].error;
      EXPECT_EQ(results[i].argmax, 9);
      EXPECT_DOUBLE_EQ(results[i].target_logprob, -0.5);
    }
  }
  const TransportStats s = http->stats();
  EXPECT_GT(s.retries, 0);
  EXPECT_GT(s.http_429, 0);
  EXPECT_GT(s.http_5xx, 0);
  EXPECT_GT(s.bad_json, 0);
  EXPECT_GT(s.connection_errors, 0);  // drops and timeouts
  EXPECT_EQ(s.failed, failed);
  EXPECT_EQ(ok + failed, 40);
}

TEST(FaultInjection, RetryBudgetEndsARunOfFailuresQuickly) {
  FaultServer server;
  server.poison = 5;
  auto o = fault_options(server.endpoint());
  o.max_total_retries = 3;
  auto http = HttpBackend::open(o);
  const auto results = http->score(std::vector<ScoreRequest>(10, {{0, 5}, 9}));
  int budget = 0;
  for (const auto& r : results) {
    EXPECT_FALSE(r.error.empty());
    budget += r.error.find("retry budget") != std::string::npos ? 1 : 0;
  }
  EXPECT_GE(budget, 6) << "at most 3 requests got a retry, the others failed at once";
  EXPECT_EQ(http->stats().retries, 3);
}

// A timeout surfaces as httplib's "Read" error; the message names the limit to raise (a 128K-token
// prefill on a CPU server takes minutes: the default 60 s cut every such request).
TEST(FaultInjection, ATimedOutRequestNamesTheTimeoutToRaise) {
  FaultServer server;
  server.healthy = true;
  server.always_slow = true;
  auto o = fault_options(server.endpoint());
  o.retries = 1;
  const auto results = HttpBackend::open(o)->score({{{0, 5}, 9}});
  ASSERT_EQ(results.size(), 1u);
  EXPECT_CONTAINS(results[0].error, "nothing came within --timeout-s 0.5 s");
}

// A server that stops answering mid-run: the circuit breaker marks the endpoint down after
// --give-up-after-s of failures with no answer, every later request fails at once without being
// sent, and the backend says why (the runner stops on it).
TEST(FaultInjection, AServerThatStopsAnsweringIsMarkedDownAndLaterRequestsAreNotSent) {
  FaultServer server;
  server.healthy = true;
  server.dead_after = 5;
  auto o = fault_options(server.endpoint());
  o.concurrency = 1;
  o.retries = 1000;  // the breaker, not the retries, must end it
  o.give_up_after_s = 0.3;
  auto http = HttpBackend::open(o);
  const auto results = http->score(std::vector<ScoreRequest>(12, {{0, 5}, 9}));
  int ok = 0, not_sent = 0;
  for (const auto& r : results) {
    ok += r.error.empty() ? 1 : 0;
    not_sent += r.error.find("not sent") != std::string::npos ? 1 : 0;
  }
  EXPECT_EQ(ok, 5);
  EXPECT_GE(not_sent, 6) << "after the first failing request, none is sent";
  const std::string why = http->stop_reason();
  EXPECT_CONTAINS(why, "answered nothing for");
  EXPECT_CONTAINS(why, "HTTP 502");
  EXPECT_CONTAINS(why, "--give-up-after-s 0.3");
  EXPECT_LT(http->stats().retries, 1000);
}

// 503 is back-pressure, like 429: at --concurrency 16 against a server that takes 4 requests at
// a time, every request succeeds (busy retries do not use up --retries), and the adaptive
// concurrency comes down.
TEST(FaultInjection, ABusyServerAnswering503LosesNoRequest) {
  FaultServer server;
  server.max_in_flight = 4;
  auto o = fault_options(server.endpoint());
  o.concurrency = 16;
  o.retries = 2;
  o.timeout_s = 10;
  auto http = HttpBackend::open(o);
  const auto results = http->score(std::vector<ScoreRequest>(120, {{0, 5}, 9}));
  for (const auto& r : results) EXPECT_TRUE(r.error.empty()) << r.error;
  const TransportStats s = http->stats();
  EXPECT_GT(server.rejected_busy.load(), 0);
  EXPECT_EQ(s.http_503, server.rejected_busy.load());
  EXPECT_GT(s.concurrency_decreases, 0);
  EXPECT_LT(s.min_concurrency_limit, 16);
  EXPECT_EQ(s.failed, 0);
  EXPECT_TRUE(http->stop_reason().empty());
}

// The audit through the binary against a server that dies after 20 answers: it stops with exit 6
// (not a verdict from a quarter of the data), keeps exactly the answered items, writes no
// report, and the same command completes the run once the server is back.
TEST(FaultInjection, AnAuditOfADeadServerStopsResumablyWithoutAVerdict) {
  FaultServer server;
  server.healthy = true;
  server.dead_after = 20;
  const fs::path out = temp_dir("dead_audit");
  const std::string cmd =
      std::string(PHASEKV_BINARY) + " audit --endpoint " + server.endpoint() +
      " --model toy --modulus 8 --examples 6 --records 3 --context-tokens 40"
      " --concurrency 2 --timeout-s 2 --retries 1000 --retry-base-s 0.01 --give-up-after-s 0.5"
      " --bootstrap 50 --permutations 200 --out " +
      out.string() + " > " + (out / "log.txt").string() + " 2>&1";
  const int stopped = std::system(cmd.c_str());
  const std::string log = read_file((out / "log.txt").string());
  ASSERT_TRUE(WIFEXITED(stopped));
  EXPECT_EQ(WEXITSTATUS(stopped), 6) << log;
  EXPECT_CONTAINS(log, "audit stopped:");
  EXPECT_CONTAINS(log, "rerun the same command to resume");
  EXPECT_NOT_CONTAINS(log, "phase-sensitive");
  EXPECT_NOT_CONTAINS(log, "no periodic weak spot");
  EXPECT_FALSE(fs::exists(out / "summary.json"));
  const auto first = read_results((out / "results.jsonl").string()).records;
  EXPECT_GT(first.size(), 0u);
  EXPECT_LE(first.size(), 20u);
  for (const auto& r : first) EXPECT_TRUE(r.error.empty()) << r.error;
  server.dead_after = -1;
  const int resumed = std::system(cmd.c_str());
  ASSERT_EQ(resumed, 0) << read_file((out / "log.txt").string());
  EXPECT_EQ(read_results((out / "results.jsonl").string()).records.size(), 48u);
  const json summary = json::parse(read_file((out / "summary.json").string()));
  EXPECT_EQ(summary["outcomes"], 48);
  EXPECT_EQ(summary["planned_outcomes"], 48);
  EXPECT_EQ(summary["complete"], true);
  fs::remove_all(out);
}

// The text audit end to end through the binary: faults on, a poisoned value in one example,
// then a rerun with the server healthy: nothing finished is lost and the errors are retried.
TEST(FaultInjection, TextAuditCompletesKeepsRecordsAndFindsThePlantedPeriod) {
  FaultServer server;
  const fs::path out = temp_dir("text_audit");
  const std::string cmd =
      std::string(PHASEKV_BINARY) + " audit --endpoint " + server.endpoint() +
      " --model toy --modulus 8 --examples 6 --records 3 --context-tokens 40"
      " --concurrency 8 --timeout-s 0.5 --retries 4 --retry-base-s 0.01 --bootstrap 50"
      " --permutations 200 --out " +
      out.string() + " > " + (out / "log.txt").string() + " 2>&1";
  server.poison = server.toy().id(" the");  // every request fails while faults are on
  EXPECT_NE(std::system(cmd.c_str()), 0) << "no phase has a success: the summary must refuse";
  const auto first = read_results((out / "results.jsonl").string()).records;
  ASSERT_EQ(first.size(), 48u) << read_file((out / "log.txt").string());
  for (const auto& r : first) EXPECT_FALSE(r.error.empty());
  // Only requests whose answer is example 0's value fail: every phase has successes, the audit
  // finishes and writes its files, and says so with exit status 5 (kAuditErrorsExit).
  server.poison = first.front().target;
  const int partial = std::system(cmd.c_str());
  ASSERT_TRUE(WIFEXITED(partial));
  EXPECT_EQ(WEXITSTATUS(partial), 5) << read_file((out / "log.txt").string());
  EXPECT_CONTAINS(read_file((out / "log.txt").string()), "items ended as errors");
  const int64_t errors =
      json::parse(read_file((out / "audit.json").string()))["records"]["errors"].get<int64_t>();
  EXPECT_GT(errors, 0);
  EXPECT_LT(errors, 48);
  // No verdict from the partial data: the terminal, summary.json and report.html say N of M.
  const std::string incomplete = fmt::format("{} of 48 outcomes", 48 - errors);
  EXPECT_CONTAINS(read_file((out / "log.txt").string()), "no verdict, incomplete: " + incomplete);
  EXPECT_CONTAINS(read_file((out / "report.html").string()), incomplete);
  const json partial_summary = json::parse(read_file((out / "summary.json").string()));
  EXPECT_EQ(partial_summary["complete"], false);
  EXPECT_EQ(partial_summary["planned_outcomes"], 48);
  server.poison = -1;
  ASSERT_EQ(std::system(cmd.c_str()), 0) << read_file((out / "log.txt").string());
  const auto second = read_results((out / "results.jsonl").string()).records;
  EXPECT_EQ(second.size(), 96u + static_cast<size_t>(errors));  // each failure once more, scored
  const json audit = json::parse(read_file((out / "audit.json").string()));
  EXPECT_EQ(audit["render"], "text");
  EXPECT_EQ(audit["records"]["errors"], 0);
  EXPECT_EQ(audit["period"]["detected_period"], 4) << audit["period"].dump();
  EXPECT_LT(audit["period"]["p_value"].get<double>(), 0.05);
  EXPECT_GT(audit["transport"]["retries"].get<int>(), 0);
  fs::remove_all(out);
}

// ---------------------------------------------------------------------------------------------
// Dialect parsers on canned responses, and endpoint parsing.

TEST(Dialects, SglangAndLlamacppShapes) {
  const ScoreRequest r{{1, 2, 3}, 7};
  const json sglang = {{"meta_info",
                        {{"prompt_tokens", 3},
                         {"output_token_ids_logprobs", {{{-2.5, 7, nullptr}}}},
                         {"output_top_logprobs", {{{-0.1, 4, nullptr}}}}}}};
  ScoreResult s = parse_score(Dialect::kSglang, sglang, r);
  EXPECT_DOUBLE_EQ(s.target_logprob, -2.5);
  EXPECT_EQ(s.argmax, 4);
  EXPECT_FALSE(s.censored);
  json llama = {
      {"tokens_evaluated", 3},
      {"completion_probabilities",
       {{{"id", 4},
         {"logprob", -0.1},
         {"top_logprobs", {{{"id", 4}, {"logprob", -0.1}}, {{"id", 7}, {"logprob", -2.0}}}}}}}};
  s = parse_score(Dialect::kLlamacpp, llama, r);
  EXPECT_EQ(s.argmax, 4);
  EXPECT_FALSE(s.censored);
  EXPECT_DOUBLE_EQ(s.target_logprob, -2.0);
  llama["completion_probabilities"][0]["top_logprobs"].erase(1);
  s = parse_score(Dialect::kLlamacpp, llama, r);
  EXPECT_TRUE(s.censored) << "a target outside the top-N is censored, not wrong-with-a-logprob";
  EXPECT_EQ(s.argmax, 4);
  const json old = {{"completion_probabilities", {{{"content", "a"}, {"probs", json::array()}}}}};
  EXPECT_THROW(parse_score(Dialect::kLlamacpp, old, r), ProtocolError);
  llama["tokens_evaluated"] = 4;
  EXPECT_THROW(parse_score(Dialect::kLlamacpp, llama, r), ProtocolError) << "shifted prompt";
  const json vllm_strings = {
      {"choices",
       {{{"logprobs",
          {{"tokens", {"a", "b", "c", "d"}},
           {"token_logprobs", {nullptr, -1, -1, -1}},
           {"top_logprobs", {nullptr, {{"b", -1}}, {{"c", -1}}, {{"x", -0.2}, {"d", -1}}}}}}}}}};
  EXPECT_THROW(parse_score(Dialect::kVllm, vllm_strings, r), ProtocolError)
      << "token strings instead of ids cannot be mapped back safely";
  EXPECT_EQ(score_call(Dialect::kLlamacpp, {}, r).body["cache_prompt"], false);
  EXPECT_EQ(score_call(Dialect::kSglang, {}, r).body["token_ids_logprob"], json({7}));
}

TEST(Endpoint, ParsesWhatServersPrintAndRejectsTheRest) {
  EndpointUrl u = parse_endpoint("http://gpu7:8000/v1/");
  EXPECT_EQ(u.origin(), "http://gpu7:8000");
  EXPECT_EQ(u.path("/v1/completions"), "/v1/completions");
  u = parse_endpoint("https://api.example.com/llm/v1");
  EXPECT_EQ(u.port, 443);
  EXPECT_EQ(u.url("/tokenize"), "https://api.example.com:443/llm/tokenize");
  u = parse_endpoint("http://[::1]:9000");
  EXPECT_EQ(u.host, "::1");
  EXPECT_EQ(u.origin(), "http://[::1]:9000");
  for (const std::string bad : {"gpu7:8000", "ftp://x", "http://", "http://x:0", "http://x:99999",
                                "http://x:80?a=b", "http://user:pw@x:80", "http://x:abc"}) {
    try {
      parse_endpoint(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), bad);
    }
  }
}

TEST(Endpoint, UnreachableServerAndMissingKeyFailWithTheEndpointNamed) {
  auto o = options_for("http://127.0.0.1:1", "m", "vllm");
  o.retries = 0;
  try {
    HttpBackend::open(o);
    ADD_FAILURE() << "connected to port 1";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "127.0.0.1:1");
  }
  o.api_key_env = "PHASEKV_TEST_SURELY_UNSET_VARIABLE";
  EXPECT_THROW(HttpBackend::open(o), Error);
}

}  // namespace
}  // namespace phasekv
