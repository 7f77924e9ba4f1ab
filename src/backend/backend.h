// The one interface evaluation talks to. A sweep, a probe or an audit never knows whether the
// model runs in this process (LocalBackend) or behind an OpenAI-compatible server (HttpBackend).
#pragma once
#include <cstdint>
#include <exception>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace phasekv {

struct ScoreRequest {
  std::vector<int32_t> context;  // token ids; the model predicts the token after the last one
  int32_t target = -1;           // the token whose log-probability is wanted
};

struct ScoreResult {
  double target_logprob = 0.0;  // log p(target | context), natural log
  bool censored = false;        // the server only returns its top-N and the target was not in it
  int32_t argmax = -1;          // the greedy next token (full-vocabulary top-1)
  double argmax_logprob = 0.0;
  std::string error;  // non-empty: the request failed for good (after retries)
};

// The full next-token distribution after one context (Backend::next_token_distributions).
struct Distribution {
  std::vector<double> probs;  // one probability per vocabulary id; empty on error
  std::string error;          // non-empty: the request failed for good
};

// Per-context outcome of Backend::generate_many.
struct Generation {
  std::vector<int32_t> tokens;
  std::optional<double> first_logprob;
  std::string error;  // non-empty: the request failed for good
  // The server refused the greedy output because it is not valid UTF-8 (llama.cpp answers HTTP
  // 500; tokens are then unknown, and the output differs from any valid-UTF-8 answer).
  bool invalid_utf8 = false;
  // Chat answers: the message text after the reasoning (scored by the value it names, as
  // evaluation harnesses do), the reasoning, whether the budget ended it before the answer
  // came, and the server's finish_reason ("length": the budget ran out).
  std::optional<std::string> text;
  std::string reasoning;
  bool answer_missing = false;
  std::string finish_reason;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string model_id() const = 0;
  virtual std::vector<int32_t> tokenize(const std::string& text) = 0;
  virtual std::string detokenize(const std::vector<int32_t>& ids) = 0;
  // Next-token scoring of many contexts; results in request order. Failures are reported per
  // request in ScoreResult::error, never by throwing, so a long sweep goes on.
  virtual std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) = 0;
  // The whole next-token distribution after each context, for phase ensembling
  // (eval/mitigations.h), which averages the distributions of shifted copies. Errors per request,
  // like score(). The default fails every request: a server returns only its top-N
  // log-probabilities, and averaging truncated distributions would not be the ensemble.
  virtual std::vector<Distribution> next_token_distributions(
      const std::vector<ScoreRequest>& requests) {
    return std::vector<Distribution>(
        requests.size(),
        Distribution{{},
                     model_id() + " returns no full next-token distribution (phase "
                                  "ensembling needs an in-process model: phasekv sweep)"});
  }
  // Greedy generation of up to max_tokens tokens after context.
  virtual std::vector<int32_t> generate(const std::vector<int32_t>& context, int max_tokens) = 0;
  // Greedy generation for many contexts, errors per context (never thrown). Backends that can
  // run requests concurrently override it.
  virtual std::vector<Generation> generate_many(const std::vector<std::vector<int32_t>>& contexts,
                                                int max_tokens) {
    std::vector<Generation> out(contexts.size());
    for (size_t i = 0; i < contexts.size(); ++i) {
      try {
        out[i].tokens = generate(contexts[i], max_tokens);
      } catch (const std::exception& e) {
        out[i].error = e.what();
      }
    }
    return out;
  }
  virtual int64_t max_context() const = 0;
  // The model's stride when this process runs it: the one stride of its chunked layers (0: none,
  // or several with no common one). A served model's is unknown here (0): finding it is what an
  // audit is for. The sweep's statistics, --ensemble's shifts and --plan read it from here, and
  // describe() reports it; nothing reads it back from JSON.
  virtual int model_stride() const { return 0; }
  // Non-empty once the backend cannot go on (an HTTP endpoint that stopped answering, see
  // http_transport.h): the runner then stops after the batch in flight, keeping only its
  // successful records, and a rerun resumes. In-process models never stop.
  virtual std::string stop_reason() const { return ""; }
  // What a report should say about this backend (dialect, prefix-cache policy, endpoint).
  virtual nlohmann::json describe() const = 0;
};

}  // namespace phasekv
