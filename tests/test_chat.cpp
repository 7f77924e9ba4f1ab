// Chat completions and streaming of `phasekv serve`, and the chat-mode audit:
//  - the chat template renders messages into the task's own tokens, and a chat answer equals
//    the completions answer for the same ids (tokens and logprobs);
//  - a stream's chunks, concatenated, equal the whole answer (text, logprobs, usage), and a
//    client that leaves stops the generation;
//  - chat requests are validated like completions (4xx JSON naming the field);
//  - HttpBackend with api chat scores like the completions route, and a blind chat audit of the
//    bundled chunked model finds period 4 with the completions audit's predictions.
// The official OpenAI client drives the same routes in tests/openai.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmath>
#include <map>
#include <set>

#include "backend/http_chat.h"
#include "backend/http_client.h"
#include "eval/results_file.h"
#include "served.h"
#include "test_util.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::events;
using test::expect_error;
using test::post;
using test::post_raw;
using test::Reply;
using test::Served;

class ChatTest : public ::testing::Test {
 protected:
  // max_context 512: room for a long stream in the disconnect test.
  static void SetUpTestSuite() { served_ = new Served({}, 512); }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  static Served* served_;
};
Served* ChatTest::served_ = nullptr;

const TaskVocab kVocab = task_vocab(test::small_kv_task());

TEST_F(ChatTest, MessagesRenderIntoTheTaskTokensAndAnswerLikeCompletions) {
  const int port = served_->port();
  const json messages = {{{"role", "system"}, {"content", "f1"}},
                         {{"role", "user"},
                          {"content", json::array({{{"type", "text"}, {"text", "k2 v3"}},
                                                   {{"type", "text"}, {"text", "<q> k2"}}})}}};
  const std::vector<int32_t> ids = {TaskVocab::kBos, kVocab.filler(1),  kVocab.key(2),
                                    kVocab.value(3), TaskVocab::kQuery, kVocab.key(2)};
  Reply t = post(port, "/tokenize", json({{"messages", messages}}).dump());
  ASSERT_EQ(t.status, 200) << t.body.dump();
  EXPECT_EQ(t.body["tokens"], json(ids));
  EXPECT_EQ(t.body["count"], 6);

  Reply chat = post(port, "/v1/chat/completions",
                    json({{"messages", messages},
                          {"max_tokens", 3},
                          {"temperature", 0},
                          {"logprobs", true},
                          {"top_logprobs", 3},
                          {"return_tokens_as_token_ids", true}})
                        .dump());
  Reply cmpl = post(port, "/v1/completions",
                    json({{"prompt", ids},
                          {"max_tokens", 3},
                          {"temperature", 0},
                          {"logprobs", 3},
                          {"return_token_ids", true}})
                        .dump());
  ASSERT_EQ(chat.status, 200) << chat.body.dump();
  ASSERT_EQ(cmpl.status, 200) << cmpl.body.dump();
  EXPECT_EQ(chat.body["object"], "chat.completion");
  const json& choice = chat.body["choices"][0];
  const json& want = cmpl.body["choices"][0];
  EXPECT_EQ(choice["message"]["role"], "assistant");
  // The content is the generated words; the completions text is the same words after a space.
  EXPECT_EQ(" " + choice["message"]["content"].get<std::string>(), want["text"]);
  const json& content = choice["logprobs"]["content"];
  ASSERT_EQ(content.size(), 3u);
  for (size_t t = 0; t < 3; ++t) {
    EXPECT_EQ(content[t]["token"], "token_id:" + std::to_string(want["token_ids"][t].get<int>()));
    EXPECT_EQ(content[t]["logprob"], want["logprobs"]["token_logprobs"][t]);
    const json& top = content[t]["top_logprobs"];
    ASSERT_EQ(top.size(), 3u);
    EXPECT_EQ(top[0]["token"], content[t]["token"]) << "greedy: the chosen token is the best";
    EXPECT_GE(top[0]["logprob"].get<double>(), top[1]["logprob"].get<double>());
    EXPECT_GE(top[1]["logprob"].get<double>(), top[2]["logprob"].get<double>());
  }
  EXPECT_EQ(chat.body["usage"],
            json({{"prompt_tokens", 6}, {"completion_tokens", 3}, {"total_tokens", 9}}));

  httplib::Client c("127.0.0.1", port);
  auto models = c.Get("/v1/models");
  ASSERT_TRUE(models);
  const json card = json::parse(models->body)["data"][0];
  EXPECT_CONTAINS(card["phasekv"]["chat_template"].get<std::string>(), "bos_token");
}

TEST_F(ChatTest, StreamedChunksEqualTheWholeAnswer) {
  const int port = served_->port();
  for (const bool echo : {false, true}) {
    json body = {{"prompt", "f1 k2 v3 <q> k2"},
                 {"max_tokens", 5},
                 {"temperature", 0},
                 {"logprobs", 2},
                 {"echo", echo}};
    const Reply whole = post(port, "/v1/completions", body.dump());
    ASSERT_EQ(whole.status, 200) << whole.body.dump();
    body["stream"] = true;
    body["stream_options"] = {{"include_usage", true}};
    const auto ev = events(post_raw(port, "/v1/completions", body));
    ASSERT_GE(ev.size(), 3u);
    EXPECT_EQ(ev.back(), "[DONE]");
    std::string text;
    json logprobs = json::array(), tokens = json::array();
    int finished = 0;
    for (size_t i = 0; i + 2 < ev.size(); ++i) {
      const json chunk = json::parse(ev[i]);
      EXPECT_EQ(chunk["object"], "text_completion");
      EXPECT_TRUE(chunk["usage"].is_null());
      const json& c = chunk["choices"][0];
      text += c["text"].get<std::string>();
      for (const auto& v : c["logprobs"]["token_logprobs"]) logprobs.push_back(v);
      for (const auto& v : c["logprobs"]["tokens"]) tokens.push_back(v);
      finished += c["finish_reason"].is_null() ? 0 : 1;
      EXPECT_EQ(c["finish_reason"].is_null(), i + 3 < ev.size()) << "only the last has it";
    }
    const json& w = whole.body["choices"][0];
    EXPECT_EQ(text, w["text"]) << "echo " << echo;
    EXPECT_EQ(logprobs, w["logprobs"]["token_logprobs"]);
    EXPECT_EQ(tokens, w["logprobs"]["tokens"]);
    EXPECT_EQ(finished, 1);
    const json usage = json::parse(ev[ev.size() - 2]);
    EXPECT_TRUE(usage["choices"].empty());
    EXPECT_EQ(usage["usage"], whole.body["usage"]);
  }

  json chat = {{"messages", {{{"role", "user"}, {"content", "f1 k2 v3 <q> k2"}}}},
               {"max_tokens", 4},
               {"temperature", 0},
               {"logprobs", true},
               {"top_logprobs", 2}};
  const Reply whole = post(port, "/v1/chat/completions", chat.dump());
  ASSERT_EQ(whole.status, 200) << whole.body.dump();
  chat["stream"] = true;
  const auto ev = events(post_raw(port, "/v1/chat/completions", chat));
  ASSERT_EQ(ev.size(), 6u);  // role, 4 tokens, [DONE] (no usage chunk unless asked)
  EXPECT_EQ(ev.back(), "[DONE]");
  EXPECT_EQ(json::parse(ev[0])["choices"][0]["delta"]["role"], "assistant");
  std::string content;
  json entries = json::array();
  for (size_t i = 1; i + 1 < ev.size(); ++i) {
    const json chunk = json::parse(ev[i]);
    EXPECT_EQ(chunk["object"], "chat.completion.chunk");
    EXPECT_FALSE(chunk.contains("usage"));
    content += chunk["choices"][0]["delta"]["content"].get<std::string>();
    entries.push_back(chunk["choices"][0]["logprobs"]["content"][0]);
  }
  EXPECT_EQ(content, whole.body["choices"][0]["message"]["content"]);
  EXPECT_EQ(entries, whole.body["choices"][0]["logprobs"]["content"]);
}

TEST_F(ChatTest, ChatRequestsAreValidatedLikeCompletions) {
  const int port = served_->port();
  const std::string p = "/v1/chat/completions";
  const std::string user = R"([{"role": "user", "content": "k1 v2"}])";
  expect_error(post(port, p, "{}"), 400, "messages", "non-empty list");
  expect_error(post(port, p, R"({"messages": []})"), 400, "messages", "an empty list");
  expect_error(post(port, p, R"({"messages": [{"role": "robot", "content": "k1"}]})"), 400,
               "messages", "messages[0].role");
  expect_error(post(port, p, R"({"messages": [{"role": "user", "content": "k1 hello"}]})"), 400,
               "messages", "hello");
  expect_error(
      post(port, p, R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})"), 400,
      "messages", "messages[0].content[0]");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "top_logprobs": 2})"), 400,
               "top_logprobs", "needs 'logprobs': true");
  expect_error(
      post(port, p, R"({"messages": )" + user + R"(, "logprobs": true, "top_logprobs": 21})"), 400,
      "top_logprobs", "0..20");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "stream_options": {}})"), 400,
               "stream_options", "stream");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "n": 2})"), 400, "n", "1..1");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "max_completion_tokens": 0})"), 400,
               "max_completion_tokens", "at least one token");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "max_tokens": 600})"), 400,
               "max_tokens", "maximum context length");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "chat_template": "x"})"), 400,
               "chat_template", "own template");
  expect_error(post(port, p, R"({"messages": )" + user + R"(, "model": "other"})"), 404, "model",
               "other");
  expect_error(post(port, "/tokenize", R"({"prompt": "k1", "messages": )" + user + "}"), 400,
               "messages", "not both");
  // Unknown fields are ignored, as on /v1/completions (OpenAI clients send many).
  EXPECT_EQ(
      post(port, p, R"({"messages": )" + user + R"(, "frequency_penalty": 0, "user": "u"})").status,
      200);
}

// A client that reads one chunk and closes the connection stops the generation: the model
// produces far fewer than the 400 tokens asked for.
TEST_F(ChatTest, ClientDisconnectStopsTheStream) {
  const int64_t before = served_->server().tokens_generated();
  const std::string body =
      json({{"prompt", "f1 k2 v3 <q> k2"}, {"max_tokens", 400}, {"stream", true}}).dump();
  const std::string request =
      "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: "
      "application/json\r\nContent-Length: " +
      std::to_string(body.size()) + "\r\n\r\n" + body;
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(served_->port()));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string got;
  char buf[256];
  while (got.find("data: ") == std::string::npos) {
    const ssize_t n = ::read(fd, buf, sizeof(buf));
    ASSERT_GT(n, 0);
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fd);
  // Wait until the generation has stopped (the count no longer moves).
  int64_t last = -1, now = served_->server().tokens_generated();
  for (int i = 0; i < 100 && now != last; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    last = now;
    now = served_->server().tokens_generated();
  }
  EXPECT_LT(now - before, 400) << "the stream ran to the end after the client left";
  // The server still answers.
  EXPECT_EQ(
      post(served_->port(), "/v1/completions", R"({"prompt": [1, 5], "max_tokens": 1})").status,
      200);
}

TEST_F(ChatTest, HttpBackendScoresThroughChatLikeThroughCompletions) {
  std::vector<ScoreRequest> requests;
  for (int e = 0; e < 2; ++e) {
    const auto lg = make_logical_example(test::small_kv_task(), 3, static_cast<uint64_t>(e));
    for (int r = 0; r < 8; ++r) {
      const TaskExample ex = materialize(lg, 8, r, PaddingMode::kPrefix, false);
      requests.push_back({ex.tokens, ex.target().answer});
    }
  }
  HttpBackendOptions o;
  o.endpoint = served_->endpoint();
  o.model = served_->name();
  o.concurrency = 4;
  o.timeout_s = 10;
  const auto plain = HttpBackend::open(o)->score(requests);
  o.api = ApiKind::kChat;
  auto chat = HttpBackend::open(o);
  EXPECT_EQ(chat->describe()["api"], "chat");
  EXPECT_EQ(chat->describe()["chat_template_leading_tokens"], json({TaskVocab::kBos}));
  const auto got = chat->score(requests);
  ASSERT_EQ(got.size(), plain.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i].error.empty()) << got[i].error;
    EXPECT_EQ(got[i].argmax, plain[i].argmax) << i;
    EXPECT_NEAR(got[i].argmax_logprob, plain[i].argmax_logprob, 1e-4) << i;
    if (!got[i].censored) {
      EXPECT_NEAR(got[i].target_logprob, plain[i].target_logprob, 1e-4) << i;
    }
  }
  // Generate mode through chat: the greedy tokens of the completions route.
  o.mode = ScoreMode::kGenerate;
  const auto gen = HttpBackend::open(o)->generate_many({requests[0].context}, 3);
  ASSERT_TRUE(gen[0].error.empty()) << gen[0].error;
  EXPECT_EQ(gen[0].tokens, served_->local().generate(requests[0].context, 3));
  // A context that does not start with the template's <bos> cannot be rendered: its own error.
  const auto bad = chat->score({{{kVocab.filler(0), kVocab.key(1)}, kVocab.value(1)}});
  EXPECT_CONTAINS(bad[0].error, "leading tokens");
}

TEST(ChatWire, ScoresCensorsAndReportsRenderMismatches) {
  const json response = json::parse(R"({
    "choices": [{"index": 0, "message": {"role": "assistant", "content": "v3"},
      "logprobs": {"content": [{"token": "token_id:9", "logprob": -0.1, "bytes": [],
        "top_logprobs": [{"token": "token_id:9", "logprob": -0.1, "bytes": []},
                         {"token": "token_id:7", "logprob": -2.5, "bytes": []}]}]},
      "finish_reason": "length"}],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1, "total_tokens": 4}})");
  ScoreResult s = parse_chat_score(response, {{1, 5, 6}, 7});
  EXPECT_EQ(s.argmax, 9);
  EXPECT_DOUBLE_EQ(s.argmax_logprob, -0.1);
  EXPECT_DOUBLE_EQ(s.target_logprob, -2.5);
  EXPECT_FALSE(s.censored);
  s = parse_chat_score(response, {{1, 5, 6}, 8});
  EXPECT_TRUE(s.censored);
  EXPECT_EQ(s.argmax, 9);
  EXPECT_THROW(parse_chat_score(response, {{1, 5}, 7}), ProtocolError);  // 3 tokens seen, 2 sent
  EXPECT_EQ(chat_render_mismatch({1, 5, 6}, {1, 5, 6}), "");
  EXPECT_CONTAINS(chat_render_mismatch({1, 5, 6, 2}, {1, 5, 6}), "first difference at position 3");
}

// The bundled chunked model (S = 4) served, audited blind through the chat endpoint: period 4,
// and the same predictions as the completions audit of the same examples.
TEST(ChatAudit, BlindChatAuditOfTheServedChunkedModelFindsPeriod4) {
  const fs::path dir = test::temp_dir("chat_audit");
  const std::string bin = PHASEKV_BINARY;
  test::ServeProcess server(bin, std::string(PHASEKV_SOURCE_DIR) + "/models/kv-chunked",
                            dir / "serve.log");
  ASSERT_FALSE(server.endpoint().empty()) << server.log();
  auto audit = [&](const std::string& api, const std::string& out) {
    const std::string cmd = bin + " audit --endpoint " + server.endpoint() + " --model '" +
                            server.name() + "' --api " + api +
                            " --modulus 8 --examples 60 --concurrency 8 --out " +
                            (dir / out).string() + " > " + (dir / "log").string() + " 2>&1";
    const int st = std::system(cmd.c_str());
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  };
  ASSERT_EQ(audit("chat", "chat"), 0) << test::slurp(dir / "log");
  ASSERT_EQ(audit("completions", "completions"), 0) << test::slurp(dir / "log");
  const json a = json::parse(test::slurp(dir / "chat" / "audit.json"));
  EXPECT_TRUE(a["stride_given"].is_null());
  EXPECT_EQ(a["backend"]["api"], "chat");
  EXPECT_EQ(a["period"]["detected_period"].get<int>(), 4) << a["period"];
  EXPECT_LT(a["period"]["p_value"].get<double>(), 0.01);
  EXPECT_EQ(a["records"]["errors"].get<int>(), 0);
  std::map<std::pair<int64_t, int>, int32_t> chat, plain;
  std::set<std::string> hashes;
  for (const auto& r : read_results((dir / "chat" / "results.jsonl").string()).records) {
    chat[{r.example_id, r.phase}] = r.prediction;
    // Every chat record names the prompt the server rendered (checked equal to the plan's ids).
    ASSERT_EQ(r.extra.value("prompt_ids_fnv1a64", std::string()).size(), 16u) << r.extra.dump();
    EXPECT_GT(r.extra.value("prompt_tokens", 0), 0);
    hashes.insert(r.extra["prompt_ids_fnv1a64"].get<std::string>());
  }
  EXPECT_EQ(hashes.size(), 480u) << "every (example, phase) prompt differs";
  for (const auto& r : read_results((dir / "completions" / "results.jsonl").string()).records) {
    plain[{r.example_id, r.phase}] = r.prediction;
    EXPECT_FALSE(r.extra.contains("prompt_ids_fnv1a64"));
  }
  ASSERT_EQ(chat.size(), 480u);
  EXPECT_EQ(chat, plain);
  // A chat audit resumed into the completions audit's directory would mix two measurements.
  EXPECT_EQ(audit("chat", "completions"), 2);
  EXPECT_CONTAINS(test::slurp(dir / "log"), "holds a completions audit");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
