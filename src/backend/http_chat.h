// Scoring through a chat endpoint (`phasekv audit --api chat`): the audit plans token-id
// prompts, but a chat request carries text messages that the server's chat template renders.
// For the phase to be exact in what the model sees, each prompt is planned as the TEMPLATED
// token ids, prefix + content + suffix, and every request's rendering is checked token for token:
//   1. the template's frame is learned once: its tokens before and after a probe message's
//      content (ChatFrame; the task's ids rendering uses an empty message, whose rendering is
//      the whole prefix);
//   2. a prompt's content ids (between the frame's prefix and suffix) are detokenized into the
//      message text;
//   3. that message is rendered (ChatRenderSource) and must equal the planned prompt exactly,
//      or the item fails with the first differing position (a template that trims the content,
//      or text that re-tokenizes differently at the frame's edges, would move the key);
//   4. POST /v1/chat/completions {messages, max_tokens, temperature 0, logprobs, ...};
//      usage.prompt_tokens must equal the rendered length (the server's own template may differ
//      from a --chat-template file; the count catches it).
// Rendering: vLLM and SGLang tokenize messages through POST /tokenize {messages,
// add_generation_prompt, chat_template_kwargs}; llama.cpp renders them as text through POST
// /apply-template {messages} -> {prompt}, tokenized by /tokenize {content, add_special: true}
// (its chat route adds the BOS the rendering leaves out); else `--chat-template FILE`, the
// rendered text of one user message with {{content}} where the message goes, tokenized by the
// server as it stands (BOS included as text when the model wants one).
// Reasoning (`--reasoning on|off|EFFORT`) travels to the template and the sampler:
// chat_template_kwargs {enable_thinking, thinking} (Qwen3, DeepSeek-V3.1, Granite read one of
// them) for on/off, reasoning_effort for low/medium/high; the same kwargs render the /tokenize
// check, since a template renders thinking-off prompts differently.
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

enum class ChatRenderSource {
  kServerTokenize,  // POST /tokenize {messages} (vLLM, SGLang, phasekv serve)
  kApplyTemplate,   // POST /apply-template, then /tokenize the text (llama.cpp)
  kTemplateFile,    // --chat-template FILE, then /tokenize the text
};
std::string to_string(ChatRenderSource s);

// "" (the server's default), "on", "off", or an effort: "low", "medium", "high"; throws
// phasekv::Error naming --reasoning otherwise.
std::string check_reasoning(const std::string& reasoning);
// The request fields `reasoning` adds to a chat or render body (an empty object for "").
nlohmann::json reasoning_fields(const std::string& reasoning);

// The render request of one user message with `content` (kServerTokenize: ids come back;
// kApplyTemplate: text comes back, see render_text_of).
HttpCall chat_render_call(ChatRenderSource source, const std::string& model,
                          const std::string& content, const std::string& reasoning);
// llama.cpp /apply-template's {prompt}.
std::string parse_applied_template(const nlohmann::json& response);
// A --chat-template file's text with the message in place of its one {{content}}; throws
// phasekv::Error naming `path` when the file has no or several placeholders.
std::string fill_template_file(const std::string& text, const std::string& path,
                               const std::string& content);

struct ChatCallOptions {
  int max_tokens = 1;
  bool logprobs = true;       // with top_logprobs min(top_n, 20) and token ids
  std::string reasoning;      // check_reasoning()
  bool disable_cache = true;  // cache_prompt false (llama.cpp; other servers ignore it)
};
// POST /v1/chat/completions with one user message, greedy.
HttpCall chat_call(const CallParams& p, const std::string& content, const ChatCallOptions& o);
// The first generated token's logprobs; `r.context` is the rendered prompt. Tokens are named
// by id: vLLM's "token_id:N" (return_tokens_as_token_ids) or llama.cpp's "id" field.
ScoreResult parse_chat_score(const nlohmann::json& response, const ScoreRequest& r);
// The answer: tokens (from logprobs.content, when returned), the message text with the
// reasoning split off (split_reasoning), finish_reason and usage's reasoning tokens.
Generated parse_chat_generate(const nlohmann::json& response, size_t prompt_tokens);

// A chat answer's reasoning and final text: the message's reasoning field (vLLM `reasoning`,
// older vLLM and SGLang `reasoning_content`) when a server's parser filled it, else a
// <think>...</think> block at the start of the content (no parser); content that opens <think>
// and never closes it is all reasoning (the budget ran out before the answer).
struct ChatAnswer {
  std::string reasoning;
  std::string answer;
  bool reasoning_closed = true;  // false: the answer never came
};
ChatAnswer split_reasoning(const std::string& content, const std::string& reasoning_field);
// The value an answer gives: its first run of ASCII digits ("" when none), so "7314",
// "The value is 7314." and "**7314**" all read 7314.
std::string first_number(const std::string& answer);

// The template's frame: the tokens it puts before and after a message's content.
struct ChatFrame {
  std::vector<int32_t> prefix, suffix;
};
// Splits `rendered` around `content_ids`; throws ProtocolError when the content's ids do not
// appear in the rendering exactly once as a whole (a template that changes the content).
ChatFrame frame_from_probe(const std::vector<int32_t>& rendered,
                           const std::vector<int32_t>& content_ids);
// "" when `rendered` equals `context`, else what differs (for the item's error).
std::string chat_render_mismatch(const std::vector<int32_t>& rendered,
                                 const std::vector<int32_t>& context);

}  // namespace phasekv
