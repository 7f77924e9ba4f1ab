// HttpBackend: the Backend interface over an OpenAI-compatible server (vLLM, SGLang, llama.cpp,
// or `phasekv serve`), so a sweep or an audit runs unchanged against a model served on GPUs
// elsewhere. Prompts travel as token ids from the server's own tokenizer; the dialect's request
// shapes are in http_dialect.h, the retries and timeouts in http_transport.h.
//
// score() runs its requests `concurrency` at a time and never throws: a request that fails for
// good (after retries) comes back with ScoreResult::error naming the endpoint, the route and
// the last failure. In generate mode scoring is greedy generation of one token (its argmax);
// the target's logprob is then unknown (NaN), which a sweep records as null. llama.cpp refuses
// greedy output that ends inside a UTF-8 character (HTTP 500, never retried): in generate mode
// the greedy token is then read from the n_probs of a scoring request (score), or the
// generation comes back with Generation::invalid_utf8 (generate_many).
#pragma once
#include <atomic>
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/http_chat.h"
#include "backend/http_dialect.h"
#include "backend/http_transport.h"

namespace phasekv {

enum class ScoreMode { kLogprob, kGenerate };
ScoreMode score_mode_from_string(const std::string& s);  // "logprob" | "generate"
std::string to_string(ScoreMode m);

// Which route scores: /v1/completions with token ids (the dialect's shapes), or
// /v1/chat/completions with messages rendered by the server's chat template (http_chat.h).
enum class ApiKind { kCompletions, kChat };
ApiKind api_from_string(const std::string& s);  // "completions" | "chat"
std::string to_string(ApiKind a);

struct HttpBackendOptions {
  std::string endpoint;          // http[s]://host[:port][/base][/v1]
  std::string model;             // must be listed by GET /v1/models
  std::string dialect = "auto";  // auto | vllm | sglang | llamacpp
  int concurrency = 8;
  double timeout_s = 60;
  int retries = 5;
  int64_t max_total_retries = 2000;
  double retry_base_delay_s = 0.25;  // backoff: attempt k waits U(0, base * 2^k), at most 20 s
  std::string api_key_env;           // name of the environment variable holding the key; "" = none
  ScoreMode mode = ScoreMode::kLogprob;
  ApiKind api = ApiKind::kCompletions;  // chat: rendered as http_chat.h describes
  int top_n = 20;                       // vLLM logprobs / llama.cpp n_probs
  bool defeat_prefix_cache = true;
  int64_t max_context = 0;           // > 0 overrides what the server reports (--max-context)
  double max_retry_after_s = 120;    // longest Retry-After waited out
  double give_up_after_s = 60;       // no answer this long: the endpoint is down (http_transport.h)
  bool adaptive_concurrency = true;  // halve the requests in flight on 429s (http_transport.h)
  std::string request_cache;         // --request-cache DIR ("" = off; http_transport.h)
  std::string chat_template_file;    // --chat-template FILE ("" = the server renders; http_chat.h)
  std::string reasoning;             // --reasoning: "", on, off, low, medium, high (http_chat.h)
  // > 1 (llama.cpp, logprob scoring through completions, one request in flight): each scored
  // prompt is first sent as K - 1 growing prefixes (cut at k/K of its length, one token
  // generated, cache_prompt true), so the server's slot holds them and the scored request
  // computes only its last piece on top of the cached state: the prompt arrives in pieces.
  int prefill_pieces = 1;
};

// The server's context size and where it was read.
struct ContextLimit {
  int64_t tokens = 0;
  std::string source;  // "--max-context", "/v1/models max_model_len", "/props ... n_ctx", ...
};

// Token accounting summed over the scoring and generation answers of this process (the servers'
// usage fields, http_dialect.h parse_usage).
struct UsageTotals {
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int64_t answers_with_usage = 0, answers_without_usage = 0;
  int64_t answers_from_cache = 0;  // --request-cache hits: not counted above (no server work)
};

class HttpBackend : public Backend {
 public:
  // Connects: checks the endpoint and the API key variable, detects the dialect (unless given),
  // checks that the model is served and reads its context size. Throws phasekv::Error with the
  // endpoint in the message.
  static std::unique_ptr<HttpBackend> open(const HttpBackendOptions& options);

  std::string model_id() const override { return options_.model; }
  // The server's tokenizer, without special tokens (phase positions count every token sent).
  // Throw phasekv::Error when the request fails.
  std::vector<int32_t> tokenize(const std::string& text) override;
  std::string detokenize(const std::vector<int32_t>& ids) override;
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override;
  std::vector<int32_t> generate(const std::vector<int32_t>& context, int max_tokens) override;
  // The longest context one scoring request may carry: the server's context size less what the
  // dialect's rule adds (http_dialect.h positions_needed: vLLM echoes the target and generates
  // one token, llama.cpp needs room for one token, ...). No limit known: INT64_MAX.
  int64_t max_context() const override;
  std::string stop_reason() const override;
  // The same for a request that generates `new_tokens` tokens.
  int64_t max_prompt(int new_tokens) const;
  // The server's context size and its source (--max-context first); nullopt when the server
  // reports none. The rule that turns it into max_prompt() is context_rule(dialect, chat).
  std::optional<ContextLimit> context_limit() const;
  UsageTotals usage() const;
  // backend "http", endpoint (no credentials), model, dialect and how it was chosen, mode,
  // top_n, prefix_cache policy, concurrency, timeout_s, retries, max_total_retries,
  // api_key_env (the variable's name, never the key), max_context, api (and for chat the
  // template's leading tokens); for phasekv servers also
  // config_hash and vocab_size. Never a stride: an audit must find it blind.
  nlohmann::json describe() const override;

  // Concurrent variants for many texts or contexts. The tokenize/detokenize ones throw on the
  // first failure (a task cannot be built from partial tokenizations); generate_many reports
  // errors per request.
  std::vector<std::vector<int32_t>> tokenize_many(const std::vector<std::string>& texts,
                                                  bool add_special_tokens);
  std::vector<std::string> detokenize_many(const std::vector<std::vector<int32_t>>& ids);
  std::vector<Generation> generate_many(const std::vector<std::vector<int32_t>>& contexts,
                                        int max_tokens) override;

  Dialect dialect() const { return dialect_; }
  // api chat: the tokens the template puts around a message. At open, the rendering of an
  // empty message (the whole prefix; phasekv models' template adds nothing after the content);
  // frame_chat() learns prefix and suffix from a probe text (real templates), checked with a
  // second probe. Throws phasekv::Error naming the endpoint.
  const ChatFrame& chat_frame() const { return chat_frame_; }
  const ChatFrame& frame_chat(const std::string& probe);
  // The template's rendering of one user message, as token ids.
  std::vector<int32_t> render_chat(int slot, const std::string& content);
  TransportStats stats() const { return transport_->stats(); }
  // The model's GET /v1/models entry; phasekv servers add {"phasekv": {"task", ...}}.
  const nlohmann::json& model_card() const { return card_; }

 private:
  HttpBackend(HttpBackendOptions options, std::unique_ptr<Transport> transport);
  void detect(int slot);
  void load_model_card(int slot);
  CallParams call_params() const;
  ScoreResult score_one(int slot, const ScoreRequest& r);
  // --prefill-pieces: the K - 1 prefixes of `context` into the slot's prompt cache.
  void prefill(int slot, const std::vector<int32_t>& context);
  // Greedy generation through the configured route; throws on failure.
  Generated generate_one(int slot, const std::vector<int32_t>& context, int max_tokens);
  // api chat: the template's leading tokens (learned at open), and the message content that
  // renders exactly into `context` (throws ProtocolError naming the difference otherwise).
  void learn_chat_template(int slot);
  std::string chat_content(int slot, const std::vector<int32_t>& context);
  ChatCallOptions chat_options(int max_tokens) const;
  std::string request_error(const std::vector<int32_t>& context, int new_tokens) const;
  // A request's final failure for its record; a context rejection says a rerun cannot help.
  std::string failure_text(const RequestFailed& e) const;
  // POST a scoring or generation call and add its usage to the totals.
  nlohmann::json post_counted(int slot, const HttpCall& call);
  // Generate mode, llama.cpp refused the greedy output (invalid UTF-8): the greedy token read
  // from n_probs of a scoring request instead.
  ScoreResult argmax_by_probs(int slot, const ScoreRequest& r);

  HttpBackendOptions options_;
  std::unique_ptr<Transport> transport_;
  Dialect dialect_ = Dialect::kVllm;
  std::string dialect_source_;
  nlohmann::json card_ = nlohmann::json::object();
  std::optional<ContextLimit> server_context_;
  std::atomic<int64_t> usage_prompt_{0}, usage_completion_{0}, usage_cached_{0};
  std::atomic<int64_t> usage_with_{0}, usage_without_{0}, usage_cached_answers_{0};
  ChatRenderSource chat_source_ = ChatRenderSource::kServerTokenize;
  std::string chat_template_text_;  // --chat-template FILE's contents
  ChatFrame chat_frame_;
};

}  // namespace phasekv
