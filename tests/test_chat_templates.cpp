// Chat audits of servers with real chat templates (issue 21): phases counted in the templated
// tokens, each prompt's rendering checked and hashed, reasoning on/off and its answer parser, a
// template file for servers that cannot render, and the cost in money. The servers are fakes
// whose JSON follows vLLM's and llama.cpp's documentation (fake_chat.h), with a planted period-4
// weak spot at templated key positions 3 mod 4 that the audits must find blind.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <regex>

#include "audit_cli.h"
#include "backend/http_chat.h"
#include "backend/http_cost.h"
#include "eval/results_file.h"
#include "fake_chat.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::FakeChatServer;

using Cli = test::AuditCli;

Cli chat_audit(const FakeChatServer& s, const std::filesystem::path& out,
               const std::string& extra) {
  return test::run_audit_cli(s.endpoint(), "chat-model --api chat", out, extra);
}

// The audit found period 4 blind, and exactly the records whose key sits at a templated
// position 3 mod 4 are wrong; every record names its rendered prompt and reasoning setting.
void expect_templated_period_four(const fs::path& out, int prefix_tokens,
                                  const std::string& reasoning) {
  const json a = json::parse(read_file((out / "audit.json").string()));
  EXPECT_EQ(a["period"]["detected_period"], 4) << a["period"].dump();
  EXPECT_TRUE(a["period"]["significant"].get<bool>()) << a["period"].dump();
  EXPECT_EQ(a["records"]["errors"], 0);
  const auto records = read_results((out / "results.jsonl").string()).records;
  ASSERT_EQ(records.size(), 48u);
  std::set<std::string> hashes;
  for (const auto& r : records) {
    EXPECT_EQ(r.key_pos % 8, r.phase);
    // The key is counted after the template's system prompt and markers.
    EXPECT_GT(r.key_pos, prefix_tokens);
    EXPECT_EQ(r.correct, r.key_pos % 4 != 3)
        << "example " << r.example_id << " phase " << r.phase << " key " << r.key_pos;
    EXPECT_EQ(r.extra.value("reasoning", ""), reasoning);
    ASSERT_TRUE(r.extra.contains("prompt_ids_fnv1a64"));
    hashes.insert(r.extra["prompt_ids_fnv1a64"].get<std::string>());
    EXPECT_TRUE(r.extra.value("position_ok", false));
  }
  EXPECT_EQ(hashes.size(), 48u) << "every (example, phase) prompt is another token sequence";
}

// ---------------------------------------------------------------------------------------------
// Shapes and the answer parser.

TEST(ChatAnswers, TheValueIsTheFirstNumberAfterTheReasoning) {
  ChatAnswer a = split_reasoning("<think>\nkey 1234 is near value 9.\n</think>\n\n7314", "");
  EXPECT_EQ(first_number(a.answer), "7314");
  EXPECT_EQ(a.reasoning, "\nkey 1234 is near value 9.\n");
  EXPECT_TRUE(a.reasoning_closed);
  // Templates that open <think> in the prompt (Qwen3 thinking, DeepSeek-R1) send no opener.
  a = split_reasoning("the key is 1234\n</think>\nThe value is **7314**.", "");
  EXPECT_EQ(first_number(a.answer), "7314");
  // A server's reasoning parser moved the reasoning into its own field.
  a = split_reasoning("7314", "key 1234 ... 9");
  EXPECT_EQ(a.answer, "7314");
  EXPECT_EQ(a.reasoning, "key 1234 ... 9");
  // The budget ran out inside the reasoning: no answer, even though digits appear.
  a = split_reasoning("<think>\nkey 1234 has value 7", "");
  EXPECT_FALSE(a.reasoning_closed);
  EXPECT_EQ(first_number(a.answer), "");
  EXPECT_EQ(first_number("no digits"), "");
  EXPECT_EQ(first_number("0000"), "0000");
}

TEST(ChatAnswers, RequestShapesFollowTheServersDocumentation) {
  // vLLM / SGLang: TokenizeChatRequest {model, messages, add_generation_prompt,
  // add_special_tokens, chat_template_kwargs}.
  HttpCall c = chat_render_call(ChatRenderSource::kServerTokenize, "m", "hi", "off");
  EXPECT_EQ(c.route, "/tokenize");
  EXPECT_EQ(c.body["messages"], json::parse(R"([{"role":"user","content":"hi"}])"));
  EXPECT_EQ(c.body["add_generation_prompt"], true);
  EXPECT_EQ(c.body["add_special_tokens"], false);
  EXPECT_EQ(c.body["chat_template_kwargs"],
            json({{"enable_thinking", false}, {"thinking", false}}));
  EXPECT_FALSE(c.body.contains("reasoning_effort"));
  // llama.cpp: /apply-template {messages} -> {prompt}.
  c = chat_render_call(ChatRenderSource::kApplyTemplate, "m", "hi", "");
  EXPECT_EQ(c.route, "/apply-template");
  EXPECT_FALSE(c.body.contains("chat_template_kwargs"));
  EXPECT_EQ(parse_applied_template(json{{"prompt", "<|im_start|>user\nhi"}}),
            "<|im_start|>user\nhi");
  EXPECT_THROW(parse_applied_template(json{{"text", "x"}}), ProtocolError);
  // Effort is a sampling field of the chat request, not a template kwarg.
  ChatCallOptions o;
  o.max_tokens = 64;
  o.reasoning = "high";
  o.logprobs = false;
  c = chat_call({"m", 20, "", true}, "hi", o);
  EXPECT_EQ(c.body["reasoning_effort"], "high");
  EXPECT_EQ(c.body["max_tokens"], 64);
  EXPECT_FALSE(c.body.contains("logprobs"));
  EXPECT_EQ(c.body["cache_prompt"], false);
  EXPECT_THROW(check_reasoning("maybe"), Error);
  // A template file holds {{content}} exactly once.
  EXPECT_EQ(fill_template_file("<u>{{content}}</u>", "t", "hi"), "<u>hi</u>");
  EXPECT_THROW(fill_template_file("<u></u>", "t", "hi"), Error);
  EXPECT_THROW(fill_template_file("{{content}}{{content}}", "t", "hi"), Error);
  // The frame: the template's tokens around a probe's content, which must appear exactly once.
  const ChatFrame f = frame_from_probe({1, 2, 7, 8, 3}, {7, 8});
  EXPECT_EQ(f.prefix, std::vector<int32_t>({1, 2}));
  EXPECT_EQ(f.suffix, std::vector<int32_t>({3}));
  EXPECT_THROW(frame_from_probe({1, 7, 3}, {7, 8}), ProtocolError);
  EXPECT_THROW(frame_from_probe({7, 8, 7, 8}, {7, 8}), ProtocolError);
}

TEST(ChatAnswers, ParsesTheDocumentedAnswerShapes) {
  // vLLM chat completion with a reasoning parser (docs: reasoning outputs) and usage.
  const json vllm = json::parse(R"({"id":"chatcmpl-1","object":"chat.completion","created":1,
    "model":"m","choices":[{"index":0,"message":{"role":"assistant","content":"\n\n7314",
    "reasoning":"The record says 7314.","tool_calls":[]},"logprobs":null,
    "finish_reason":"stop","stop_reason":null}],
    "usage":{"prompt_tokens":5,"total_tokens":20,"completion_tokens":15}})");
  Generated g = parse_chat_generate(vllm, 5);
  ASSERT_TRUE(g.text);
  EXPECT_EQ(first_number(*g.text), "7314");
  EXPECT_EQ(g.reasoning, "The record says 7314.");
  EXPECT_EQ(g.finish_reason, "stop");
  EXPECT_TRUE(g.tokens.empty());
  EXPECT_THROW(parse_chat_generate(vllm, 6), ProtocolError) << "prompt_tokens differ";
  // llama.cpp chat logprobs name each token by id besides its text.
  const json llama = json::parse(R"({"choices":[{"index":0,"finish_reason":"length",
    "message":{"role":"assistant","content":"731","reasoning_content":null},
    "logprobs":{"content":[{"id":42,"token":"731","bytes":[55,51,49],"logprob":-0.1,
    "top_logprobs":[{"id":42,"token":"731","bytes":[55,51,49],"logprob":-0.1},
                    {"id":9,"token":"0","bytes":[48],"logprob":-2.5}]}]}}],
    "usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}})");
  const ScoreResult s = parse_chat_score(llama, {{1, 2, 3}, 9});
  EXPECT_EQ(s.argmax, 42);
  EXPECT_DOUBLE_EQ(s.target_logprob, -2.5);
  EXPECT_FALSE(s.censored);
  // Token text without ids (SGLang's chat logprobs) cannot be matched to the target.
  json text_only = llama;
  for (auto& e : text_only["choices"][0]["logprobs"]["content"]) e.erase("id");
  try {
    parse_chat_score(text_only, {{1, 2, 3}, 9});
    ADD_FAILURE() << "matched a token by its text";
  } catch (const ProtocolError& e) {
    EXPECT_CONTAINS(e.what(), "--mode generate");
  }
}

TEST(ChatAnswers, PricesTurnUsageIntoMoney) {
  const TokenPrices p = parse_token_prices("0.5,2", "--price-per-mtok");
  EXPECT_DOUBLE_EQ(token_cost(p, 1'000'000, 0, 500'000), 0.5 + 1.0);
  const TokenPrices c = parse_token_prices("1,4,0.25", "--price-per-mtok");
  EXPECT_DOUBLE_EQ(token_cost(c, 2'000'000, 1'000'000, 0), 1.0 + 0.25);
  for (const char* bad : {"", "1", "1,2,3,4", "a,1", "-1,2", "1,", "1,,2", "1,nan"})
    EXPECT_THROW(parse_token_prices(bad, "--price-per-mtok"), Error) << bad;
}

// ---------------------------------------------------------------------------------------------
// Blind audits against the fake chat servers.

TEST(ChatTemplateAudit, ABlindLogprobAuditFindsTheTemplatedPeriodFour) {
  FakeChatServer server({});
  const fs::path out = test::temp_dir("chat_tmpl") / "logprob";
  const Cli cli = chat_audit(server, out, "--reasoning off --price-per-mtok 1,3");
  ASSERT_EQ(cli.status, 0) << cli.log;
  expect_templated_period_four(out, server.prefix_tokens(), "off");
  const json a = json::parse(read_file((out / "audit.json").string()));
  // The frame the server's template adds: ChatML system prompt before, end-of-turn, assistant
  // header and the empty thinking block (reasoning off) after.
  EXPECT_EQ(a["backend"]["chat_template_leading_tokens"].size(),
            static_cast<size_t>(server.prefix_tokens()));
  EXPECT_EQ(a["task"]["chat_template_suffix_tokens"], 9);
  EXPECT_CONTAINS(a["backend"]["chat_template"].get<std::string>(), "POST /tokenize {messages}");
  EXPECT_EQ(a["backend"]["reasoning_request_fields"]["chat_template_kwargs"]["enable_thinking"],
            false);
  // Usage and its cost: 48 chat answers of one token each.
  EXPECT_EQ(a["usage"]["answers_with_usage"], 48);
  EXPECT_EQ(a["usage"]["completion_tokens"], 48);
  const double want = (a["usage"]["prompt_tokens"].get<double>() * 1 + 48.0 * 3) / 1e6;
  EXPECT_DOUBLE_EQ(a["usage"]["cost"].get<double>(), want);
  EXPECT_GT(a["plan"]["estimated_cost"].get<double>(), 0.0);
  EXPECT_CONTAINS(cli.log, "cost of that usage");
}

TEST(ChatTemplateAudit, GenerateWithReasoningReadsTheAnswerAfterTheThinkBlock) {
  FakeChatServer server({});
  const fs::path dir = test::temp_dir("chat_think");
  const Cli cli = chat_audit(server, dir / "on", "--mode generate --reasoning on");
  ASSERT_EQ(cli.status, 0) << cli.log;
  expect_templated_period_four(dir / "on", server.prefix_tokens(), "on");
  EXPECT_EQ(server.last_max_tokens, 1024) << "the default budget leaves room to reason";
  const auto records = read_results((dir / "on" / "results.jsonl").string()).records;
  for (const auto& r : records) {
    EXPECT_GT(r.extra.value("reasoning_chars", 0), 20);
    if (!r.correct) {
      EXPECT_EQ(r.extra.value("answer", ""), "0000");
    }
  }
  // A budget the reasoning uses up: no answer comes, every record is wrong and counted.
  const Cli small =
      chat_audit(server, dir / "small", "--mode generate --reasoning on --max-tokens 6");
  ASSERT_EQ(small.status, 0) << small.log;
  const json a = json::parse(read_file((dir / "small" / "audit.json").string()));
  EXPECT_EQ(a["records"]["answers_missing"], 48);
  EXPECT_EQ(a["generation_budget"], 6);
  EXPECT_CONTAINS(small.log, "raise --max-tokens");
  // Logprob scoring of a reasoning model would score the reasoning's first token.
  const Cli refused = chat_audit(server, dir / "refused", "--reasoning on");
  EXPECT_EQ(refused.status, 2) << refused.log;
  EXPECT_CONTAINS(refused.log, "use --mode generate");
}

TEST(ChatTemplateAudit, LlamacppRendersThroughApplyTemplateAndAReasoningField) {
  FakeChatServer::Options o;
  o.flavor = FakeChatServer::Flavor::kLlamacpp;
  o.reasoning = FakeChatServer::ReasoningOutput::kField;
  FakeChatServer server(o);
  const fs::path out = test::temp_dir("chat_llama") / "run";
  const Cli cli = chat_audit(server, out, "--mode generate --reasoning on --max-tokens 64");
  ASSERT_EQ(cli.status, 0) << cli.log;
  expect_templated_period_four(out, server.prefix_tokens(), "on");
  const json a = json::parse(read_file((out / "audit.json").string()));
  EXPECT_EQ(a["backend"]["dialect"], "llamacpp");
  EXPECT_CONTAINS(a["backend"]["chat_template"].get<std::string>(), "/apply-template");
  EXPECT_EQ(a["backend"]["chat_template_leading_tokens"][0], 0) << "llama.cpp adds the BOS";
  EXPECT_GT(server.renders.load(), 48);
}

TEST(ChatTemplateAudit, ATemplateFileStandsInForAServerThatCannotRender) {
  FakeChatServer::Options o;
  o.renders_messages = false;
  FakeChatServer server(o);
  const fs::path dir = test::temp_dir("chat_file");
  const Cli none = chat_audit(server, dir / "none", "--reasoning off");
  EXPECT_EQ(none.status, 2) << none.log;
  EXPECT_CONTAINS(none.log, "give --chat-template FILE");

  const fs::path file = dir / "chatml.txt";
  write_file_atomic(file.string(), FakeChatServer::template_file_text());
  const Cli cli =
      chat_audit(server, dir / "file", "--reasoning off --chat-template " + file.string());
  ASSERT_EQ(cli.status, 0) << cli.log;
  expect_templated_period_four(dir / "file", server.prefix_tokens(), "off");
  const json a = json::parse(read_file((dir / "file" / "audit.json").string()));
  EXPECT_EQ(a["backend"]["chat_template_file"], file.string());
  EXPECT_CONTAINS(a["backend"]["chat_template"].get<std::string>(), "not the server's own");

  // A file that leaves out the system prompt plans other positions than the server renders:
  // every answer's prompt_tokens disagrees, so every item is an error (none a wrong phase) and
  // the audit stops with no phase to summarize.
  const fs::path wrong = dir / "wrong.txt";
  std::string text = FakeChatServer::template_file_text();
  text.erase(0, text.find("<|im_start|>user"));
  write_file_atomic(wrong.string(), text);
  const Cli bad =
      chat_audit(server, dir / "wrong", "--reasoning off --chat-template " + wrong.string());
  EXPECT_EQ(bad.status, 2) << bad.log;
  EXPECT_CONTAINS(bad.log, "a --chat-template file that differs");
  const auto records = read_results((dir / "wrong" / "results.jsonl").string()).records;
  ASSERT_FALSE(records.empty());
  for (const auto& r : records)
    EXPECT_CONTAINS(r.error, "prompt tokens, " + std::to_string(r.query_pos + 1) + " were sent");
}

TEST(ChatTemplateAudit, TheDryRunPlansTheCost) {
  FakeChatServer server({});
  const fs::path out = test::temp_dir("chat_dry") / "run";
  const Cli dry = chat_audit(server, out, "--reasoning off --dry-run --price-per-mtok 2,8");
  ASSERT_EQ(dry.status, 0) << dry.log;
  std::smatch m;
  ASSERT_TRUE(std::regex_search(dry.log, m, std::regex("prompt tokens: (\\d+) ")));
  const double prompt = std::stod(m[1]);
  ASSERT_TRUE(std::regex_search(dry.log, m, std::regex("cost: about ([0-9.]+) at 2 in / 8 out")))
      << dry.log;
  EXPECT_NEAR(std::stod(m[1]), (prompt * 2 + 48 * 8) / 1e6, 1e-4);
  EXPECT_EQ(server.chats.load(), 0);
  EXPECT_FALSE(fs::exists(out / "audit.json"));
}

}  // namespace
}  // namespace phasekv
