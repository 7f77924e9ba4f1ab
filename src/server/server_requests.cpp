#include "server/server_requests.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <optional>

#include "server/chat_template.h"
#include "server/request_fields.h"
#include "util/error.h"
#include "util/utf8.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

using fields::bad;
using fields::field;
using fields::get_bool;
using fields::get_int;
using fields::get_number;
using fields::type_name;

std::vector<int32_t> id_prompt(const json& arr, const ModelLimits& limits, const std::string& where,
                               const std::string& param = "prompt") {
  std::vector<int32_t> ids;
  for (size_t i = 0; i < arr.size(); ++i) {
    const json& t = arr[i];
    if (!t.is_number_integer())
      bad(param, where + "[" + std::to_string(i) + "] must be a token id (an integer), not " +
                     type_name(t));
    const auto id = t.get<int64_t>();
    if (id < 0 || id >= limits.vocab_size)
      bad(param, where + "[" + std::to_string(i) + "]: token id " + std::to_string(id) +
                     " is outside the vocabulary [0, " + std::to_string(limits.vocab_size) + ")");
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// The start token in front of a text's ids, as vLLM adds it, unless the text starts with it
// already ("<bos> k1 v2" keeps its one <bos>).
void prepend_bos(std::vector<int32_t>& ids, const Tokenizer& tokenizer) {
  const auto bos = tokenizer.bos_id();
  if (bos && (ids.empty() || ids.front() != *bos)) ids.insert(ids.begin(), *bos);
}

// A text prompt: its own tokens must not be empty (the <bos> added in front does not count).
std::vector<int32_t> text_prompt(const json& text, bool add_special, const ModelLimits& limits,
                                 const std::string& where) {
  const auto& s = text.get_ref<const std::string&>();
  auto ids = encode_text(s, false, limits, "prompt");
  if (ids.empty())
    bad("prompt", where + " is " + (s.empty() ? "an empty string" : "only whitespace") +
                      ": a prompt needs at least one token");
  if (add_special) prepend_bos(ids, *limits.tokenizer);
  return ids;
}

// prompt: "text" | [ids] | ["text", ...] | [[ids], ...]
std::vector<std::vector<int32_t>> parse_prompts(const json& body, const ModelLimits& limits,
                                                bool add_special) {
  const json* p = field(body, "prompt");
  if (!p)
    bad("prompt", "'prompt' is required (a string, a list of token ids, or a list of either)");
  std::vector<std::vector<int32_t>> out;
  if (p->is_string()) {
    out.push_back(text_prompt(*p, add_special, limits, "'prompt'"));
  } else if (p->is_array() && !p->empty() && p->front().is_number()) {
    out.push_back(id_prompt(*p, limits, "prompt"));
  } else if (p->is_array() && !p->empty()) {
    if (static_cast<int>(p->size()) > limits.max_prompts)
      bad("prompt", std::to_string(p->size()) + " prompts in one request (allowed: at most " +
                        std::to_string(limits.max_prompts) + ")");
    for (size_t i = 0; i < p->size(); ++i) {
      const json& q = (*p)[i];
      const std::string where = "prompt[" + std::to_string(i) + "]";
      if (q.is_string())
        out.push_back(text_prompt(q, add_special, limits, where));
      else if (q.is_array())
        out.push_back(id_prompt(q, limits, where));
      else
        bad("prompt", where + " must be a string or a list of token ids, not " + type_name(q));
    }
  } else {
    bad("prompt",
        "'prompt' must be a non-empty string, a non-empty list of token ids, or a list "
        "of either, not " +
            (p->is_array() ? std::string("an empty list") : type_name(*p)));
  }
  for (size_t i = 0; i < out.size(); ++i)
    if (out[i].empty()) bad("prompt", "prompt " + std::to_string(i) + " has no tokens");
  return out;
}

void check_lengths(const std::vector<std::vector<int32_t>>& prompts, int max_tokens,
                   const ModelLimits& limits, const std::string& param) {
  for (const auto& p : prompts) {
    const auto n = static_cast<int64_t>(p.size());
    if (n > limits.max_context)
      bad(param, "This model's maximum context length is " + std::to_string(limits.max_context) +
                     " tokens; the prompt has " + std::to_string(n) + " tokens");
    if (n + max_tokens > limits.max_context)
      bad("max_tokens", "This model's maximum context length is " +
                            std::to_string(limits.max_context) + " tokens; the request asks for " +
                            std::to_string(n + max_tokens) + " (" + std::to_string(n) +
                            " in the prompt, " + std::to_string(max_tokens) +
                            " in the completion)");
  }
}

// The answer of a request with logprobs holds this many entries; a cap keeps one request from
// holding gigabytes (64 prompts of 4096 tokens x 21 entries are 5.5 million JSON objects).
void check_logprob_entries(int64_t entries, const std::string& param, const std::string& how,
                           const ModelLimits& limits) {
  if (entries > limits.max_logprob_entries)
    bad(param, "the request asks for " + std::to_string(entries) + " log-probability entries (" +
                   how + "); the server allows at most " +
                   std::to_string(limits.max_logprob_entries) +
                   " per request (--max-logprob-entries): send fewer prompts per request or a "
                   "smaller '" +
                   param + "'");
}

void check_model(const json& body, const ModelLimits& limits) {
  const json* m = field(body, "model");
  if (!m) return;
  if (!m->is_string()) bad("model", "'model' must be a string, not " + type_name(*m));
  if (m->get<std::string>() != limits.name)
    throw ApiError(
        404, "not_found_error", "model",
        "The model '" + m->get<std::string>() + "' does not exist (served: '" + limits.name + "')");
}

// Where `mark` sits in `v`: the path of a string that holds it ("messages[0].content",
// "stop[1]") or of a key (`key` true; the mark shown as U+FFFD). Objects iterate in key order.
// No deeper than kMaxMarkDepth: an 8 MB body of '[' would otherwise overflow the stack.
struct MarkAt {
  std::string path, param;  // param: the top-level field
  bool key = false;
};
constexpr int kMaxMarkDepth = 64;
std::optional<MarkAt> find_mark(const json& v, const std::string& mark, const std::string& path,
                                const std::string& param, int depth = 0) {
  if (depth > kMaxMarkDepth) return std::nullopt;
  if (v.is_string()) {
    if (v.get_ref<const std::string&>().find(mark) == std::string::npos) return std::nullopt;
    return MarkAt{path, param, false};
  }
  if (v.is_array()) {
    for (size_t i = 0; i < v.size(); ++i)
      if (auto at = find_mark(v[i], mark, path + "[" + std::to_string(i) + "]", param, depth + 1))
        return at;
  } else if (v.is_object()) {
    for (auto it = v.begin(); it != v.end(); ++it) {
      std::string key = it.key();
      const bool bad_key = key.find(mark) != std::string::npos;
      for (size_t p; (p = key.find(mark)) != std::string::npos;)
        key.replace(p, mark.size(), "\xEF\xBF\xBD");
      const std::string at_path = path.empty() ? key : path + "." + key;
      const std::string at_param = path.empty() ? key : param;
      if (bad_key) return MarkAt{at_path, at_param, true};
      if (auto at = find_mark(it.value(), mark, at_path, at_param, depth + 1)) return at;
    }
  }
  return std::nullopt;
}

// A body with bytes that are not UTF-8 at `at`. Each such byte is replaced by a noncharacter the
// body does not contain (U+FDD0..U+FDEF, neither as bytes nor as a \u escape) and the result
// parsed, so that the error can name the string or key that held the byte.
[[noreturn]] void refuse_invalid_utf8(const std::string& body, size_t at) {
  const std::string where = "byte 0x" +
                            fmt::format("{:02X}", static_cast<unsigned char>(body[at])) +
                            " at offset " + std::to_string(at) + " of the body";
  std::string lowered = body;
  for (char& c : lowered) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (unsigned cp = 0xFDD0; cp <= 0xFDEF; ++cp) {
    const std::string mark = {'\xEF', static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                              static_cast<char>(0x80 | (cp & 0x3F))};
    if (body.find(mark) != std::string::npos ||
        lowered.find(fmt::format("{:x}", cp)) != std::string::npos)
      continue;
    std::string marked;
    for (size_t i = 0; i < body.size();) {
      const size_t n = utf8_char_len(body, i);
      marked += n == 0 ? mark : body.substr(i, n);
      i += n == 0 ? 1 : n;
    }
    const json j = json::parse(marked, nullptr, false);
    if (j.is_discarded()) break;
    const auto found = find_mark(j, mark, "", "");
    if (!found) break;
    // The top-level field is the param, as in every other error; the message names the place.
    bad(found->param, (found->key ? "the key " : "") + found->path + " is not valid UTF-8 (" +
                          where + "); the strings and keys of a request must be UTF-8");
  }
  bad("", "the request body is not valid UTF-8 (" + where + ")");
}

}  // namespace

json error_body(int status, const std::string& type, const std::string& message,
                const std::string& param) {
  return {{"error",
           {{"message", message},
            {"type", type},
            {"code", status},
            {"param", param.empty() ? json(nullptr) : json(param)}}}};
}

json parse_body(const std::string& body) {
  // nlohmann's parser refuses invalid UTF-8 with a message that quotes the bad bytes (which
  // then cannot be sent as JSON): find the field first and name it.
  if (const size_t at = first_invalid_utf8(body); at != std::string::npos)
    refuse_invalid_utf8(body, at);
  json j;
  try {
    j = json::parse(body);
  } catch (const json::exception& e) {
    bad("", std::string("the request body is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) bad("", "the request body must be a JSON object, not " + type_name(j));
  return j;
}

std::vector<int32_t> encode_text(const std::string& text, bool add_special,
                                 const ModelLimits& limits, const std::string& param) {
  if (!limits.tokenizer)
    bad(param, "this model has no tokenizer.json, so text cannot be tokenized; send token ids");
  std::vector<int32_t> ids;
  try {
    ids = limits.tokenizer->encode(text);
  } catch (const Error& e) {
    bad(param, e.what());
  }
  if (add_special) prepend_bos(ids, *limits.tokenizer);
  return ids;
}

std::string token_text(int32_t id, bool as_ids, const ModelLimits& limits) {
  if (as_ids || !limits.tokenizer || id >= limits.tokenizer->size())
    return "token_id:" + std::to_string(id);
  return limits.tokenizer->token_text(id);
}

namespace {

// The fields both generation routes share. max_tokens may be 0 here; the caller decides
// whether that is allowed (completions with echo only).
// Generation has no end-of-sequence token and no stop condition: it always produces max_tokens
// tokens. A stop asked for would be silently ignored, so it is refused (empty ones are fine).
void refuse_stop(const json& body) {
  if (const json* s = field(body, "stop")) {
    if (!s->is_string() && !s->is_array())
      bad("stop", "'stop' must be a string or a list of strings, not " + type_name(*s));
    if (!s->empty() && !(s->is_string() && s->get<std::string>().empty()))
      bad("stop",
          "'stop' is not supported: this server always generates exactly max_tokens tokens; "
          "leave 'stop' out (or send null or []) and cut the text yourself");
  }
  if (const json* s = field(body, "stop_token_ids")) {
    if (!s->is_array())
      bad("stop_token_ids", "'stop_token_ids' must be a list of token ids, not " + type_name(*s));
    if (!s->empty())
      bad("stop_token_ids",
          "'stop_token_ids' is not supported: this server always generates exactly max_tokens "
          "tokens; leave it out (or send [])");
  }
}

SamplingRequest parse_sampling(const json& body, const ModelLimits& limits,
                               const char* max_tokens_key) {
  check_model(body, limits);
  refuse_stop(body);
  get_int(body, "n", 1, 1, 1, "; one completion per prompt");
  get_int(body, "best_of", 1, 1, 1, "; one completion per prompt");
  if (const json* salt = field(body, "cache_salt"); salt && !salt->is_string())
    bad("cache_salt", "'cache_salt' must be a string, not " + type_name(*salt));
  SamplingRequest r;
  r.max_tokens = static_cast<int>(
      get_int(body, max_tokens_key, 16, 0, limits.max_tokens, "; the server's --max-tokens-limit"));
  r.temperature = get_number(body, "temperature", 1.0, 0.0, 100.0);
  r.top_p = get_number(body, "top_p", 1.0, 1e-9, 1.0);
  r.top_k = static_cast<int>(get_int(body, "top_k", 0, -1, 1 << 30));
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) bad("seed", "'seed' must be an integer, not " + type_name(*s));
    r.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  r.tokens_as_ids = get_bool(body, "return_tokens_as_token_ids", false);
  r.return_token_ids = get_bool(body, "return_token_ids", false);
  r.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    // As vLLM: options of a stream that was not asked for are a mistake, not a no-op.
    if (!r.stream) bad("stream_options", "'stream_options' is only allowed with 'stream': true");
    if (!so->is_object())
      bad("stream_options", "'stream_options' must be an object, not " + type_name(*so));
    if (const json* u = field(*so, "include_usage"); u && !u->is_boolean())
      bad("stream_options",
          "'stream_options.include_usage' must be true or false, not " + type_name(*u));
    r.include_usage = so->value("include_usage", false);
  }
  return r;
}

}  // namespace

CompletionRequest parse_completion(const json& body, const ModelLimits& limits) {
  CompletionRequest r;
  static_cast<SamplingRequest&>(r) = parse_sampling(body, limits, "max_tokens");
  r.echo = get_bool(body, "echo", false);
  if (r.max_tokens == 0 && !r.echo)
    bad("max_tokens",
        "'max_tokens' is 0 without echo: the response would be empty (use echo "
        "true to score the prompt, or max_tokens >= 1)");
  if (field(body, "logprobs"))
    r.logprobs = static_cast<int>(get_int(body, "logprobs", 0, 0, limits.max_logprobs));
  r.prompts = parse_prompts(body, limits, get_bool(body, "add_special_tokens", true));
  check_lengths(r.prompts, r.max_tokens, limits, "prompt");
  if (r.logprobs) {
    int64_t positions = 0;
    for (const auto& p : r.prompts)
      positions += (r.echo ? static_cast<int64_t>(p.size()) : 0) + r.max_tokens;
    check_logprob_entries(positions * (*r.logprobs + 1), "logprobs",
                          std::to_string(positions) + " positions" +
                              (r.echo ? " (echoed prompts and completions)" : "") + " x (" +
                              std::to_string(*r.logprobs) + " + 1)",
                          limits);
  }
  return r;
}

ChatRequest parse_chat(const json& body, const ModelLimits& limits) {
  ChatRequest r;
  const bool new_name = field(body, "max_completion_tokens") != nullptr;
  static_cast<SamplingRequest&>(r) =
      parse_sampling(body, limits, new_name ? "max_completion_tokens" : "max_tokens");
  if (r.max_tokens == 0)
    bad(new_name ? "max_completion_tokens" : "max_tokens",
        "a chat completion needs at least one token (allowed: 1.." +
            std::to_string(limits.max_tokens) + ")");
  if (field(body, "chat_template"))
    bad("chat_template",
        "this server renders chats with its own template only (GET /v1/models "
        "phasekv.chat_template); leave 'chat_template' out");
  if (get_bool(body, "echo", false))
    bad("echo", "'echo' is not supported for chat completions (use /v1/completions)");
  get_bool(body, "add_generation_prompt", true);  // type-checked; the template adds no tokens
  get_bool(body, "continue_final_message", false);
  r.logprobs = get_bool(body, "logprobs", false);
  r.top_logprobs = static_cast<int>(get_int(body, "top_logprobs", 0, 0, limits.max_logprobs));
  if (r.top_logprobs > 0 && !r.logprobs)
    bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
  r.prompt = render_chat(body, limits, get_bool(body, "add_special_tokens", false));
  check_lengths({r.prompt}, r.max_tokens, limits, "messages");
  if (r.logprobs)
    check_logprob_entries(
        int64_t{r.max_tokens} * (r.top_logprobs + 1), "top_logprobs",
        std::to_string(r.max_tokens) + " tokens x (" + std::to_string(r.top_logprobs) + " + 1)",
        limits);
  return r;
}

TokenizeRequest parse_tokenize(const json& body, const ModelLimits& limits) {
  check_model(body, limits);
  TokenizeRequest r;
  r.return_token_strs = get_bool(body, "return_token_strs", false);
  if (field(body, "messages")) {
    if (field(body, "prompt")) bad("messages", "send either 'prompt' or 'messages', not both");
    get_bool(body, "add_generation_prompt", true);  // type-checked; the template adds no tokens
    get_bool(body, "continue_final_message", false);
    r.ids = render_chat(body, limits, get_bool(body, "add_special_tokens", false));
    return r;
  }
  const json* p = field(body, "prompt");
  if (!p || !p->is_string())
    bad("prompt", "'prompt' must be a string (or send chat 'messages')" +
                      (p ? ", not " + type_name(*p) : std::string()));
  r.ids = encode_text(p->get<std::string>(), get_bool(body, "add_special_tokens", true), limits,
                      "prompt");
  return r;
}

std::vector<std::string> unknown_fields(const json& body, const std::string& route) {
  static const std::vector<std::string> sampling = {"model",
                                                    "max_tokens",
                                                    "temperature",
                                                    "top_p",
                                                    "top_k",
                                                    "seed",
                                                    "n",
                                                    "best_of",
                                                    "cache_salt",
                                                    "return_tokens_as_token_ids",
                                                    "return_token_ids",
                                                    "stream",
                                                    "stream_options",
                                                    "stop",
                                                    "stop_token_ids",
                                                    "add_special_tokens",
                                                    "echo",
                                                    "logprobs",
                                                    "user"};
  std::vector<std::string> known;
  if (route == "/v1/completions") {
    known = sampling;
    known.push_back("prompt");
  } else if (route == "/v1/chat/completions") {
    known = sampling;
    known.insert(known.end(), {"messages", "max_completion_tokens", "top_logprobs", "chat_template",
                               "add_generation_prompt", "continue_final_message"});
  } else if (route == "/tokenize") {
    known = {"model",
             "prompt",
             "messages",
             "add_special_tokens",
             "return_token_strs",
             "add_generation_prompt",
             "continue_final_message"};
  } else if (route == "/detokenize") {
    known = {"model", "tokens"};
  }
  std::vector<std::string> out;
  for (auto it = body.begin(); it != body.end(); ++it)
    if (std::find(known.begin(), known.end(), it.key()) == known.end()) out.push_back(it.key());
  return out;  // nlohmann's objects iterate in key order
}

std::vector<int32_t> parse_detokenize(const json& body, const ModelLimits& limits) {
  check_model(body, limits);
  const json* t = field(body, "tokens");
  if (!t || !t->is_array())
    bad("tokens",
        "'tokens' must be a list of token ids" + (t ? ", not " + type_name(*t) : std::string()));
  if (!limits.tokenizer)
    bad("tokens", "this model has no tokenizer.json, so ids cannot be detokenized");
  return id_prompt(*t, limits, "tokens", "tokens");
}

}  // namespace phasekv
