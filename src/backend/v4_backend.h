// A DeepSeek-V4 checkpoint (src/v4) behind the Backend interface, so `phasekv sweep` runs a V4
// model directory the way it runs phasekv's own models (LocalBackend), with the same records,
// statistics and reports.
//
// The V4 forward takes one sequence (v4/model.h), so requests run one at a time; scoring reads
// the last position's log-probabilities in float64. Nothing is padded: a token's phase is its
// absolute position. Generation is greedy through the streaming cache (prefill, then one token
// per call), which gives the full forward's logits at every split (tests/test_v4_model.cpp).
#pragma once
#include <optional>
#include <string>

#include "backend/backend.h"
#include "io/tokenizer.h"
#include "v4/model.h"

namespace phasekv {

class V4Backend : public Backend {
 public:
  // threads <= 0: all cores (libtorch's process-wide thread count).
  V4Backend(v4::V4Model model, std::optional<Tokenizer> tokenizer, std::string name,
            int threads = 0);
  // Loads DIR (config.json with DeepseekV4ForCausalLM's keys, *.safetensors, and tokenizer.json
  // when present).
  static V4Backend from_dir(const std::string& dir, int threads = 0);

  std::string model_id() const override;  // "<name>@<config hash>"
  std::vector<int32_t> tokenize(const std::string& text) override;
  std::string detokenize(const std::vector<int32_t>& ids) override;
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override;
  std::vector<Distribution> next_token_distributions(
      const std::vector<ScoreRequest>& requests) override;
  std::vector<int32_t> generate(const std::vector<int32_t>& context, int max_tokens) override;
  int64_t max_context() const override;  // max_position_embeddings
  int model_stride() const override;     // v4::chunked_stride: the one compress ratio, else 0
  // backend "local", family "deepseek_v4", model_id, config_hash, stride (or null), strides,
  // compress_ratios, vocab_size, max_context, dtype, threads, tokenizer.
  nlohmann::json describe() const override;

  const v4::V4Model& model() const { return model_; }
  std::string config_hash() const;

 private:
  // log p(. | context) after the last token, float64 [V]; throws on a failed forward.
  torch::Tensor last_logprobs(const std::vector<int32_t>& context) const;

  v4::V4Model model_;
  std::optional<Tokenizer> tokenizer_;
  std::string name_;
  int threads_ = 0;
};

}  // namespace phasekv
