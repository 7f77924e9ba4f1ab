// What a real llama-server showed the audit (issue 21), reproduced by a fake whose JSON follows
// llama.cpp's documentation (fake_llamacpp.h): probabilities omitted for an incomplete UTF-8
// greedy token, HTTP 500 for invalid UTF-8 output in generate mode, a prompt of n_ctx tokens
// rejected; and the audit's budget check, plan (--dry-run), usage accounting and rate limits.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <regex>

#include "audit_cli.h"
#include "backend/http_client.h"
#include "backend/http_dialect.h"
#include "eval/results_file.h"
#include "fake_llamacpp.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::FakeLlamaServer;

HttpBackendOptions llama_options(const FakeLlamaServer& s) {
  HttpBackendOptions o;
  o.endpoint = s.endpoint();
  o.model = "any";
  o.concurrency = 4;
  o.timeout_s = 10;
  o.retry_base_delay_s = 0.01;
  return o;
}

using Cli = test::AuditCli;

Cli audit(const FakeLlamaServer& s, const fs::path& out, const std::string& extra) {
  return test::run_audit_cli(s.endpoint(), "any", out, extra);
}

// A text-kv prompt of the fake's shape, with the target record's key at position `key_pos`:
// filler, "\nkey 4821 -> value 7314.", filler, then the question ending right before the value.
struct Prompt {
  std::vector<int32_t> tokens;
  int32_t target = -1;
};
Prompt prompt_with_key_at(test::ToyTokenizer& toy, int key_pos) {
  Prompt p;
  p.tokens = {0};
  while (static_cast<int>(p.tokens.size()) + 3 < key_pos) p.tokens.push_back(toy.id(" the"));
  for (const char* w : {"\nkey", " "})
    for (int32_t t : toy.encode(w, false)) p.tokens.push_back(t);
  EXPECT_EQ(static_cast<int>(p.tokens.size()), key_pos);
  for (const char* w : {"4821", " -> value", " 7314", "."})
    for (int32_t t : toy.encode(w, false)) p.tokens.push_back(t);
  p.target = toy.encode("731", false).front();
  for (const char* w : {" The grass is green.", "\n\nQuestion: what is the value of key",
                        " 4821", "?\nAnswer: key", " 4821", " -> value", " "})
    for (int32_t t : toy.encode(w, false)) p.tokens.push_back(t);
  return p;
}

// ---------------------------------------------------------------------------------------------
// 1. No completion_probabilities when the greedy token is an incomplete UTF-8 sequence.

TEST(LlamacppUtf8, TheFakeReproducesTheMissingProbabilitiesWithoutLogitBias) {
  FakeLlamaServer server;
  const Prompt weak = prompt_with_key_at(server.toy(), 11);  // 11 mod 4 == 3: the weak spot
  httplib::Client c("127.0.0.1", std::stoi(server.endpoint().substr(17)));
  const json body = {{"prompt", weak.tokens},
                     {"n_predict", 1},
                     {"n_probs", 5},
                     {"temperature", 0.0},
                     {"cache_prompt", false}};
  auto res = c.Post("/completion", body.dump(), "application/json");
  ASSERT_TRUE(res);
  ASSERT_EQ(res->status, 200);
  const json j = json::parse(res->body);
  EXPECT_EQ(j["content"], "\xEF\xBF\xBD");
  EXPECT_EQ(j["tokens"], json::array());
  EXPECT_FALSE(j.contains("completion_probabilities")) << j.dump();
  // The dialect explains such an answer instead of "no 'completion_probabilities'".
  try {
    parse_score(Dialect::kLlamacpp, j, {weak.tokens, weak.target});
    ADD_FAILURE() << "accepted an answer without probabilities";
  } catch (const ProtocolError& e) {
    EXPECT_CONTAINS(e.what(), "incomplete UTF-8");
  }
}

TEST(LlamacppUtf8, LogitBiasOnTheTargetBringsTheUnchangedProbabilitiesBack) {
  FakeLlamaServer server;
  const ScoreRequest weak{prompt_with_key_at(server.toy(), 11).tokens,
                          prompt_with_key_at(server.toy(), 11).target};
  const ScoreRequest strong{prompt_with_key_at(server.toy(), 12).tokens,
                            prompt_with_key_at(server.toy(), 12).target};
  const HttpCall call = score_call(Dialect::kLlamacpp, {}, weak);
  EXPECT_EQ(call.body["logit_bias"], json::array({json::array({weak.target, 1000.0})}));
  auto http = HttpBackend::open(llama_options(server));
  EXPECT_EQ(http->dialect(), Dialect::kLlamacpp);
  const auto got = http->score({weak, strong});
  ASSERT_TRUE(got[0].error.empty()) << got[0].error;
  ASSERT_TRUE(got[1].error.empty()) << got[1].error;
  // The weak spot: the greedy token is the lone lead byte, the target's logprob is reported.
  EXPECT_EQ(got[0].argmax, server.byte_token());
  EXPECT_DOUBLE_EQ(got[0].argmax_logprob, -0.1);
  EXPECT_DOUBLE_EQ(got[0].target_logprob, -2.5);
  EXPECT_FALSE(got[0].censored);
  EXPECT_EQ(got[1].argmax, strong.target);
  EXPECT_DOUBLE_EQ(got[1].target_logprob, -0.1);
}

TEST(LlamacppUtf8, ProbabilitiesThatIncludeTheBiasAreRefused) {
  const ScoreRequest r{{1, 2, 3}, 7};
  const json leaked = {
      {"tokens_evaluated", 3},
      {"completion_probabilities",
       {{{"id", 7},
         {"logprob", 0.0},
         {"top_logprobs", {{{"id", 7}, {"logprob", 0.0}}, {{"id", 4}, {"logprob", -998.7}}}}}}}};
  EXPECT_THROW(parse_score(Dialect::kLlamacpp, leaked, r), ProtocolError);
}

// ---------------------------------------------------------------------------------------------
// 2. Generate mode: HTTP 500 for invalid UTF-8 output is a scored outcome, never retried.

TEST(LlamacppUtf8, GenerateModeScoresRefusedOutputAsWrongWithoutRetrying) {
  FakeLlamaServer server;
  const fs::path out = test::temp_dir("llama_generate");
  const Cli r = audit(server, out / "run", "--mode generate");
  ASSERT_EQ(r.status, 0) << r.log;
  const json a = json::parse(read_file((out / "run" / "audit.json").string()));
  EXPECT_EQ(a["records"]["errors"], 0);
  EXPECT_EQ(a["transport"]["retries"], 0) << "a deterministic 500 must not be retried";
  const int refused = server.refused_utf8.load();
  EXPECT_GT(refused, 0);
  EXPECT_EQ(a["records"]["output_invalid_utf8"], refused);
  EXPECT_EQ(a["transport"]["http_5xx"], refused);
  EXPECT_EQ(a["period"]["detected_period"], 4) << a["period"].dump();
  int flagged = 0;
  for (const auto& rec : read_results((out / "run" / "results.jsonl").string()).records) {
    if (rec.extra.value("output_invalid_utf8", false)) {
      ++flagged;
      EXPECT_FALSE(rec.correct);
      EXPECT_EQ(rec.key_pos % 4, 3) << "only the planted weak spot produces invalid UTF-8";
    } else {
      EXPECT_TRUE(rec.correct) << "example " << rec.example_id << " phase " << rec.phase;
    }
  }
  EXPECT_EQ(flagged, refused);
  fs::remove_all(out);
}

// One generated token (the ids render scores by the greedy token): llama.cpp answers
// {"content":"\ufffd","tokens":[]}, and the greedy token is read from n_probs instead.
TEST(LlamacppUtf8, GenerateModeReadsAnIncompleteGreedyTokenFromTheProbabilities) {
  FakeLlamaServer server;
  auto o = llama_options(server);
  o.mode = ScoreMode::kGenerate;
  auto http = HttpBackend::open(o);
  const Prompt weak = prompt_with_key_at(server.toy(), 11);
  const auto got = http->score({{weak.tokens, weak.target}});
  ASSERT_TRUE(got[0].error.empty()) << got[0].error;
  EXPECT_EQ(got[0].argmax, server.byte_token());
  EXPECT_TRUE(std::isnan(got[0].target_logprob));
  const auto gen = http->generate_many({weak.tokens}, 2);
  EXPECT_TRUE(gen[0].invalid_utf8);
  EXPECT_TRUE(gen[0].error.empty()) << gen[0].error;
  EXPECT_EQ(http->stats().retries, 0);
}

// ---------------------------------------------------------------------------------------------
// 3. The context: n_ctx per slot from /props, a prompt of n_ctx tokens is rejected, and the
// whole audit is checked before anything is scored.

TEST(LlamacppContext, APromptOfNctxTokensIsRejectedSoTheLimitIsNctxMinusOne) {
  FakeLlamaServer server(64);
  auto http = HttpBackend::open(llama_options(server));
  ASSERT_TRUE(http->context_limit());
  EXPECT_EQ(http->context_limit()->tokens, 64);
  EXPECT_EQ(http->context_limit()->source, "/props default_generation_settings.n_ctx (per slot)");
  EXPECT_EQ(http->max_context(), 63);
  EXPECT_EQ(http->max_prompt(3), 61);
  const int32_t the = server.toy().id(" the"), x = server.toy().id(" x");
  const std::vector<int32_t> fits(63, the), full(64, the);
  const auto fit = http->score({{fits, x}})[0];
  EXPECT_TRUE(fit.error.empty()) << fit.error;
  const int before = server.completions.load();
  const std::string err = http->score({{full, x}})[0].error;
  EXPECT_CONTAINS(err, "does not fit the server's context size 64");
  EXPECT_EQ(server.completions.load(), before) << "refused before it was sent";
  // The fake rejects exactly n_ctx tokens, as llama-server does.
  httplib::Client c("127.0.0.1", std::stoi(server.endpoint().substr(17)));
  auto res =
      c.Post("/completion", json({{"prompt", full}, {"n_predict", 1}}).dump(), "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "exceed_context_size_error");
  // --max-context wins over what the server reports.
  auto o = llama_options(server);
  o.max_context = 32;
  EXPECT_EQ(HttpBackend::open(o)->context_limit()->source, "--max-context");
  EXPECT_EQ(HttpBackend::open(o)->max_context(), 31);
  // A --max-context above the server's: the server's 400 becomes an error that says a rerun
  // cannot help, and it is not retried.
  o.max_context = 1000;
  auto over = HttpBackend::open(o);
  const std::string rejected = over->score({{full, x}})[0].error;
  EXPECT_CONTAINS(rejected, "HTTP 400");
  EXPECT_CONTAINS(rejected, "exceed_context_size_error");
  EXPECT_CONTAINS(rejected, "a rerun will not help");
  EXPECT_EQ(over->stats().retries, 0);
}

TEST(LlamacppContext, AnOverlongAuditIsRefusedUpFrontNamingPromptLimitAndSource) {
  FakeLlamaServer server(64);
  const fs::path out = test::temp_dir("llama_overlong");
  const Cli r = audit(server, out / "run", "");
  EXPECT_EQ(r.status, 2) << r.log;
  EXPECT_CONTAINS(r.log, "does not fit the server's context");
  EXPECT_CONTAINS(r.log, "context size is 64 tokens (/props default_generation_settings.n_ctx");
  EXPECT_CONTAINS(r.log, "at most 63 tokens");
  EXPECT_TRUE(std::regex_search(r.log, std::regex("longest prompt \\(example \\d+\\) has \\d+ "
                                                  "tokens")))
      << r.log;
  EXPECT_EQ(server.completions.load(), 0) << "no scoring request may be sent";
  EXPECT_FALSE(fs::exists(out / "run" / "results.jsonl"));
  fs::remove_all(out);
}

// ---------------------------------------------------------------------------------------------
// Usage accounting and the plan.

TEST(AuditAccounting, UsageIsSummedFromTheServersAnswersAndTheDryRunSendsNoScoringRequest) {
  FakeLlamaServer server;
  const fs::path out = test::temp_dir("llama_usage");
  const Cli dry = audit(server, out / "run", "--dry-run");
  ASSERT_EQ(dry.status, 0) << dry.log;
  EXPECT_EQ(server.completions.load(), 0);
  EXPECT_FALSE(fs::exists(out / "run" / "results.jsonl"));
  EXPECT_FALSE(fs::exists(out / "run" / "audit.json"));
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dry.log, m, std::regex("prompt tokens: (\\d+) ")));
  const int64_t planned = std::stoll(m[1]);
  EXPECT_CONTAINS(dry.log, "plan: 48 of 48 items to score");
  EXPECT_CONTAINS(dry.log, "requests: 240 (per item: 1 scoring + 4");
  EXPECT_CONTAINS(dry.log, "time: unknown until the first requests");

  const Cli run = audit(server, out / "run", "");
  ASSERT_EQ(run.status, 0) << run.log;
  const json a = json::parse(read_file((out / "run" / "audit.json").string()));
  int64_t prompt_tokens = 0;
  for (const auto& rec : read_results((out / "run" / "results.jsonl").string()).records)
    prompt_tokens += rec.query_pos + 1;
  EXPECT_EQ(a["usage"]["prompt_tokens"], prompt_tokens);
  EXPECT_EQ(planned, prompt_tokens) << "the plan counts what the server then counted";
  EXPECT_EQ(a["usage"]["completion_tokens"], 48);
  EXPECT_EQ(a["usage"]["cached_tokens"], 0);
  EXPECT_EQ(a["usage"]["answers_with_usage"], 48);
  EXPECT_EQ(a["period"]["detected_period"], 4);
  EXPECT_GT(a["timing"]["items_per_s"].get<double>(), 0);
  EXPECT_CONTAINS(
      run.log, "usage (the server's count): " + std::to_string(prompt_tokens) + " prompt tokens");
  // A later dry run estimates the time from the recorded rate.
  const Cli again = audit(server, out / "run", "--dry-run");
  EXPECT_CONTAINS(again.log, "plan: 0 of 48 items to score (48 already");
  EXPECT_CONTAINS(again.log, "items/s (" + (out / "run").string() + "/audit.json)");
  fs::remove_all(out);
}

TEST(AuditAccounting, UsageShapesOfEveryDialect) {
  const json vllm = {{"usage",
                      {{"prompt_tokens", 44},
                       {"completion_tokens", 1},
                       {"total_tokens", 45},
                       {"prompt_tokens_details", {{"cached_tokens", 16}}}}}};
  Usage u = parse_usage(Dialect::kVllm, vllm);
  EXPECT_TRUE(u.present);
  EXPECT_EQ(u.prompt, 44);
  EXPECT_EQ(u.completion, 1);
  EXPECT_EQ(u.cached, 16);
  const json sglang = {
      {"text", "7"},
      {"meta_info", {{"prompt_tokens", 30}, {"completion_tokens", 1}, {"cached_tokens", 8}}}};
  u = parse_usage(Dialect::kSglang, sglang);
  EXPECT_EQ(u.prompt, 30);
  EXPECT_EQ(u.cached, 8);
  // What llama-server answered to a 9-token prompt sent twice with cache_prompt true: the second
  // time 8 tokens came from the cache (timings.cache_n); tokens_cached is the slot's cache size
  // after the request, 9 both times (and with cache_prompt false too).
  const json llama = {{"tokens_evaluated", 9},
                      {"tokens_predicted", 1},
                      {"tokens_cached", 9},
                      {"timings", {{"cache_n", 8}, {"prompt_n", 1}}}};
  u = parse_usage(Dialect::kLlamacpp, llama);
  EXPECT_EQ(u.prompt, 9);
  EXPECT_EQ(u.completion, 1);
  EXPECT_EQ(u.cached, 8);
  u = parse_usage(Dialect::kLlamacpp, {{"tokens_evaluated", 9},
                                       {"tokens_predicted", 1},
                                       {"tokens_cached", 9},
                                       {"timings", {{"cache_n", 0}}}});
  EXPECT_EQ(u.cached, 0);
  EXPECT_FALSE(parse_usage(Dialect::kVllm, json::object()).present);
}

// --request-cache: a rerun with an SLA gate into another directory asks the server nothing;
// --log-samples: the full prompt text of a few records.
TEST(AuditAccounting, ARerunFromTheRequestCacheSendsNothingAndLogsSamplePrompts) {
  FakeLlamaServer server;
  const fs::path out = test::temp_dir("llama_cache");
  const std::string cache = "--request-cache " + (out / "cache").string();
  const Cli first = audit(server, out / "a", cache + " --log-samples 5");
  ASSERT_EQ(first.status, 0) << first.log;
  const int sent = server.completions.load();
  EXPECT_EQ(sent, 48);
  const Cli second = audit(server, out / "b", cache + " --max-gap 100");
  ASSERT_EQ(second.status, 0) << second.log;
  EXPECT_EQ(server.completions.load(), sent) << "every answer came from the cache";
  const json a = json::parse(read_file((out / "a" / "audit.json").string()));
  const json b = json::parse(read_file((out / "b" / "audit.json").string()));
  EXPECT_EQ(b["usage"]["answers_from_request_cache"], 48);
  EXPECT_EQ(b["usage"]["prompt_tokens"], 0) << "the server counted nothing this run";
  EXPECT_GT(b["transport"]["request_cache_hits"].get<int>(), 48) << "tokenize calls too";
  EXPECT_EQ(b["transport"]["request_cache_stores"], 0);
  EXPECT_EQ(a["period"]["by_residue"], b["period"]["by_residue"]);
  EXPECT_EQ(a["period"]["detected_period"], b["period"]["detected_period"]);
  std::map<std::pair<int64_t, int>, EvalRecord> first_records;
  for (const auto& r : read_results((out / "a" / "results.jsonl").string()).records)
    first_records[{r.example_id, r.phase}] = r;
  for (const auto& r : read_results((out / "b" / "results.jsonl").string()).records) {
    EXPECT_EQ(r.prediction, first_records.at({r.example_id, r.phase}).prediction);
    EXPECT_EQ(r.target_logprob, first_records.at({r.example_id, r.phase}).target_logprob);
  }
  // Five samples spread over the 6 x 8 grid, each the whole prompt of its record.
  const std::string samples = read_file((out / "a" / "samples.jsonl").string());
  int n = 0;
  for (size_t pos = 0, end; (end = samples.find('\n', pos)) != std::string::npos; pos = end + 1) {
    const json line = json::parse(samples.substr(pos, end - pos));
    ++n;
    const EvalRecord& r = first_records.at({line["example_id"], line["phase"]});
    EXPECT_EQ(line["prompt_tokens"], r.query_pos + 1);
    EXPECT_EQ(line["key_pos"], r.key_pos);
    const std::string text = line["prompt_text"];
    EXPECT_CONTAINS(text, "Question: what is the value of key");
    EXPECT_EQ(server.toy().encode(text, true), line["prompt_ids"].get<std::vector<int32_t>>())
        << "the text is the whole prompt";
  }
  EXPECT_EQ(n, 5);
  fs::remove_all(out);
}

// ---------------------------------------------------------------------------------------------
// Rate limits: Retry-After is waited out, concurrency halves on 429s.

TEST(RateLimits, RetryAfterIsHonouredInSecondsAndAsAnHttpDate) {
  EXPECT_DOUBLE_EQ(parse_retry_after("7", 0), 7.0);
  EXPECT_DOUBLE_EQ(parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", 10), 20.0);
  EXPECT_DOUBLE_EQ(parse_retry_after("Thu, 01 Jan 1970 00:00:30 GMT", 40), 0.0);
  EXPECT_LT(parse_retry_after("soon", 0), 0.0);
  FakeLlamaServer server;
  server.first_attempt_429 = true;
  server.retry_after = "1";
  auto http = HttpBackend::open(llama_options(server));
  const Prompt p = prompt_with_key_at(server.toy(), 12);
  const auto t0 = std::chrono::steady_clock::now();
  const auto got = http->score({{p.tokens, p.target}});
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  ASSERT_TRUE(got[0].error.empty()) << got[0].error;
  EXPECT_GE(secs, 1.0) << "Retry-After: 1 must be waited out (the backoff alone is ~0.01 s)";
  EXPECT_EQ(http->stats().retry_after_waits, 1);
  // A Retry-After beyond --max-retry-after-s fails the request at once.
  FakeLlamaServer slow;
  slow.first_attempt_429 = true;
  slow.retry_after = "3600";
  auto o = llama_options(slow);
  o.max_retry_after_s = 5;
  const Prompt q = prompt_with_key_at(slow.toy(), 12);
  const std::string err = HttpBackend::open(o)->score({{q.tokens, q.target}})[0].error;
  EXPECT_CONTAINS(err, "Retry-After asks for 3600 s, more than the 5 s allowed");
}

TEST(RateLimits, ConcurrencyHalvesOn429sAndEveryRequestSucceeds) {
  FakeLlamaServer server;
  server.max_in_flight = 2;
  server.work_ms = 20;
  auto o = llama_options(server);
  o.concurrency = 8;
  o.retries = 30;
  auto http = HttpBackend::open(o);
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 60; ++i) {
    const Prompt p = prompt_with_key_at(server.toy(), 12 + 4 * (i % 5));
    requests.push_back({p.tokens, p.target});
  }
  const auto got = http->score(requests);
  for (const auto& r : got) EXPECT_TRUE(r.error.empty()) << r.error;
  const TransportStats s = http->stats();
  EXPECT_GT(s.http_429, 0);
  EXPECT_GE(s.concurrency_decreases, 1);
  EXPECT_LE(s.min_concurrency_limit, 2) << "8 -> 4 -> 2 at least";
  EXPECT_EQ(s.failed, 0);
  EXPECT_LT(s.http_429, 60) << "fewer 429s than requests: the limit settles near the server's";
}

// Strides that do not divide the blind audit's default modulus 24: the weak spot every 5 (and 7)
// key positions is found from the records' key positions, as period 5 (7); the search over the
// divisors of 24 alone reported 12.
TEST(AuditBlind, AStrideThatDoesNotDivideTheModulusIsFoundFromKeyPositions) {
  const fs::path out = test::temp_dir("llama_stride5");
  for (int period : {5, 7}) {
    FakeLlamaServer server;
    server.weak_period = period;
    const fs::path dir = out / std::to_string(period);
    const Cli run = test::run_audit_cli(server.endpoint(), "any", dir, "",
                                        "--modulus 24 --examples 10 --records 3 "
                                        "--context-tokens 60");
    ASSERT_EQ(run.status, 0) << run.log;
    const json a = json::parse(read_file((dir / "audit.json").string()));
    EXPECT_EQ(a["period"]["detected_period"], period) << a["period"].dump();
    EXPECT_EQ(a["period"]["positions"], "key_pos");
    EXPECT_TRUE(a["period"]["significant"].get<bool>());
    EXPECT_CONTAINS(run.log, "periods tested: every period 2..12 (key positions)");
  }
  fs::remove_all(out);
}

// --prefill-pieces (conform's "prompt in pieces" condition): each scored prompt reaches the
// slot first as growing prefixes at k/K of its length, every request with the prompt cache on,
// then whole; the result is the whole prompt's. More than one request in flight is refused (the
// pieces must meet in one slot), and so is a server that is not llama.cpp.
TEST(LlamacppPieces, APromptArrivesAsGrowingPrefixesWithTheCacheOn) {
  FakeLlamaServer server;
  HttpBackendOptions o = llama_options(server);
  o.concurrency = 1;
  o.prefill_pieces = 3;
  auto http = HttpBackend::open(o);
  const Prompt p = prompt_with_key_at(server.toy(), 20);
  const int n = static_cast<int>(p.tokens.size());
  const ScoreResult whole = http->score({{p.tokens, p.target}}).front();
  ASSERT_TRUE(whole.error.empty()) << whole.error;
  const auto log = server.completion_log();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[0], std::make_pair(n / 3, true));
  EXPECT_EQ(log[1], std::make_pair(2 * n / 3, true));
  EXPECT_EQ(log[2], std::make_pair(n, true));
  EXPECT_EQ(http->describe()["prefill_pieces"], 3);

  o.prefill_pieces = 1;
  const ScoreResult plain = HttpBackend::open(o)->score({{p.tokens, p.target}}).front();
  EXPECT_EQ(plain.target_logprob, whole.target_logprob);
  EXPECT_EQ(server.completion_log().back(), std::make_pair(n, false));

  o.prefill_pieces = 2;
  o.concurrency = 2;
  try {
    HttpBackend::open(o);
    ADD_FAILURE() << "two requests in flight with pieces were accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "--concurrency 1");
  }
}

}  // namespace
}  // namespace phasekv
