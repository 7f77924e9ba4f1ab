#include "backend/http_chat.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <limits>

#include "backend/http_json.h"
#include "util/error.h"

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

// A logprobs entry's token id: llama.cpp's "id", else vLLM's "token_id:N" token string.
int32_t chat_token(const json& entry) {
  if (entry.is_object() && entry.contains("id")) return wire::token_id(entry["id"], "chat id");
  const json& t = wire::at(entry, "token", "chat logprobs entry");
  if (!t.is_string()) throw ProtocolError("chat: token is not a string: " + wire::excerpt(t));
  const auto id = wire::vllm_token_id(t.get<std::string>());
  if (!id)
    throw ProtocolError(
        "chat: the logprobs name tokens by text only ('" + t.get<std::string>().substr(0, 20) +
        "'), not by id (vLLM: return_tokens_as_token_ids; llama.cpp: id), so the target cannot "
        "be matched; audit this server with --mode generate");
  return *id;
}

// The server's count of the prompt must be the rendering's: with --chat-template the file can
// differ from the template the server applies.
void check_rendered_length(const json& response, size_t rendered) {
  try {
    wire::check_prompt_tokens(response, rendered, "prompt_tokens", "chat");
  } catch (const ProtocolError& e) {
    throw ProtocolError(std::string(e.what()) +
                        "; the server's chat template renders the message into other tokens "
                        "than the checked rendering (a --chat-template file that differs from "
                        "the server's own template?)");
  }
}

std::string string_field(const json& o, const char* key) {
  return o.is_object() && o.contains(key) && o[key].is_string() ? o[key].get<std::string>() : "";
}

}  // namespace

std::string to_string(ChatRenderSource s) {
  switch (s) {
    case ChatRenderSource::kServerTokenize:
      return "the server's template, rendered through POST /tokenize {messages}";
    case ChatRenderSource::kApplyTemplate:
      return "the server's template, rendered through POST /apply-template and tokenized by "
             "POST /tokenize";
    case ChatRenderSource::kTemplateFile:
      return "--chat-template FILE (not the server's own template: each answer's prompt_tokens "
             "is checked against the file's rendering)";
  }
  return "?";
}

std::string check_reasoning(const std::string& r) {
  for (const char* ok : {"", "on", "off", "low", "medium", "high"})
    if (r == ok) return r;
  throw Error("--reasoning: '" + r + "' (allowed: on, off, low, medium, high)");
}

json reasoning_fields(const std::string& reasoning) {
  json f = json::object();
  if (reasoning == "on" || reasoning == "off") {
    const bool on = reasoning == "on";
    f["chat_template_kwargs"] = {{"enable_thinking", on}, {"thinking", on}};
  } else if (!reasoning.empty()) {
    f["reasoning_effort"] = reasoning;
  }
  return f;
}

HttpCall chat_render_call(ChatRenderSource source, const std::string& model,
                          const std::string& content, const std::string& reasoning) {
  json body = reasoning_fields(reasoning);
  body.erase("reasoning_effort");  // a sampling option, not the template's
  body["messages"] = user_message(content);
  if (source == ChatRenderSource::kApplyTemplate) return {"/apply-template", body};
  if (source != ChatRenderSource::kServerTokenize)
    throw Error("internal: a template file is rendered locally");
  body["model"] = model;
  body["add_generation_prompt"] = true;
  body["add_special_tokens"] = false;  // the template writes its own BOS
  return {"/tokenize", body};
}

std::string parse_applied_template(const json& response) {
  const json& p = wire::at(response, "prompt", "/apply-template");
  if (!p.is_string())
    throw ProtocolError("/apply-template: prompt is not a string: " + wire::excerpt(p));
  return p.get<std::string>();
}

std::string fill_template_file(const std::string& text, const std::string& path,
                               const std::string& content) {
  static const std::string kSlot = "{{content}}";
  const size_t at = text.find(kSlot);
  if (at == std::string::npos || text.find(kSlot, at + 1) != std::string::npos)
    throw Error("--chat-template " + path +
                ": the file must hold the rendered prompt of one user message with {{content}} "
                "exactly once where the message goes");
  return text.substr(0, at) + content + text.substr(at + kSlot.size());
}

HttpCall chat_call(const CallParams& p, const std::string& content, const ChatCallOptions& o) {
  json body = reasoning_fields(o.reasoning);
  body["model"] = p.model;
  body["messages"] = user_message(content);
  body["max_tokens"] = o.max_tokens;
  body["temperature"] = 0.0;
  if (o.logprobs) {
    body["logprobs"] = true;
    body["top_logprobs"] = std::min(p.top_n, kMaxChatTopLogprobs);
    body["return_tokens_as_token_ids"] = true;
  }
  if (o.disable_cache) body["cache_prompt"] = false;
  if (!p.cache_salt.empty()) body["cache_salt"] = p.cache_salt;
  return {"/v1/chat/completions", body};
}

ScoreResult parse_chat_score(const json& response, const ScoreRequest& r) {
  check_rendered_length(response, r.context.size());
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
  check_rendered_length(response, prompt_tokens);
  const json& choice = wire::index(wire::at(response, "choices", "chat"), 0, "chat choices");
  Generated g;
  if (choice.contains("logprobs") && choice["logprobs"].is_object()) {
    for (const json& e : content_logprobs(response)) {
      if (g.tokens.empty())
        g.first_logprob = wire::number(wire::at(e, "logprob", "chat logprobs entry"), "logprob");
      g.tokens.push_back(chat_token(e));
    }
  }
  const json& message = wire::at(choice, "message", "chat choice");
  std::string field = string_field(message, "reasoning");
  if (field.empty()) field = string_field(message, "reasoning_content");
  const ChatAnswer a = split_reasoning(string_field(message, "content"), field);
  g.text = a.answer;
  g.reasoning = a.reasoning;
  g.answer_missing = !a.reasoning_closed;
  g.finish_reason = string_field(choice, "finish_reason");
  return g;
}

ChatAnswer split_reasoning(const std::string& content, const std::string& reasoning_field) {
  ChatAnswer a;
  if (!reasoning_field.empty()) {
    a.reasoning = reasoning_field;
    a.answer = content;
    return a;
  }
  static const std::string kOpen = "<think>", kClose = "</think>";
  const size_t start = content.find_first_not_of(" \t\r\n");
  const size_t close = content.find(kClose);
  if (close != std::string::npos) {  // templates that open <think> in the prompt send no opener
    const size_t open =
        content.compare(start == std::string::npos ? 0 : start, kOpen.size(), kOpen) == 0
            ? start + kOpen.size()
            : 0;
    a.reasoning = content.substr(open, close - open);
    a.answer = content.substr(close + kClose.size());
  } else if (start != std::string::npos && content.compare(start, kOpen.size(), kOpen) == 0) {
    a.reasoning = content.substr(start + kOpen.size());
    a.reasoning_closed = false;
  } else {
    a.answer = content;
  }
  return a;
}

std::string first_number(const std::string& answer) {
  auto digit = [](char c) { return std::isdigit(static_cast<unsigned char>(c)) != 0; };
  const auto begin = std::find_if(answer.begin(), answer.end(), digit);
  return std::string(begin, std::find_if_not(begin, answer.end(), digit));
}

ChatFrame frame_from_probe(const std::vector<int32_t>& rendered,
                           const std::vector<int32_t>& content_ids) {
  const auto first =
      std::search(rendered.begin(), rendered.end(), content_ids.begin(), content_ids.end());
  if (content_ids.empty() || first == rendered.end() ||
      std::search(first + 1, rendered.end(), content_ids.begin(), content_ids.end()) !=
          rendered.end())
    throw ProtocolError(
        "the chat template's rendering of a probe message does not contain the message's own "
        "tokens exactly once (" +
        std::to_string(rendered.size()) + " rendered tokens, " +
        std::to_string(content_ids.size()) +
        " content tokens), so the tokens it adds around a message cannot be told apart");
  ChatFrame f;
  f.prefix.assign(rendered.begin(), first);
  f.suffix.assign(first + static_cast<std::ptrdiff_t>(content_ids.size()), rendered.end());
  return f;
}

std::string chat_render_mismatch(const std::vector<int32_t>& rendered,
                                 const std::vector<int32_t>& context) {
  if (rendered == context) return "";
  const auto diff = std::mismatch(rendered.begin(), rendered.end(), context.begin(), context.end());
  const auto pos = static_cast<size_t>(diff.first - rendered.begin());
  return "the chat template renders the message as " + std::to_string(rendered.size()) +
         " tokens, the planned prompt has " + std::to_string(context.size()) +
         "; first difference at position " + std::to_string(pos) +
         " (the template changes the content, or the text re-tokenizes differently at the "
         "template's edges, so the key's phase would not be the planned one)";
}

}  // namespace phasekv
