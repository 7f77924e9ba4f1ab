// The request and response shapes of each server dialect, as pure JSON functions (no sockets),
// so every shape is unit-tested on canned responses.
//
// Scoring asks for the log-probability of a target token after a context given as token ids:
//   vllm     POST /v1/completions {prompt: ctx + [target], echo, logprobs N, max_tokens 1,
//            return_tokens_as_token_ids, cache_salt}: the echoed prompt logprob of the last prompt
//            token is log p(target | ctx), and that position's top-N gives the argmax. Exact.
//   sglang   POST /generate {input_ids: ctx, max_new_tokens 1, return_logprob, top_logprobs_num 1,
//            token_ids_logprob [target]}: the first output position carries both. Exact.
//   llamacpp POST /completion {prompt: ctx, n_predict 1, n_probs N, logit_bias [[target, 1000]],
//            cache_prompt false}: only the top-N of the first output position (computed before
//            sampling, so the bias that makes the target the sampled token leaves them alone),
//            so a target outside it is censored (its logprob is unknown, the prediction is still
//            known to be wrong).
// A response whose shape does not match throws ProtocolError; the caller records it as that
// request's error instead of retrying (a version mismatch does not heal by waiting).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace phasekv {

enum class Dialect { kVllm, kSglang, kLlamacpp };

std::string to_string(Dialect d);  // "vllm" | "sglang" | "llamacpp"
// "vllm" | "sglang" | "llamacpp" (not "auto": detection needs the server); throws phasekv::Error.
Dialect dialect_from_string(const std::string& s);

class ProtocolError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct HttpCall {
  std::string route;  // "/v1/completions", relative to the endpoint's base path
  nlohmann::json body;
};

struct CallParams {
  std::string model;
  int top_n = 20;             // logprobs / n_probs
  std::string cache_salt;     // vllm: sent as cache_salt when non-empty
  bool disable_cache = true;  // llamacpp: cache_prompt false
};

HttpCall score_call(Dialect d, const CallParams& p, const ScoreRequest& r);
ScoreResult parse_score(Dialect d, const nlohmann::json& response, const ScoreRequest& r);

// Greedy (temperature 0) generation of up to max_tokens tokens after `context`.
HttpCall generate_call(Dialect d, const CallParams& p, const std::vector<int32_t>& context,
                       int max_tokens);
struct Generated {
  std::vector<int32_t> tokens;
  std::optional<double> first_logprob;  // log p of the first generated token, when returned
  // llama.cpp answered {"content":"\ufffd","tokens":[]} with no probabilities: the greedy
  // output is an incomplete UTF-8 sequence, its tokens are not reported.
  bool invalid_utf8 = false;
  // Chat answers (http_chat.h parse_chat_generate): the message text after any reasoning, the
  // reasoning, whether the answer never came (reasoning cut off by the budget), finish_reason.
  std::optional<std::string> text;
  std::string reasoning;
  bool answer_missing = false;
  std::string finish_reason;
};
Generated parse_generate(Dialect d, const nlohmann::json& response);

HttpCall tokenize_call(Dialect d, const std::string& model, const std::string& text,
                       bool add_special_tokens);
std::vector<int32_t> parse_tokenize(const nlohmann::json& response);
HttpCall detokenize_call(Dialect d, const std::string& model, const std::vector<int32_t>& ids);
std::string parse_detokenize(const nlohmann::json& response);

// One entry of GET /v1/models.
struct ModelCard {
  std::string id;
  std::string owned_by;
  std::optional<int64_t> max_model_len;
  std::optional<int64_t> meta_n_ctx;  // llama.cpp builds that publish meta.n_ctx
  nlohmann::json raw;                 // the whole entry (phasekv servers add a "phasekv" object)
};
std::vector<ModelCard> parse_models(const nlohmann::json& response);
// The dialect an owned_by value names ("vllm", "sglang", "llamacpp"; phasekv servers speak
// vllm), or nullopt.
std::optional<Dialect> dialect_from_owner(const std::string& owned_by);
// llama.cpp GET /props: the context size of a slot, when present.
std::optional<int64_t> llamacpp_context(const nlohmann::json& props);

// The bias llama.cpp scoring puts on the target (score_call).
constexpr double kLlamacppTargetBias = 1000.0;

// llama-server answers HTTP 500 "The model produced output that does not match the expected
// Content-only format" when greedy output ends inside a UTF-8 character: the same request always
// gets it again, so it is not retried (a scored outcome in generate mode, http_client.h).
bool llamacpp_output_refused(int status, const std::string& body);

// A 400 that says the prompt does not fit the context: llama.cpp's exceed_context_size_error,
// vLLM's "maximum context length", SGLang's "longer than the model's context length".
bool context_rejection(int status, const std::string& body);

// Context positions one request occupies by the dialect's own rule, for a context of `context`
// tokens and `new_tokens` generated: vLLM scores with the target echoed (context + 1 +
// max_tokens <= max_model_len), SGLang rejects input + max_new_tokens == context_len, llama.cpp
// rejects a prompt of n_ctx tokens (context + n_predict <= n_ctx). It fits when the result is at
// most the server's context size. `chat`: the rendered prompt plus the generated tokens.
int64_t positions_needed(Dialect d, bool chat, bool echo_target, size_t context, int new_tokens);
// That rule in words, for messages and audit.json.
std::string context_rule(Dialect d, bool chat);

// Token accounting of one answer: OpenAI `usage` {prompt_tokens, completion_tokens,
// prompt_tokens_details.cached_tokens} (vLLM, llama.cpp /v1, chat), SGLang /generate meta_info
// {prompt_tokens, completion_tokens, cached_tokens}, llama.cpp /completion {tokens_evaluated,
// tokens_predicted, timings.cache_n}. present false when the answer carries none.
struct Usage {
  bool present = false;
  int64_t prompt = 0, completion = 0, cached = 0;
};
Usage parse_usage(Dialect d, const nlohmann::json& response);

// How each dialect keeps a shared-prefix cache from faking a period (docs/AUDIT.md).
std::string prefix_cache_policy(Dialect d, bool defeat);

}  // namespace phasekv
