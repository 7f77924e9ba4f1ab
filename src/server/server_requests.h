// Parsing and validation of the server's request bodies. Everything a client can get wrong is
// checked here, before the model runs, and reported as an ApiError that names the field and
// what is allowed; the HTTP layer turns it into {"error": {...}} with its status.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace phasekv {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string type, std::string param, const std::string& message)
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)) {}
  int status;
  std::string type;   // "invalid_request_error", "not_found_error", ...
  std::string param;  // the offending field, "" when none
};

// {"error": {"message", "type", "code", "param"}}
nlohmann::json error_body(int status, const std::string& type, const std::string& message,
                          const std::string& param = "");

// What every request is checked against.
struct ModelLimits {
  std::string name;  // the served model name: a request naming another model gets 404
  int64_t vocab_size = 0;
  int64_t max_context = 0;
  int max_tokens = 1024;
  int max_logprobs = 20;
  int max_prompts = 64;
  // (prompt tokens with echo + max_tokens) x (logprobs + 1), summed over a request's prompts.
  int64_t max_logprob_entries = int64_t{1} << 20;
  const Tokenizer* tokenizer = nullptr;  // nullptr: token-id prompts only
};

// What /v1/completions and /v1/chat/completions share: sampling, the token rendering and
// streaming (server-sent events).
struct SamplingRequest {
  int max_tokens = 16;
  double temperature = 1.0;
  double top_p = 1.0;
  int top_k = 0;
  std::optional<uint64_t> seed;
  bool tokens_as_ids = false;     // return_tokens_as_token_ids
  bool return_token_ids = false;  // token_ids / prompt_token_ids in each choice
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage: a last chunk with the usage
};

struct CompletionRequest : SamplingRequest {
  std::vector<std::vector<int32_t>> prompts;
  std::optional<int> logprobs;
  bool echo = false;
};

// /v1/chat/completions: the messages rendered by the chat template (server/chat_template.h).
struct ChatRequest : SamplingRequest {
  std::vector<int32_t> prompt;
  bool logprobs = false;
  int top_logprobs = 0;  // alternatives per generated token (with logprobs)
};

// Parses a JSON body (throws ApiError 400 on invalid JSON or a non-object).
nlohmann::json parse_body(const std::string& body);
// Unknown fields are ignored (see unknown_fields); known ones must have the right type. `stop`
// and `stop_token_ids` are refused unless empty: generation always runs to max_tokens.
CompletionRequest parse_completion(const nlohmann::json& body, const ModelLimits& limits);
// The same rules for chat: `messages` instead of `prompt`, max_completion_tokens as an alias of
// max_tokens (the newer OpenAI name), logprobs true/false with top_logprobs N.
ChatRequest parse_chat(const nlohmann::json& body, const ModelLimits& limits);

// {prompt} is text; {messages} is a chat rendered by the template (as vLLM's /tokenize, where
// add_special_tokens then defaults to false: the template writes its own <bos>).
struct TokenizeRequest {
  std::vector<int32_t> ids;
  bool return_token_strs = false;
};
TokenizeRequest parse_tokenize(const nlohmann::json& body, const ModelLimits& limits);
std::vector<int32_t> parse_detokenize(const nlohmann::json& body, const ModelLimits& limits);

// The fields of a body that `route` ("/v1/completions", "/v1/chat/completions", "/tokenize",
// "/detokenize") does not know, sorted. They are ignored, as vLLM ignores them (it logs "The
// following fields were present in the request but ignored"); the server names them in a
// `warnings` list of its answer and in an X-Phasekv-Warning header.
std::vector<std::string> unknown_fields(const nlohmann::json& body, const std::string& route);

// Text -> ids with the model's tokenizer (400 naming an unknown word; 400 when the model has no
// tokenizer). add_special prepends <bos> when the vocabulary has it, as vLLM does for text,
// unless the text's first token is <bos> already.
std::vector<int32_t> encode_text(const std::string& text, bool add_special,
                                 const ModelLimits& limits, const std::string& param);
// "token_id:N" when as_ids or without a tokenizer, else the word.
std::string token_text(int32_t id, bool as_ids, const ModelLimits& limits);

}  // namespace phasekv
