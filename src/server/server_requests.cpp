#include "server/server_requests.h"

#include <algorithm>
#include <cmath>

#include "server/chat_template.h"
#include "server/request_fields.h"
#include "util/error.h"

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

// prompt: "text" | [ids] | ["text", ...] | [[ids], ...]
std::vector<std::vector<int32_t>> parse_prompts(const json& body, const ModelLimits& limits,
                                                bool add_special) {
  const json* p = field(body, "prompt");
  if (!p)
    bad("prompt", "'prompt' is required (a string, a list of token ids, or a list of either)");
  std::vector<std::vector<int32_t>> out;
  if (p->is_string()) {
    out.push_back(encode_text(p->get<std::string>(), add_special, limits, "prompt"));
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
        out.push_back(encode_text(q.get<std::string>(), add_special, limits, "prompt"));
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
  const auto bos = limits.tokenizer->bos_id();
  if (add_special && bos) ids.insert(ids.begin(), *bos);
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
