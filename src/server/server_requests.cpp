#include "server/server_requests.h"

#include <algorithm>
#include <cmath>

#include "util/error.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

[[noreturn]] void bad(const std::string& param, const std::string& message) {
  throw ApiError(400, "invalid_request_error", param, message);
}

std::string type_name(const json& v) {
  if (v.is_number_integer()) return "an integer";
  if (v.is_number()) return "a number";
  return std::string("a ") + v.type_name();
}

// The field's value when present and not null.
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  return it == body.end() || it->is_null() ? nullptr : &*it;
}

bool get_bool(const json& body, const char* key, bool fallback) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_boolean())
    bad(key, std::string("'") + key + "' must be true or false, not " + type_name(*v));
  return v->get<bool>();
}

int64_t get_int(const json& body, const char* key, int64_t fallback, int64_t lo, int64_t hi,
                const std::string& hint = "") {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number_integer())
    bad(key, std::string("'") + key + "' must be an integer, not " + type_name(*v));
  const auto x = v->get<int64_t>();
  if (x < lo || x > hi)
    bad(key, std::string("'") + key + "' is " + std::to_string(x) +
                 " (allowed: " + std::to_string(lo) + ".." + std::to_string(hi) + hint + ")");
  return x;
}

double get_number(const json& body, const char* key, double fallback, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return fallback;
  if (!v->is_number())
    bad(key, std::string("'") + key + "' must be a number, not " + type_name(*v));
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi)
    bad(key, std::string("'") + key + "' is " + v->dump() + " (allowed: " + json(lo).dump() + ".." +
                 json(hi).dump() + ")");
  return x;
}

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

void check_lengths(const CompletionRequest& r, const ModelLimits& limits) {
  for (const auto& p : r.prompts) {
    const auto n = static_cast<int64_t>(p.size());
    if (n > limits.max_context)
      bad("prompt", "This model's maximum context length is " + std::to_string(limits.max_context) +
                        " tokens; the prompt has " + std::to_string(n) + " tokens");
    if (n + r.max_tokens > limits.max_context)
      bad("max_tokens", "This model's maximum context length is " +
                            std::to_string(limits.max_context) + " tokens; the request asks for " +
                            std::to_string(n + r.max_tokens) + " (" + std::to_string(n) +
                            " in the prompt, " + std::to_string(r.max_tokens) +
                            " in the completion)");
  }
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
  } catch (const json::parse_error& e) {
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
  const auto& words = limits.tokenizer->tokens();
  auto bos = std::find(words.begin(), words.end(), "<bos>");
  if (add_special && bos != words.end())
    ids.insert(ids.begin(), static_cast<int32_t>(bos - words.begin()));
  return ids;
}

std::string token_text(int32_t id, bool as_ids, const ModelLimits& limits) {
  if (as_ids || !limits.tokenizer || id >= limits.tokenizer->size())
    return "token_id:" + std::to_string(id);
  return limits.tokenizer->tokens()[static_cast<size_t>(id)];
}

CompletionRequest parse_completion(const json& body, const ModelLimits& limits) {
  check_model(body, limits);
  if (get_bool(body, "stream", false))
    bad("stream", "streaming is not supported (send stream: false)");
  get_int(body, "n", 1, 1, 1, "; one completion per prompt");
  get_int(body, "best_of", 1, 1, 1, "; one completion per prompt");
  if (const json* salt = field(body, "cache_salt"); salt && !salt->is_string())
    bad("cache_salt", "'cache_salt' must be a string, not " + type_name(*salt));
  CompletionRequest r;
  r.echo = get_bool(body, "echo", false);
  r.max_tokens = static_cast<int>(
      get_int(body, "max_tokens", 16, 0, limits.max_tokens, "; the server's --max-tokens-limit"));
  if (r.max_tokens == 0 && !r.echo)
    bad("max_tokens",
        "'max_tokens' is 0 without echo: the response would be empty (use echo "
        "true to score the prompt, or max_tokens >= 1)");
  r.temperature = get_number(body, "temperature", 1.0, 0.0, 100.0);
  r.top_p = get_number(body, "top_p", 1.0, 1e-9, 1.0);
  r.top_k = static_cast<int>(get_int(body, "top_k", 0, -1, 1 << 30));
  if (const json* s = field(body, "seed")) {
    if (!s->is_number_integer()) bad("seed", "'seed' must be an integer, not " + type_name(*s));
    r.seed =
        s->is_number_unsigned() ? s->get<uint64_t>() : static_cast<uint64_t>(s->get<int64_t>());
  }
  if (field(body, "logprobs"))
    r.logprobs = static_cast<int>(get_int(body, "logprobs", 0, 0, limits.max_logprobs));
  r.tokens_as_ids = get_bool(body, "return_tokens_as_token_ids", false);
  r.return_token_ids = get_bool(body, "return_token_ids", false);
  r.prompts = parse_prompts(body, limits, get_bool(body, "add_special_tokens", true));
  check_lengths(r, limits);
  return r;
}

TokenizeRequest parse_tokenize(const json& body, const ModelLimits& limits) {
  check_model(body, limits);
  if (field(body, "messages"))
    bad("messages",
        "chat messages are not supported (the model has no chat template); send "
        "'prompt'");
  const json* p = field(body, "prompt");
  if (!p || !p->is_string())
    bad("prompt", "'prompt' must be a string" + (p ? ", not " + type_name(*p) : std::string()));
  TokenizeRequest r;
  r.prompt = p->get<std::string>();
  r.add_special_tokens = get_bool(body, "add_special_tokens", true);
  r.return_token_strs = get_bool(body, "return_token_strs", false);
  return r;
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
