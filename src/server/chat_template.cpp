#include "server/chat_template.h"

#include <set>
#include <string>

#include "server/request_fields.h"

namespace phasekv {

using json = nlohmann::json;
using fields::bad;
using fields::type_name;

const char* const kChatTemplate =
    "{{ bos_token }}{% for message in messages %}{% if not loop.first %} {% endif %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% else %}{% for part in message['content'] %}{% if not loop.first %} {% endif %}"
    "{{ part['text'] }}{% endfor %}{% endif %}"
    "{% endfor %}";

namespace {

// The text of one message: a string, or a list of {"type": "text", "text": ...} parts (what
// OpenAI clients send for multi-part content). Null or missing is empty for an assistant turn
// (one that called tools has no text), an error for the others, which exist for their text.
std::string content_text(const json& m, const std::string& role, const std::string& where) {
  const auto it = m.find("content");
  if (it == m.end() || it->is_null()) {
    if (role == "assistant") return "";
    bad("messages", where + ".content is " + (it == m.end() ? "missing" : "null") + ": a " + role +
                        " message needs its text (a string or a list of text parts)");
  }
  if (it->is_string()) return it->get<std::string>();
  if (!it->is_array())
    bad("messages",
        where + ".content must be a string or a list of text parts, not " + type_name(*it));
  std::string text;
  for (size_t j = 0; j < it->size(); ++j) {
    const json& part = (*it)[j];
    const std::string at = where + ".content[" + std::to_string(j) + "]";
    if (!part.is_object() || part.value("type", json()) != "text" || !part.contains("text") ||
        !part["text"].is_string())
      bad("messages", at +
                          " must be {\"type\": \"text\", \"text\": \"...\"} (this model reads "
                          "text only), not " +
                          part.dump());
    if (j > 0) text += " ";
    text += part["text"].get<std::string>();
  }
  return text;
}

}  // namespace

std::vector<int32_t> render_chat(const json& body, const ModelLimits& limits, bool add_special) {
  const json* messages = fields::field(body, "messages");
  if (!messages || !messages->is_array() || messages->empty())
    bad("messages", "'messages' must be a non-empty list of {role, content}" +
                        (messages ? ", not " + (messages->is_array() ? std::string("an empty list")
                                                                     : type_name(*messages))
                                  : std::string()));
  if (!limits.tokenizer)
    bad("messages", "this model has no tokenizer.json, so chat messages cannot be rendered");
  static const std::set<std::string> roles = {"system", "developer", "user", "assistant"};
  std::string text;
  for (size_t i = 0; i < messages->size(); ++i) {
    const json& m = (*messages)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) bad("messages", where + " must be an object {role, content}");
    const json role = m.value("role", json());
    if (!role.is_string() || !roles.count(role.get<std::string>()))
      bad("messages",
          where + ".role is " + role.dump() + " (allowed: system, developer, user, assistant)");
    // A space between messages, none before the first: a sentencepiece vocabulary (no dummy
    // prefix) encodes " def" and "def" differently, and a one-message chat must render as
    // <s> + the content's own tokens, as a text prompt of that content does.
    if (i > 0) text += " ";
    text += content_text(m, role.get<std::string>(), where);
  }
  // One tokenizer for the whole text, so an unknown word is reported as the prompt's; the
  // message names the word. The template's <bos> is the tokenizer's start id (a word
  // tokenizer's "<bos>", a sentencepiece's "<s>"); add_special puts a second one before it.
  auto ids = encode_text(text, false, limits, "messages");
  if (const auto bos = limits.tokenizer->bos_id())
    ids.insert(ids.begin(), add_special ? 2 : 1, *bos);
  return ids;
}

}  // namespace phasekv
