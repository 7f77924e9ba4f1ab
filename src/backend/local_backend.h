// The in-process backend: a Decoder (from a model directory) behind the Backend interface, so a
// sweep runs the same code against a local model and a served one.
//
// Scoring never pads: with chunked compression a token's phase is its absolute position, so left
// padding would move every phase, and right padding would rely on every layer being exactly
// causal (compressed entries pooling pad tokens is a known bug class, which a phase measurement
// must not depend on). Requests are instead grouped by length (all requests of one sweep modulus
// have the same length) and each group runs as batched forwards.
#pragma once
#include <functional>
#include <optional>
#include <string>

#include "backend/backend.h"
#include "io/tokenizer.h"
#include "model/decoder.h"

namespace phasekv {

class LocalBackend : public Backend {
 public:
  // name: what model_id() starts with (the model directory's name). threads <= 0: all cores
  // (sets libtorch's global thread count). batch_size: most sequences in one forward.
  LocalBackend(Decoder model, std::optional<Tokenizer> tokenizer, std::string name,
               int threads = 0, int batch_size = 16);
  // Loads DIR (config.json, model.safetensors, tokenizer.json when present).
  static LocalBackend from_dir(const std::string& dir, int threads = 0, int batch_size = 16);

  std::string model_id() const override;  // "<name>@<config hash>"
  // Need tokenizer.json; throw phasekv::Error naming the unknown word or the missing file.
  std::vector<int32_t> tokenize(const std::string& text) override;
  std::string detokenize(const std::vector<int32_t>& ids) override;
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override;
  // score() with one AttentionProbe per layer applied to every forward (knockouts: the
  // replacements of model/attention.h); captures would only hold the last forward's batch, so
  // callers that need them run the model themselves. nullptr or empty: plain score().
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests,
                                 std::vector<AttentionProbe>* probes);
  // Probabilities in float64 from the same forwards as score(), for phase ensembling.
  std::vector<Distribution> next_token_distributions(
      const std::vector<ScoreRequest>& requests) override;
  // Greedy, through the streaming Session (prefill, then one decode step per token); stops early
  // at max_context. Throws phasekv::Error on an empty context or an id outside the vocabulary.
  std::vector<int32_t> generate(const std::vector<int32_t>& context, int max_tokens) override;
  int64_t max_context() const override;
  int model_stride() const override;  // chunked_stride of the config
  // backend, model_id, config_hash, stride (or null), strides, layers, vocab_size, max_context,
  // dtype, threads, batch_size.
  nlohmann::json describe() const override;

  Decoder& model() { return model_; }

 private:
  // Why a request cannot be scored ("" when it can): checked before any forward so one bad
  // request fails alone instead of taking its batch down.
  std::string request_error(const ScoreRequest& r) const;
  // The log-probabilities [B, V] (float64) after the last token of each request in `group`
  // (indices into `requests`, all of one length): one forward.
  torch::Tensor last_logprobs(const std::vector<ScoreRequest>& requests,
                              const std::vector<size_t>& group,
                              std::vector<AttentionProbe>* probes);
  // Groups the requests that can be scored by length, in forwards of at most batch_size_, and
  // hands each group's indices and last_logprobs to `use`. Returns every request's error ("" when
  // scored): a bad request or a failed forward fails alone or with its group, never the call.
  using GroupUse = std::function<void(const std::vector<size_t>& group, const torch::Tensor& logp)>;
  std::vector<std::string> for_each_group(const std::vector<ScoreRequest>& requests,
                                          std::vector<AttentionProbe>* probes, const GroupUse& use);

  Decoder model_;
  std::optional<Tokenizer> tokenizer_;
  std::string name_;
  int threads_ = 0;
  int batch_size_ = 16;
};

}  // namespace phasekv
