// Scoring through a chat endpoint (`phasekv audit --api chat`): the audit plans token-id
// contexts, but a chat request carries text messages that the server's chat template renders.
// For the phase to be exact in what the model sees, each context is sent as one user message
// whose rendering is checked token for token:
//   1. the template's own leading tokens are learned once, by rendering a user message with
//      empty content (POST /tokenize {messages}, as vLLM offers); a context must start with them;
//   2. the rest of the context is detokenized into the message's content;
//   3. POST /tokenize {messages} renders that message; it must equal the context exactly, or
//      the item fails with the first differing position (a template that adds tokens after the
//      content, or text that re-tokenizes differently, would move the key);
//   4. POST /v1/chat/completions {messages, max_tokens, temperature 0, logprobs, top_logprobs,
//      return_tokens_as_token_ids}; usage.prompt_tokens must equal the context's length.
// The target's logprob is known when it is among the top_logprobs (at most 20, OpenAI's limit);
// otherwise the record is censored, as with llama.cpp: wrong, with the logprob unknown.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/http_dialect.h"

namespace phasekv {

constexpr int kMaxChatTopLogprobs = 20;

// POST /tokenize with one user message (add_generation_prompt true, no extra special tokens).
HttpCall chat_render_call(const std::string& model, const std::string& content);
// POST /v1/chat/completions with one user message, greedy, logprobs on.
HttpCall chat_call(const CallParams& p, const std::string& content, int max_tokens);
// The first generated token's logprobs; `r.context` is the rendered prompt.
ScoreResult parse_chat_score(const nlohmann::json& response, const ScoreRequest& r);
// The generated tokens (from logprobs.content, rendered as token_id:N) and the first logprob.
Generated parse_chat_generate(const nlohmann::json& response, size_t prompt_tokens);
// "" when `rendered` equals `context`, else what differs (for the item's error).
std::string chat_render_mismatch(const std::vector<int32_t>& rendered,
                                 const std::vector<int32_t>& context);

}  // namespace phasekv
