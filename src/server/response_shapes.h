// The JSON of the generation routes' answers, shared by the whole responses and the streamed
// chunks (server_stream.cpp), so that the concatenated chunks of a stream carry exactly what
// the non-streamed answer carries: the same text pieces, the same logprob entries.
//
// Completions (vLLM's shape): text continues the prompt's words, so every generated word comes
// with the space before it; logprobs {tokens, token_logprobs, top_logprobs, text_offset}.
// Chat (OpenAI's shape): message content is the generated words joined by spaces; logprobs
// {content: [{token, logprob, bytes, top_logprobs: [{token, logprob, bytes}]}]}.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "server/server_engine.h"
#include "server/server_requests.h"

namespace phasekv {

// "cmpl-..." / "chatcmpl-...": unique within the process, unpredictable across restarts.
std::string response_id(const std::string& prefix);
nlohmann::json usage_json(int64_t prompt_tokens, int64_t completion_tokens);
// Sampling parameters of prompt `index` of a request: each prompt gets its own seeded stream
// (seed + index), so a batch equals separate requests.
EngineParams engine_params(const SamplingRequest& r, int top_n, bool prompt_logprobs, size_t index);
// Word-level text of ids, "" without a tokenizer.
std::string text_of(const std::vector<int32_t>& ids, const ModelLimits& limits);

// The completions "logprobs" object, one token at a time; build(from) returns the entries from
// index `from` on (a stream sends each token's slice; offsets keep counting across slices).
class LogprobsBuilder {
 public:
  LogprobsBuilder(const ModelLimits& limits, bool as_ids) : limits_(limits), as_ids_(as_ids) {}
  void add(int32_t id, const TokenLogprobs* lp);
  nlohmann::json build(size_t from = 0) const;
  size_t size() const { return tokens_.size(); }

 private:
  const ModelLimits& limits_;
  bool as_ids_;
  std::vector<nlohmann::json> tokens_, token_logprobs_, top_, offsets_;
  size_t offset_ = 0;
};

// One choice of a whole /v1/completions answer.
nlohmann::json completion_choice(size_t index, const std::vector<int32_t>& prompt,
                                 const EngineResult& r, const CompletionRequest& req,
                                 const ModelLimits& limits);

// One entry of chat logprobs.content: the token, its logprob and the top_n best alternatives
// (exactly top_n, best first, as OpenAI's top_logprobs).
nlohmann::json chat_logprob(int32_t id, const TokenLogprobs& lp, int top_n, bool as_ids,
                            const ModelLimits& limits);
// The text a chat stream sends for generated token `step`: the word, after a space unless first.
std::string chat_piece(int32_t id, size_t step, const ModelLimits& limits);
// One choice of a whole /v1/chat/completions answer.
nlohmann::json chat_choice(const EngineResult& r, const ChatRequest& req,
                           const ModelLimits& limits);

}  // namespace phasekv
