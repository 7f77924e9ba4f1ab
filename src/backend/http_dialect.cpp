#include "backend/http_dialect.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/http_json.h"
#include "util/error.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

using wire::at;
using wire::check_prompt_tokens;
using wire::excerpt;
using wire::index;
using wire::number;
using wire::token_id;
using wire::vllm_id_or_throw;
using wire::vllm_token_id;
using wire::vllm_top1;

ScoreResult parse_vllm(const json& response, const ScoreRequest& r) {
  check_prompt_tokens(response, r.context.size() + 1, "prompt_tokens", "vllm");
  const json& lp =
      at(index(at(response, "choices", "vllm"), 0, "vllm choices"), "logprobs", "vllm choice");
  const size_t pos = r.context.size();  // the target's index in the echoed prompt
  const json& tokens = at(lp, "tokens", "vllm logprobs");
  const json& tok = index(tokens, pos, "vllm logprobs.tokens");
  if (tok.is_string()) {
    auto id = vllm_token_id(tok.get<std::string>());
    if (id && *id != r.target)
      throw ProtocolError("vllm: echoed token at the target position is " + std::to_string(*id) +
                          ", sent " + std::to_string(r.target));
  }
  ScoreResult out;
  out.target_logprob =
      number(index(at(lp, "token_logprobs", "vllm logprobs"), pos, "vllm logprobs.token_logprobs"),
             "vllm: target logprob");
  std::tie(out.argmax, out.argmax_logprob) =
      vllm_top1(index(at(lp, "top_logprobs", "vllm logprobs"), pos, "vllm top_logprobs"));
  return out;
}

// SGLang logprob entries are [logprob, token_id, text-or-null].
std::pair<double, int32_t> sglang_entry(const json& e) {
  if (!e.is_array() || e.size() < 2)
    throw ProtocolError("sglang: logprob entry is not [logprob, id, text]: " + excerpt(e));
  const double lp =
      e[0].is_null() ? -std::numeric_limits<double>::infinity() : number(e[0], "sglang logprob");
  return {lp, token_id(e[1], "sglang token id")};
}

ScoreResult parse_sglang(const json& response, const ScoreRequest& r) {
  check_prompt_tokens(response, r.context.size(), "prompt_tokens", "sglang");
  const json& meta = at(response, "meta_info", "sglang");
  ScoreResult out;
  bool found = false;
  for (const auto& e : index(at(meta, "output_token_ids_logprobs", "sglang meta_info"), 0,
                             "sglang output_token_ids_logprobs")) {
    const auto [lp, id] = sglang_entry(e);
    if (id == r.target) {
      out.target_logprob = lp;
      found = true;
    }
  }
  if (!found)
    throw ProtocolError("sglang: output_token_ids_logprobs has no entry for target " +
                        std::to_string(r.target));
  const json& top = index(
      index(at(meta, "output_top_logprobs", "sglang meta_info"), 0, "sglang output_top_logprobs"),
      0, "sglang output_top_logprobs[0]");
  std::tie(out.argmax_logprob, out.argmax) = sglang_entry(top);
  return out;
}

ScoreResult parse_llamacpp(const json& response, const ScoreRequest& r) {
  check_prompt_tokens(response, r.context.size(), "tokens_evaluated", "llamacpp");
  if (!response.is_object() || !response.contains("completion_probabilities") ||
      !response["completion_probabilities"].is_array() ||
      response["completion_probabilities"].empty())
    throw ProtocolError(
        "llamacpp: the answer has no completion_probabilities although the target " +
        std::to_string(r.target) +
        " was forced with logit_bias (llama-server reports probabilities only once the "
        "generated text is valid UTF-8, so the target token is itself an incomplete UTF-8 "
        "sequence, e.g. a byte-fallback token); content " +
        excerpt(response.is_object() ? response.value("content", json(nullptr)) : response));
  const json& first = index(at(response, "completion_probabilities", "llamacpp"), 0,
                            "llamacpp completion_probabilities");
  if (first.is_object() && first.contains("probs") && !first.contains("top_logprobs"))
    throw ProtocolError(
        "llamacpp: completion_probabilities has the pre-December-2024 format (token strings, no "
        "ids); upgrade llama.cpp (build b4300 or later)");
  ScoreResult out;
  out.censored = true;
  out.target_logprob = std::numeric_limits<double>::quiet_NaN();
  bool have_top = false;
  for (const auto& e : at(first, "top_logprobs", "llamacpp completion_probabilities[0]")) {
    const int32_t id = token_id(at(e, "id", "llamacpp top_logprobs entry"), "llamacpp id");
    const double lp = number(at(e, "logprob", "llamacpp top_logprobs entry"), "llamacpp logprob");
    if (!have_top || lp > out.argmax_logprob || (lp == out.argmax_logprob && id < out.argmax)) {
      out.argmax = id;
      out.argmax_logprob = lp;
      have_top = true;
    }
    if (id == r.target) {
      out.target_logprob = lp;
      out.censored = false;
    }
  }
  if (!have_top) throw ProtocolError("llamacpp: top_logprobs is empty (is n_probs > 0?)");
  // The +1000 logit_bias must only steer sampling: were it in the reported probabilities, the
  // target would have logprob ~0 and every other token ~-1000, and every record would be right.
  if (out.argmax == r.target && out.argmax_logprob > -1e-3)
    for (const auto& e : first["top_logprobs"])
      if (e.is_object() && e.contains("logprob") && e["logprob"].is_number() &&
          e["logprob"].get<double>() < -kLlamacppTargetBias / 2)
        throw ProtocolError(
            "llamacpp: the reported probabilities include the logit_bias that forces the target "
            "(top-1 is the target at ~0, others below -500); this llama-server build computes "
            "n_probs after the bias, so its probabilities cannot score the audit");
  return out;
}

}  // namespace

std::string to_string(Dialect d) {
  switch (d) {
    case Dialect::kVllm:
      return "vllm";
    case Dialect::kSglang:
      return "sglang";
    case Dialect::kLlamacpp:
      return "llamacpp";
  }
  return "?";
}

Dialect dialect_from_string(const std::string& s) {
  if (s == "vllm") return Dialect::kVllm;
  if (s == "sglang") return Dialect::kSglang;
  if (s == "llamacpp" || s == "llama.cpp") return Dialect::kLlamacpp;
  throw Error("--dialect: '" + s + "' is not a dialect (allowed: auto, vllm, sglang, llamacpp)");
}

HttpCall score_call(Dialect d, const CallParams& p, const ScoreRequest& r) {
  switch (d) {
    case Dialect::kVllm: {
      std::vector<int32_t> prompt = r.context;
      prompt.push_back(r.target);
      json body = {{"model", p.model},
                   {"prompt", prompt},
                   {"max_tokens", 1},
                   {"temperature", 0.0},
                   {"echo", true},
                   {"logprobs", p.top_n},
                   {"return_tokens_as_token_ids", true}};
      if (!p.cache_salt.empty()) body["cache_salt"] = p.cache_salt;
      return {"/v1/completions", body};
    }
    case Dialect::kSglang:
      return {"/generate",
              {{"input_ids", r.context},
               {"sampling_params", {{"max_new_tokens", 1}, {"temperature", 0.0}}},
               {"return_logprob", true},
               {"logprob_start_len", -1},
               {"top_logprobs_num", 1},
               {"token_ids_logprob", {r.target}},
               {"return_text_in_logprobs", false}}};
    case Dialect::kLlamacpp:
      // logit_bias forces the target as the sampled token: llama-server omits
      // completion_probabilities when the sampled token is an incomplete UTF-8 sequence (any
      // byte-level tokenizer's greedy token can be), and n_probs are computed from the logits
      // before sampling, so the bias does not change them (parse_llamacpp checks that).
      return {"/completion",
              {{"prompt", r.context},
               {"n_predict", 1},
               {"n_probs", p.top_n},
               {"temperature", 0.0},
               {"logit_bias", json::array({json::array({r.target, kLlamacppTargetBias})})},
               {"cache_prompt", !p.disable_cache},
               {"stream", false}}};
  }
  throw Error("internal: unknown dialect");
}

ScoreResult parse_score(Dialect d, const json& response, const ScoreRequest& r) {
  switch (d) {
    case Dialect::kVllm:
      return parse_vllm(response, r);
    case Dialect::kSglang:
      return parse_sglang(response, r);
    case Dialect::kLlamacpp:
      return parse_llamacpp(response, r);
  }
  throw Error("internal: unknown dialect");
}

HttpCall generate_call(Dialect d, const CallParams& p, const std::vector<int32_t>& context,
                       int max_tokens) {
  switch (d) {
    case Dialect::kVllm: {
      // logprobs 0: the sampled token only, rendered as token_id:N (older vLLM has no
      // return_token_ids).
      json body = {{"model", p.model},
                   {"prompt", context},
                   {"max_tokens", max_tokens},
                   {"temperature", 0.0},
                   {"logprobs", 0},
                   {"return_token_ids", true},
                   {"return_tokens_as_token_ids", true}};
      if (!p.cache_salt.empty()) body["cache_salt"] = p.cache_salt;
      return {"/v1/completions", body};
    }
    case Dialect::kSglang:
      return {"/generate",
              {{"input_ids", context},
               {"sampling_params", {{"max_new_tokens", max_tokens}, {"temperature", 0.0}}},
               {"return_logprob", true},
               {"return_text_in_logprobs", false}}};
    case Dialect::kLlamacpp:
      return {"/completion",
              {{"prompt", context},
               {"n_predict", max_tokens},
               {"temperature", 0.0},
               {"n_probs", 1},
               {"return_tokens", true},
               {"cache_prompt", !p.disable_cache},
               {"stream", false}}};
  }
  throw Error("internal: unknown dialect");
}

Generated parse_generate(Dialect d, const json& response) {
  Generated g;
  if (d == Dialect::kVllm) {
    const json& choice = index(at(response, "choices", "vllm"), 0, "vllm choices");
    const json& lp = choice.contains("logprobs") ? choice["logprobs"] : json();
    if (choice.contains("token_ids") && choice["token_ids"].is_array()) {
      for (const auto& t : choice["token_ids"]) g.tokens.push_back(token_id(t, "vllm token_ids"));
    } else {
      for (const auto& t : at(lp, "tokens", "vllm logprobs")) {
        if (!t.is_string()) throw ProtocolError("vllm: logprobs.tokens entry is not a string");
        g.tokens.push_back(vllm_id_or_throw(t.get<std::string>()));
      }
    }
    if (lp.is_object() && lp.contains("token_logprobs") && lp["token_logprobs"].is_array() &&
        !lp["token_logprobs"].empty() && lp["token_logprobs"][0].is_number())
      g.first_logprob = lp["token_logprobs"][0].get<double>();
  } else if (d == Dialect::kSglang) {
    const json& entries =
        at(at(response, "meta_info", "sglang"), "output_token_logprobs", "sglang meta_info");
    for (const auto& e : entries) {
      const auto [lp, id] = sglang_entry(e);
      if (g.tokens.empty()) g.first_logprob = lp;
      g.tokens.push_back(id);
    }
  } else {
    const bool no_tokens = !response.contains("tokens") || !response["tokens"].is_array() ||
                           response["tokens"].empty();
    const bool no_probs = !response.contains("completion_probabilities") ||
                          !response["completion_probabilities"].is_array() ||
                          response["completion_probabilities"].empty();
    if (no_tokens && no_probs && response.contains("content") && response["content"].is_string() &&
        response["content"].get<std::string>().find("\xEF\xBF\xBD") != std::string::npos) {
      g.invalid_utf8 = true;  // U+FFFD and nothing else: the output ends inside a character
      return g;
    }
    if (response.contains("tokens") && response["tokens"].is_array() &&
        !response["tokens"].empty()) {
      for (const auto& t : response["tokens"]) g.tokens.push_back(token_id(t, "llamacpp tokens"));
    } else {
      for (const auto& e : at(response, "completion_probabilities", "llamacpp"))
        g.tokens.push_back(token_id(at(e, "id", "llamacpp completion_probabilities"), "id"));
    }
    const json& probs = response.contains("completion_probabilities")
                            ? response["completion_probabilities"]
                            : json();
    if (probs.is_array() && !probs.empty() && probs[0].is_object() &&
        probs[0].contains("logprob") && probs[0]["logprob"].is_number())
      g.first_logprob = probs[0]["logprob"].get<double>();
  }
  return g;
}

HttpCall tokenize_call(Dialect d, const std::string& model, const std::string& text,
                       bool add_special_tokens) {
  if (d == Dialect::kLlamacpp)
    return {"/tokenize", {{"content", text}, {"add_special", add_special_tokens}}};
  return {"/tokenize",
          {{"model", model}, {"prompt", text}, {"add_special_tokens", add_special_tokens}}};
}

std::vector<int32_t> parse_tokenize(const json& response) {
  std::vector<int32_t> ids;
  for (const auto& t : at(response, "tokens", "tokenize")) {
    // llama.cpp with_pieces returns {"id", "piece"} objects.
    ids.push_back(t.is_object() ? token_id(at(t, "id", "tokenize"), "tokenize id")
                                : token_id(t, "tokenize token"));
  }
  return ids;
}

HttpCall detokenize_call(Dialect d, const std::string& model, const std::vector<int32_t>& ids) {
  if (d == Dialect::kLlamacpp) return {"/detokenize", {{"tokens", ids}}};
  return {"/detokenize", {{"model", model}, {"tokens", ids}}};
}

std::string parse_detokenize(const json& response) {
  // vLLM answers {"prompt"}, SGLang {"text"}, llama.cpp {"content"}.
  for (const char* key : {"prompt", "text", "content"})
    if (response.is_object() && response.contains(key) && response[key].is_string())
      return response[key].get<std::string>();
  throw ProtocolError("detokenize: response has no 'prompt', 'text' or 'content' string: " +
                      excerpt(response));
}

std::vector<ModelCard> parse_models(const json& response) {
  std::vector<ModelCard> cards;
  for (const auto& m : at(response, "data", "/v1/models")) {
    ModelCard c;
    c.id = at(m, "id", "/v1/models entry").is_string() ? m["id"].get<std::string>() : "";
    if (m.contains("owned_by") && m["owned_by"].is_string())
      c.owned_by = m["owned_by"].get<std::string>();
    if (m.contains("max_model_len") && m["max_model_len"].is_number_integer())
      c.max_model_len = m["max_model_len"].get<int64_t>();
    if (m.contains("meta") && m["meta"].is_object() && m["meta"].contains("n_ctx") &&
        m["meta"]["n_ctx"].is_number_integer())
      c.meta_n_ctx = m["meta"]["n_ctx"].get<int64_t>();
    c.raw = m;
    cards.push_back(std::move(c));
  }
  return cards;
}

std::optional<Dialect> dialect_from_owner(const std::string& owned_by) {
  if (owned_by == "vllm" || owned_by == "phasekv") return Dialect::kVllm;
  if (owned_by == "sglang") return Dialect::kSglang;
  if (owned_by == "llamacpp" || owned_by == "llama.cpp") return Dialect::kLlamacpp;
  return std::nullopt;
}

std::optional<int64_t> llamacpp_context(const json& props) {
  if (!props.is_object()) return std::nullopt;
  if (props.contains("default_generation_settings") &&
      props["default_generation_settings"].is_object()) {
    const json& s = props["default_generation_settings"];
    if (s.contains("n_ctx") && s["n_ctx"].is_number_integer()) return s["n_ctx"].get<int64_t>();
  }
  if (props.contains("n_ctx") && props["n_ctx"].is_number_integer())
    return props["n_ctx"].get<int64_t>();
  return std::nullopt;
}

bool llamacpp_output_refused(int status, const std::string& body) {
  return status == 500 &&
         body.find("produced output that does not match the expected") != std::string::npos;
}

bool context_rejection(int status, const std::string& body) {
  if (status != 400) return false;
  for (const char* marker : {"exceed_context_size_error", "maximum context length",
                             "context length", "exceeds the available context size"})
    if (body.find(marker) != std::string::npos) return true;
  return false;
}

int64_t positions_needed(Dialect d, bool chat, bool echo_target, size_t context, int new_tokens) {
  const auto n =
      static_cast<int64_t>(context) + (echo_target && !chat ? 1 : 0) + std::max(new_tokens, 1);
  return d == Dialect::kSglang && !chat ? n + 1 : n;
}

std::string context_rule(Dialect d, bool chat) {
  if (chat) return "rendered prompt + generated tokens <= the context";
  switch (d) {
    case Dialect::kVllm:
      return "prompt (with the echoed target when scoring) + max_tokens <= max_model_len";
    case Dialect::kSglang:
      return "input + max_new_tokens < context_len (SGLang rejects equality)";
    case Dialect::kLlamacpp:
      return "prompt + n_predict <= n_ctx of a slot (llama-server rejects a prompt of n_ctx "
             "tokens)";
  }
  return "?";
}

Usage parse_usage(Dialect d, const json& r) {
  auto num = [](const json& o, const char* key) -> std::optional<int64_t> {
    if (o.is_object() && o.contains(key) && o[key].is_number_integer())
      return o[key].get<int64_t>();
    return std::nullopt;
  };
  // Prompt and completion counts from `o`, cached from `c`; absent when neither count is there.
  auto read = [&](const json& o, const char* prompt, const char* completion, const json& c,
                  const char* cached) {
    Usage u;
    const auto p = num(o, prompt), n = num(o, completion);
    if (!p && !n) return u;
    u.present = true;
    u.prompt = p.value_or(0);
    u.completion = n.value_or(0);
    u.cached = num(c, cached).value_or(0);
    return u;
  };
  if (!r.is_object()) return {};
  // /completion: the prompt tokens reused from the slot's cache are timings.cache_n;
  // tokens_cached is the size of the slot's cache after the request (every prompt token is in it
  // even with cache_prompt false, measured on llama-server v0.5.0 of node-llama-cpp 3.22.1).
  if (d == Dialect::kLlamacpp && !r.contains("usage"))
    return read(r, "tokens_evaluated", "tokens_predicted",
                r.contains("timings") ? r["timings"] : json(), "cache_n");
  if (d == Dialect::kSglang && r.contains("meta_info"))  // /generate
    return read(r["meta_info"], "prompt_tokens", "completion_tokens", r["meta_info"],
                "cached_tokens");
  if (!r.contains("usage")) return {};  // OpenAI shape
  const json& us = r["usage"];
  return read(
      us, "prompt_tokens", "completion_tokens",
      us.is_object() && us.contains("prompt_tokens_details") ? us["prompt_tokens_details"] : json(),
      "cached_tokens");
}

std::string prefix_cache_policy(Dialect d, bool defeat) {
  if (!defeat) return "left on (--keep-prefix-cache): shared prefixes may be served from cache";
  switch (d) {
    case Dialect::kVllm:
      return "salted per request (cache_salt)";
    case Dialect::kLlamacpp:
      return "disabled per request (cache_prompt: false)";
    case Dialect::kSglang:
      return "not controllable per request (SGLang radix cache); launch the server with "
             "--disable-radix-cache to rule it out";
  }
  return "?";
}

}  // namespace phasekv
