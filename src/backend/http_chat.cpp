#include "backend/http_chat.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "backend/http_json.h"

namespace phasekv {

using json = nlohmann::json;
using namespace std::string_literals;

namespace {

json user_message(const std::string& content) {
  return json::array({{{"role", "user"}, {"content", content}}});
}

// logprobs.content of the first choice.
const json& content_logprobs(const json& response) {
  const json& choice = wire::index(wire::at(response, "choices", "chat"), 0, "chat choices");
  const json& lp = wire::at(choice, "logprobs", "chat choice");
  if (!lp.is_object())
    throw ProtocolError("chat: the choice has no logprobs (the server ignored logprobs: true): " +
                        wire::excerpt(choice));
  return wire::at(lp, "content", "chat logprobs");
}

int32_t chat_token(const json& entry) {
  const json& t = wire::at(entry, "token", "chat logprobs entry");
  if (!t.is_string()) throw ProtocolError("chat: token is not a string: " + wire::excerpt(t));
  return wire::vllm_id_or_throw(t.get<std::string>());
}

}  // namespace

HttpCall chat_render_call(const std::string& model, const std::string& content) {
  return {"/tokenize",
          {{"model", model},
           {"messages", user_message(content)},
           {"add_generation_prompt", true},
           {"add_special_tokens", false}}};
}

HttpCall chat_call(const CallParams& p, const std::string& content, int max_tokens) {
  json body = {{"model", p.model},
               {"messages", user_message(content)},
               {"max_tokens", max_tokens},
               {"temperature", 0.0},
               {"logprobs", true},
               {"top_logprobs", std::min(p.top_n, kMaxChatTopLogprobs)},
               {"return_tokens_as_token_ids", true}};
  if (!p.cache_salt.empty()) body["cache_salt"] = p.cache_salt;
  return {"/v1/chat/completions", body};
}

ScoreResult parse_chat_score(const json& response, const ScoreRequest& r) {
  wire::check_prompt_tokens(response, r.context.size(), "prompt_tokens", "chat");
  const json& first = wire::index(content_logprobs(response), 0, "chat logprobs.content");
  ScoreResult out;
  out.censored = true;
  out.target_logprob = std::numeric_limits<double>::quiet_NaN();
  // The chosen token (greedy: the argmax) and its alternatives, best first.
  std::vector<std::pair<int32_t, double>> seen = {
      {chat_token(first), wire::number(wire::at(first, "logprob", "chat"), "chat logprob")}};
  for (const json& alt : wire::at(first, "top_logprobs", "chat logprobs entry"))
    seen.emplace_back(chat_token(alt),
                      wire::number(wire::at(alt, "logprob", "chat top_logprobs"), "logprob"));
  out.argmax = -1;
  for (const auto& [id, lp] : seen) {
    if (out.argmax < 0 || lp > out.argmax_logprob || (lp == out.argmax_logprob && id < out.argmax))
      std::tie(out.argmax, out.argmax_logprob) = std::pair{id, lp};
    if (id == r.target) {
      out.target_logprob = lp;
      out.censored = false;
    }
  }
  return out;
}

Generated parse_chat_generate(const json& response, size_t prompt_tokens) {
  wire::check_prompt_tokens(response, prompt_tokens, "prompt_tokens", "chat");
  Generated g;
  for (const json& e : content_logprobs(response)) {
    if (g.tokens.empty())
      g.first_logprob = wire::number(wire::at(e, "logprob", "chat logprobs entry"), "logprob");
    g.tokens.push_back(chat_token(e));
  }
  return g;
}

std::string chat_render_mismatch(const std::vector<int32_t>& rendered,
                                 const std::vector<int32_t>& context) {
  if (rendered == context) return "";
  const auto diff = std::mismatch(rendered.begin(), rendered.end(), context.begin(), context.end());
  const auto pos = static_cast<size_t>(diff.first - rendered.begin());
  return "the chat template renders the message as " + std::to_string(rendered.size()) +
         " tokens, the planned prompt has " + std::to_string(context.size()) +
         "; first difference at position " + std::to_string(pos) +
         " (the template adds tokens after the content, or the text re-tokenizes differently, "
         "so the key's phase would not be the planned one)";
}

}  // namespace phasekv
