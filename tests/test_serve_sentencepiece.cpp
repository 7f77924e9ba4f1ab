// A model with a sentencepiece tokenizer (trained by `phasekv tokenizer train`) behind `phasekv
// serve` and the in-process backend: text prompts tokenize as libsentencepiece does (compared
// with `phasekv tokenizer encode`, which runs it), detokenize back, and completions and their
// logprobs show the pieces' text.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "backend/http_client.h"
#include "served.h"
#include "util/manifest.h"

namespace phasekv {
namespace {

using nlohmann::json;
using test::post;
using test::Served;

const char* kLines =
    "def quantize(x, scale):\n    y = x / scale\n    return clamp(y, -448.0, 448.0)\n"
    "class Buffer:\n    def put(self, i, v):\n        self.data[i] = v\n";

std::string run_capture(const std::string& cmd, const std::filesystem::path& out) {
  EXPECT_EQ(std::system((cmd + " > " + out.string() + " 2>&1").c_str()), 0) << cmd;
  return test::slurp(out.string());
}

// A tiny random model whose vocabulary is a 300-piece tokenizer trained on kLines.
void write_model(const std::string& dir) {
  const std::filesystem::path root = std::filesystem::path(dir).parent_path();
  std::string text;
  for (int r = 0; r < 30; ++r) text += kLines;
  std::ofstream(root / "code.py") << text;
  const json manifest = {{"files",
                          {{{"path", (root / "code.py").string()},
                            {"bytes", text.size()},
                            {"sha256", sha256_hex(text)}}}}};
  std::ofstream(root / "corpus.json") << manifest.dump();
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 2;
  ModelConfig cfg = test::tiny_config(a);
  cfg.vocab_size = 300;
  cfg.max_context = 64;
  Decoder model = test::make_model(cfg, 5);
  save_model_dir(dir, model);
  run_capture(std::string(PHASEKV_BINARY) + " tokenizer train --manifest " +
                  (root / "corpus.json").string() + " --out " + dir + " --vocab-size 300",
              root / "train.log");
}

class ServeSentencePiece : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { served_ = new Served({}, 64, write_model); }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  static Served* served_;
};
Served* ServeSentencePiece::served_ = nullptr;

TEST_F(ServeSentencePiece, TextTokenizesAsLibsentencepieceAndRoundTrips) {
  const int port = served_->port();
  httplib::Client c("127.0.0.1", port);
  const auto models = json::parse(c.Get("/v1/models")->body);
  EXPECT_EQ(models["data"][0]["phasekv"]["tokenizer"], "sentencepiece");
  EXPECT_EQ(served_->local().describe()["tokenizer"], "sentencepiece");
  for (const std::string text : {"    return clamp(y, -448.0, 448.0)", "T.Cast(FP8 é€ 😀", " x"}) {
    // `phasekv tokenizer encode` prints libsentencepiece's ids, comma-separated, on its first line.
    const auto tmp = std::filesystem::temp_directory_path() / "phasekv_spm_encode.txt";
    const std::string tok_dir = served_->model_dir();
    std::string printed =
        run_capture(std::string(PHASEKV_BINARY) + " tokenizer encode --tokenizer " + tok_dir +
                        " --text '" + text + "'",
                    tmp);
    printed = printed.substr(0, printed.find('\n'));
    std::vector<int32_t> want;
    for (size_t at = 0; at < printed.size();) {
      const size_t comma = printed.find(',', at);
      want.push_back(std::stoi(printed.substr(at, comma - at)));
      at = comma == std::string::npos ? printed.size() : comma + 1;
    }
    EXPECT_EQ(served_->local().tokenize(text), want) << text;
    const auto r = post(port, "/tokenize", json{{"prompt", text}}.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    std::vector<int32_t> with_bos = {1};  // /tokenize adds the start piece <s>, as vLLM does
    with_bos.insert(with_bos.end(), want.begin(), want.end());
    EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), with_bos) << text;
    const auto d = post(port, "/detokenize", json{{"tokens", want}}.dump());
    ASSERT_EQ(d.status, 200) << d.body.dump();
    EXPECT_EQ(d.body["prompt"], text);
    EXPECT_EQ(served_->local().detokenize(want), text);
  }
}

TEST_F(ServeSentencePiece, CompletionTextAndLogprobsShowThePieces) {
  const auto r = post(served_->port(), "/v1/completions",
                      json{{"model", served_->name()},
                           {"prompt", "def quantize(x"},
                           {"max_tokens", 6},
                           {"temperature", 0},
                           {"logprobs", 2}}
                          .dump());
  ASSERT_EQ(r.status, 200) << r.body.dump();
  const json& choice = r.body["choices"][0];
  const json& lp = choice["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  // Pieces join with nothing between them, and each offset is where its token's text starts.
  std::string joined;
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i], joined.size()) << i;
    joined += lp["tokens"][i].get<std::string>();
  }
  // The choice's text is the decoded pieces (equal to the join unless a byte piece splits a
  // character, which the random model may emit: then each of its pieces shows U+FFFD).
  const auto gen = served_->local().tokenize(choice["text"].get<std::string>());
  EXPECT_EQ(served_->local().detokenize(gen), choice["text"].get<std::string>());
  if (joined.find("\xEF\xBF\xBD") == std::string::npos) {
    EXPECT_EQ(choice["text"], joined);
  }
}

// A stream's text is the whole answer's, byte for byte: each chunk is what its token adds to
// the text decoded so far (pieces carry their own spaces, byte pieces form one character
// together), not the token decoded alone after a space (issue 46). Greedy and sampled, with
// and without echo, completions and chat.
TEST_F(ServeSentencePiece, StreamedTextEqualsTheWholeText) {
  const int port = served_->port();
  auto chunks_of = [&](const char* route, json body) {
    body["stream"] = true;
    std::vector<json> out;
    for (const auto& e : test::events(test::post_raw(port, route, body)))
      if (e != "[DONE]") out.push_back(json::parse(e));
    return out;
  };
  int compared = 0;
  for (const json& sampling : {json{{"temperature", 0}}, json{{"temperature", 1.0}, {"seed", 3}}}) {
    for (const bool echo : {false, true}) {
      json body = {{"model", served_->name()},
                   {"prompt", "    def put(self, i"},
                   {"max_tokens", 24},
                   {"echo", echo},
                   {"return_token_ids", true}};
      body.update(sampling);
      const auto whole = post(port, "/v1/completions", body.dump());
      ASSERT_EQ(whole.status, 200) << whole.body.dump();
      const json& want = whole.body["choices"][0];
      std::string text;
      std::vector<int32_t> ids;
      for (const json& chunk : chunks_of("/v1/completions", body)) {
        text += chunk["choices"][0]["text"].get<std::string>();
        for (const auto& id : chunk["choices"][0].value("token_ids", json::array()))
          ids.push_back(id.get<int32_t>());
      }
      EXPECT_EQ(ids, want["token_ids"].get<std::vector<int32_t>>()) << sampling.dump();
      EXPECT_EQ(text, want["text"].get<std::string>()) << sampling.dump() << " echo " << echo;
      ++compared;
    }
    json chat = {{"model", served_->name()},
                 {"messages", {{{"role", "user"}, {"content", "class Buffer:\n    def"}}}},
                 {"max_tokens", 24}};
    chat.update(sampling);
    const auto whole = post(port, "/v1/chat/completions", chat.dump());
    ASSERT_EQ(whole.status, 200) << whole.body.dump();
    std::string content;
    for (const json& chunk : chunks_of("/v1/chat/completions", chat))
      content += chunk["choices"][0]["delta"]["content"].get<std::string>();
    const std::string want = whole.body["choices"][0]["message"]["content"];
    EXPECT_EQ(content, want) << sampling.dump();
    // Not vacuous: the answer has several pieces, so joining them with spaces would differ.
    EXPECT_GT(whole.body["usage"]["completion_tokens"].get<int>(), 1);
    ++compared;
  }
  EXPECT_EQ(compared, 6);
}

// A chat renders as the start piece, then the messages' contents joined by a space (none before
// the first), encoded as text (server/chat_template.h): one message is <s> + its own tokens.
TEST_F(ServeSentencePiece, ChatRendersTheStartPieceAndTheContentAsText) {
  const auto r = post(served_->port(), "/v1/chat/completions",
                      json{{"model", served_->name()},
                           {"messages", {{{"role", "user"}, {"content", "def quantize(x"}}}},
                           {"max_tokens", 2},
                           {"temperature", 0}}
                          .dump());
  ASSERT_EQ(r.status, 200) << r.body.dump();
  const auto content = served_->local().tokenize("def quantize(x");
  // Without a space before it: "def" and " def" are other pieces in this vocabulary.
  ASSERT_NE(served_->local().tokenize(" def quantize(x"), content);
  EXPECT_EQ(r.body["usage"]["prompt_tokens"], content.size() + 1);
  auto rendered = [&](const json& messages) {
    const auto t = post(served_->port(), "/tokenize",
                        json{{"messages", messages}, {"add_special_tokens", false}}.dump());
    EXPECT_EQ(t.status, 200) << t.body.dump();
    return t.body["tokens"].get<std::vector<int32_t>>();
  };
  std::vector<int32_t> want = {1};
  want.insert(want.end(), content.begin(), content.end());
  EXPECT_EQ(rendered({{{"role", "user"}, {"content", "def quantize(x"}}}), want);
  // Two messages, and a content given as parts, are joined by single spaces.
  const auto joined = served_->local().tokenize("class Buffer: def put(self");
  want = {1};
  want.insert(want.end(), joined.begin(), joined.end());
  EXPECT_EQ(rendered({{{"role", "system"}, {"content", "class Buffer:"}},
                      {{"role", "user"},
                       {"content", json::array({{{"type", "text"}, {"text", "def"}},
                                                {{"type", "text"}, {"text", "put(self"}}})}}}),
            want);
}

// The audit's chat mode frames its probe message against this server's template: <s> before the
// content, nothing after it (it used to refuse: the template put a space before the content).
TEST_F(ServeSentencePiece, ChatAuditFramesTheProbeMessage) {
  HttpBackendOptions o;
  o.endpoint = served_->endpoint();
  o.model = served_->name();
  o.api = ApiKind::kChat;
  o.timeout_s = 10;
  auto http = HttpBackend::open(o);
  const ChatFrame& frame = http->frame_chat("Hello world");
  EXPECT_EQ(frame.prefix, std::vector<int32_t>({1}));
  EXPECT_TRUE(frame.suffix.empty());
}

}  // namespace
}  // namespace phasekv
