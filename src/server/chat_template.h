// The chat template of phasekv models. Their vocabularies are the task's words (<bos>, <q>, k12,
// v7, f3 ...) and they were trained on bare task sequences, `<bos> body <q> key value ...`, with
// no role or turn tokens. A chat is therefore rendered as exactly that sequence:
//
//   <bos>, then the words of every message's content in order (whitespace-separated, each one a
//   vocabulary word; a content given as parts is its text parts joined by a space).
//
// Roles (system, developer, user, assistant) add no tokens, and neither does the generation
// prompt: the assistant's answer continues the sequence, so a user message that ends in the
// task's query `<q> k12` is answered with the value, as in training. The same rendering in
// Jinja (published in GET /v1/models under phasekv.chat_template) is kChatTemplate; it writes
// text that the word tokenizer turns into these ids. A model with a sentencepiece tokenizer is
// rendered the same way: its start id "<s>", then the messages' contents joined by a space (none
// before the first), encoded as text, so one message renders as <s> + the tokens of its content.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

#include "server/server_requests.h"

namespace phasekv {

extern const char* const kChatTemplate;

// Parses body["messages"] and renders them. Throws ApiError 400 (param "messages", the message
// naming messages[i].role or .content) on a missing or empty list, an unknown role, content
// that is not text (null or missing only for an assistant), or a word outside the vocabulary;
// also without a tokenizer. add_special
// prepends a second <bos>, as a tokenizer's special tokens would on top of the template's.
std::vector<int32_t> render_chat(const nlohmann::json& body, const ModelLimits& limits,
                                 bool add_special);

}  // namespace phasekv
