// The model work behind /v1/completions: prompt log-probabilities (echo) and generation, greedy
// or sampled. One request at a time (a mutex): libtorch already uses every core for one forward,
// and serial execution keeps results identical to the in-process backend.
#pragma once
#include <atomic>
#include <cstdint>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "backend/local_backend.h"

namespace phasekv {

struct EngineParams {
  int max_tokens = 16;
  double temperature = 1.0;  // 0: greedy
  double top_p = 1.0;
  int top_k = 0;  // 0 or -1: off
  uint64_t seed = 0;
  int top_n = -1;  // logprobs: -1 none, else the top N per position (plus the chosen token)
  bool prompt_logprobs = false;  // echo with logprobs
};

struct TokenLogprobs {
  std::optional<double> logprob;                // nullopt for the first prompt token
  std::vector<std::pair<int32_t, double>> top;  // descending; includes the token itself
};

struct EngineResult {
  std::vector<int32_t> generated;
  std::vector<TokenLogprobs> prompt;      // per prompt token (only with prompt_logprobs)
  std::vector<TokenLogprobs> completion;  // per generated token (only with top_n >= 0)
};

// Called after each generated token with everything so far (streaming sends it on); returning
// false stops the generation there (the client has gone).
using TokenCallback = std::function<bool(const EngineResult&)>;

class ModelEngine {
 public:
  explicit ModelEngine(LocalBackend& backend) : backend_(backend) {}
  // Prompt ids must be valid and prompt + max_tokens must fit max_context (checked by the
  // server before calling). The streaming routes pass on_token; the result is the same.
  EngineResult run(const std::vector<int32_t>& prompt, const EngineParams& p,
                   const TokenCallback& on_token = nullptr);
  // Tokens generated since the server started (tests check that a disconnect stops a stream).
  int64_t tokens_generated() const { return generated_; }

 private:
  LocalBackend& backend_;
  std::mutex mutex_;
  std::atomic<int64_t> generated_{0};
};

}  // namespace phasekv
