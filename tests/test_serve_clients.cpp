// What real clients send `phasekv serve` (issue 46, section 2), over its HTTP routes:
//  - bytes that are not UTF-8, in any string or key of any route, are a 400 naming the field
//    (they were a 500: nlohmann's parse error quoted the bytes, which could not be dumped);
//  - a text that starts with <bos> gets no second one;
//  - an empty text prompt and a user message without content are 400s;
//  - a stream's pieces are the whole text's increments (TextDeltas), also when byte pieces of a
//    sentencepiece vocabulary split a character (the served sentencepiece model's streams are
//    in test_serve_sentencepiece.cpp);
//  - a host that cannot be bound names --host and the real reason.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "served.h"
#include "server/response_shapes.h"
#include "util/error.h"
#include "util/utf8.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
using test::expect_error;
using test::post;
using test::Served;

class ServeClients : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { served_ = new Served({}, 64); }
  static void TearDownTestSuite() {
    delete served_;
    served_ = nullptr;
  }
  static Served* served_;
};
Served* ServeClients::served_ = nullptr;

const TaskVocab kVocab = task_vocab(test::small_kv_task());

// ---------------------------------------------------------------------------------------------
// Bytes that are not UTF-8.

TEST_F(ServeClients, InvalidUtf8IsA400NamingTheField) {
  const int port = served_->port();
  struct Case {
    const char* route;
    std::string body;
    const char* param;
    std::string names;
  };
  const std::vector<Case> cases = {
      {"/v1/completions", "{\"prompt\": \"k1 \xC3\", \"max_tokens\": 1}", "prompt",
       "prompt is not valid UTF-8 (byte 0xC3 at offset 15"},
      {"/v1/completions", "{\"prompt\": [\"k1\", \"v2 \xE2\x82\"], \"max_tokens\": 1}", "prompt",
       "prompt[1] is not valid UTF-8"},
      {"/v1/completions", "{\"prompt\": \"k1\", \"stop\": [\"v1\", \"\xFE\"]}", "stop",
       "stop[1] is not valid UTF-8"},
      {"/v1/chat/completions", "{\"messages\": [{\"role\": \"user\", \"content\": \"k1 \xFF\"}]}",
       "messages", "messages[0].content is not valid UTF-8"},
      {"/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": "
       "\"\xED\xA0\x80\"}]}]}",  // an encoded surrogate
       "messages", "messages[0].content[0].text is not valid UTF-8 (byte 0xED"},
      {"/v1/chat/completions",
       "{\"messages\": [{\"role\": \"user\", \"con\xC0\xAFtent\": \"k1\"}]}",  // overlong '/'
       "messages", "the key messages[0].con\xEF\xBF\xBD\xEF\xBF\xBDtent is not valid UTF-8"},
      {"/tokenize", "{\"prompt\": \"\xF5\x80\x80\x80\"}", "prompt", "prompt is not valid UTF-8"},
      {"/detokenize", "{\"tokens\": [1], \"model\": \"m\xF8\"}", "model",
       "model is not valid UTF-8"},
      // An unknown key: the key is named (its bad byte shown as U+FFFD) and is the param.
      {"/v1/completions", "{\"prompt\": \"k1\", \"x\xFF\": 1}", "x\xEF\xBF\xBD",
       "the key x\xEF\xBF\xBD is not valid UTF-8"},
      // The body already holds the first noncharacter used to mark bad bytes: the next is used.
      {"/v1/completions", "{\"prompt\": \"k1\", \"user\": \"\xEF\xB7\x90 \\ufdd1 \x80\"}", "user",
       "user is not valid UTF-8"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.route) + " " + json(c.names).dump());
    ASSERT_NE(first_invalid_utf8(c.body), std::string::npos);
    expect_error(post(port, c.route, c.body), 400, c.param, c.names);
  }
  // Bad bytes outside any string: the body is named, with the offset.
  const std::string outside = "{\"prompt\": \"k1\"}\xFF";
  expect_error(post(port, "/v1/completions", outside), 400, "",
               "the request body is not valid UTF-8 (byte 0xFF at offset 16");
  // Nested deeper than the search goes (it would overflow the stack): the body is named.
  const std::string deep =
      "{\"prompt\": " + std::string(100000, '[') + "\"\xFF\"" + std::string(100000, ']') + "}";
  expect_error(post(port, "/v1/completions", deep), 400, "",
               "the request body is not valid UTF-8 (byte 0xFF at offset 100012");
  // The same requests in UTF-8 are answered (only the bytes were wrong).
  EXPECT_EQ(post(port, "/tokenize", R"({"prompt": "k1"})").status, 200);
  EXPECT_EQ(
      post(port, "/v1/completions", R"({"prompt": "k1", "user": "é €", "max_tokens": 1})").status,
      200);
}

TEST(Utf8, FirstInvalidByteFollowsRfc3629) {
  EXPECT_EQ(first_invalid_utf8("plain ascii"), std::string::npos);
  EXPECT_EQ(first_invalid_utf8("é € 😀 \xEF\xBF\xBF \xF4\x8F\xBF\xBF"), std::string::npos);
  EXPECT_EQ(first_invalid_utf8("ab\x80"), 2u);              // a lone continuation byte
  EXPECT_EQ(first_invalid_utf8("a\xC3"), 1u);               // cut short
  EXPECT_EQ(first_invalid_utf8("\xC1\xBF"), 0u);            // overlong 2-byte
  EXPECT_EQ(first_invalid_utf8("x\xE0\x9F\xBF"), 1u);       // overlong 3-byte
  EXPECT_EQ(first_invalid_utf8("xy\xF0\x8F\xBF\xBF"), 2u);  // overlong 4-byte
  EXPECT_EQ(first_invalid_utf8("\xED\xBF\xBF"), 0u);        // a surrogate
  EXPECT_EQ(first_invalid_utf8("\xF4\x90\x80\x80"), 0u);    // over U+10FFFF
}

// ---------------------------------------------------------------------------------------------
// <bos>, empty prompts, content null.

TEST_F(ServeClients, TextThatStartsWithBosGetsNoSecondOne) {
  const int port = served_->port();
  const std::vector<int32_t> want = {TaskVocab::kBos, kVocab.key(1), kVocab.value(2)};
  for (const char* text : {"k1 v2", "<bos> k1 v2", "  <bos>  k1 v2"}) {
    const auto r = post(port, "/tokenize", json{{"prompt", text}}.dump());
    ASSERT_EQ(r.status, 200) << r.body.dump();
    EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(), want) << text;
    const auto c =
        post(port, "/v1/completions",
             json{{"prompt", text}, {"max_tokens", 1}, {"return_token_ids", true}}.dump());
    ASSERT_EQ(c.status, 200) << c.body.dump();
    EXPECT_EQ(c.body["choices"][0]["prompt_token_ids"].get<std::vector<int32_t>>(), want) << text;
  }
  // Without special tokens the text is taken as it is; a <bos> later in the text stays.
  const auto r = post(port, "/tokenize",
                      json{{"prompt", "<bos> k1 <bos>"}, {"add_special_tokens", false}}.dump());
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["tokens"].get<std::vector<int32_t>>(),
            std::vector<int32_t>({TaskVocab::kBos, kVocab.key(1), TaskVocab::kBos}));
}

TEST_F(ServeClients, EmptyPromptsAndMessagesWithoutTextAre400) {
  const int port = served_->port();
  expect_error(post(port, "/v1/completions", R"({"prompt": ""})"), 400, "prompt",
               "'prompt' is an empty string");
  expect_error(post(port, "/v1/completions", R"({"prompt": "  \n "})"), 400, "prompt",
               "'prompt' is only whitespace");
  expect_error(post(port, "/v1/completions", R"({"prompt": ["k1", ""]})"), 400, "prompt",
               "prompt[1] is an empty string");
  const char* chat = "/v1/chat/completions";
  expect_error(post(port, chat, R"({"messages": [{"role": "user", "content": null}]})"), 400,
               "messages", "messages[0].content is null");
  expect_error(
      post(port, chat, R"({"messages": [{"role": "system", "content": "k1"}, {"role": "user"}]})"),
      400, "messages", "messages[1].content is missing");
  // An assistant turn without text (one that called tools) is allowed, as in OpenAI's API.
  const auto ok = post(port, chat,
                       R"({"messages": [{"role": "user", "content": "k1 v2"},
                                        {"role": "assistant", "content": null},
                                        {"role": "user", "content": "<q> k1"}],
                           "max_tokens": 1})");
  EXPECT_EQ(ok.status, 200) << ok.body.dump();
  EXPECT_EQ(ok.body["usage"]["prompt_tokens"], 5);
}

// ---------------------------------------------------------------------------------------------
// Streamed text: TextDeltas over the bundled sentencepiece vocabulary, whose byte pieces split
// characters that have no piece of their own.

TEST(TextDeltas, PiecesConcatenateToTheWholeTextAndNeverSplitACharacter) {
  const auto tokenizer =
      load_tokenizer_if_present(std::string(PHASEKV_SOURCE_DIR) + "/models/code-chunked");
  ASSERT_TRUE(tokenizer);
  ASSERT_STREQ(tokenizer->kind(), "sentencepiece");
  ModelLimits limits;
  limits.tokenizer = &*tokenizer;
  const std::string text = " _sys.argv[0] = \"é€😀\"\n    return x ";
  const std::vector<int32_t> ids = tokenizer->encode(text);
  ASSERT_EQ(tokenizer->decode(ids), text);
  for (const auto whole : {&text_of, &completion_text}) {
    TextDeltas deltas(whole, limits);
    std::string streamed, one_by_one;
    int held = 0;
    for (size_t t = 0; t < ids.size(); ++t) {
      const std::vector<int32_t> so_far(ids.begin(), ids.begin() + static_cast<long>(t) + 1);
      const std::string piece = deltas.next(so_far, t + 1 == ids.size());
      EXPECT_EQ(first_invalid_utf8(piece), std::string::npos) << t;
      EXPECT_NOT_CONTAINS(piece, "\xEF\xBF\xBD") << t << ": a split character";
      held += piece.empty() ? 1 : 0;
      streamed += piece;
      one_by_one += tokenizer->decode({ids[t]});
    }
    EXPECT_EQ(streamed, text);
    // The byte pieces of € and 😀 were held back until their characters were whole; decoding
    // each token alone (what the stream did) shows them as U+FFFD.
    EXPECT_GE(held, 3);
    EXPECT_NE(one_by_one, text);
  }
}

TEST(TextDeltas, AnIncompleteCharacterAtTheEndIsSentWithTheLastToken) {
  const auto tokenizer =
      load_tokenizer_if_present(std::string(PHASEKV_SOURCE_DIR) + "/models/code-chunked");
  ASSERT_TRUE(tokenizer);
  ModelLimits limits;
  limits.tokenizer = &*tokenizer;
  std::vector<int32_t> ids = tokenizer->encode("x€");
  ids.pop_back();  // the last byte piece of €: the text ends inside the character
  TextDeltas deltas(text_of, limits);
  std::string streamed;
  for (size_t t = 0; t < ids.size(); ++t)
    streamed +=
        deltas.next(std::vector<int32_t>(ids.begin(), ids.begin() + static_cast<long>(t) + 1),
                    t + 1 == ids.size());
  EXPECT_EQ(streamed, tokenizer->decode(ids));
  EXPECT_CONTAINS(streamed, "\xEF\xBF\xBD");
}

// ---------------------------------------------------------------------------------------------
// --host that cannot be bound.

TEST_F(ServeClients, UnbindableHostNamesTheFlagAndTheReason) {
  auto bind_error = [&](const std::string& host) {
    ServerOptions o;
    o.host = host;
    o.port = 0;
    o.threads = 1;
    CompletionServer s(served_->local(), std::nullopt, std::nullopt, o);
    try {
      s.bind();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("bound");
  };
  // TEST-NET-1 (RFC 5737): a valid address that no machine here has.
  const std::string foreign = bind_error("192.0.2.1");
  EXPECT_CONTAINS(foreign, "--host '192.0.2.1' is not an address of this machine");
  const std::string unresolved = bind_error("no-such-host.invalid");
  EXPECT_CONTAINS(unresolved, "--host 'no-such-host.invalid' is not an address or a host name");
  for (const std::string& e : {foreign, unresolved}) EXPECT_NOT_CONTAINS(e, "Success");
}

}  // namespace
}  // namespace phasekv
