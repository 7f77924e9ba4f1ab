// The JSON of the generation routes' answers, shared by the whole responses and the streamed
// chunks (server_stream.cpp), so that the concatenated chunks of a stream carry exactly what
// the non-streamed answer carries: the same text pieces, the same logprob entries.
//
// Completions (vLLM's shape): text continues the prompt's text (completion_text); logprobs
// {tokens, token_logprobs, top_logprobs, text_offset}.
// Chat (OpenAI's shape): message content is the generated tokens' text; logprobs
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
// The tokenizer's text of ids, "" without a tokenizer.
std::string text_of(const std::vector<int32_t>& ids, const ModelLimits& limits);
// A completion's generated text: it continues the prompt's text, so a word tokenizer's words
// come after a space; sentencepiece pieces carry their own spaces.
std::string completion_text(const std::vector<int32_t>& generated, const ModelLimits& limits);

// The text a stream sends for each generated token, as vLLM's incremental detokenizer: the whole
// answer's text of the tokens so far, less what was sent. Decoding one token alone is wrong for
// sentencepiece (a piece's text depends on its neighbours: byte pieces form one character
// together), so the text is decoded from the start every time. A text that ends in U+FFFD (an
// incomplete UTF-8 character: byte pieces still to come) is held back until the character is
// complete or the stream ends. Concatenated, the pieces equal whole(all tokens), byte for byte:
// the decoders here only change the end of a text that ends in U+FFFD when tokens are appended.
class TextDeltas {
 public:
  using Whole = std::string (*)(const std::vector<int32_t>&, const ModelLimits&);
  TextDeltas(Whole whole, const ModelLimits& limits) : whole_(whole), limits_(limits) {}
  // The new text once `generated` has grown by a token; `last`: the stream ends with it.
  std::string next(const std::vector<int32_t>& generated, bool last);

 private:
  Whole whole_;
  const ModelLimits& limits_;
  size_t sent_ = 0;  // bytes of the whole text sent so far
};

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
// One choice of a whole /v1/chat/completions answer.
nlohmann::json chat_choice(const EngineResult& r, const ChatRequest& req,
                           const ModelLimits& limits);

}  // namespace phasekv
