#include "backend/http_client.h"

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <random>

#include "backend/http_chat.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
using namespace std::string_literals;

// A salt no other request shares: vLLM then hashes every block of this request apart from
// every other, so no KV block is ever reused across the phases of a sweep.
std::string fresh_salt() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return "phasekv-" + std::to_string(rng()) + "-" + std::to_string(counter++);
}

std::string read_api_key(const std::string& var) {
  if (var.empty()) return "";
  const char* value = std::getenv(var.c_str());
  if (value == nullptr || *value == '\0')
    throw Error("--api-key-env " + var + ": the environment variable is not set or empty");
  return value;
}

}  // namespace

ScoreMode score_mode_from_string(const std::string& s) {
  if (s == "logprob") return ScoreMode::kLogprob;
  if (s == "generate") return ScoreMode::kGenerate;
  throw Error("--mode: '" + s + "' is not a scoring mode (allowed: logprob, generate)");
}

std::string to_string(ScoreMode m) {
  return m == ScoreMode::kLogprob ? "logprob" : "generate";
}

ApiKind api_from_string(const std::string& s) {
  if (s == "completions") return ApiKind::kCompletions;
  if (s == "chat") return ApiKind::kChat;
  throw Error("--api: '" + s + "' (allowed: completions, chat)");
}

std::string to_string(ApiKind a) {
  return a == ApiKind::kChat ? "chat" : "completions";
}

HttpBackend::HttpBackend(HttpBackendOptions options, std::unique_ptr<Transport> transport)
    : options_(std::move(options)), transport_(std::move(transport)) {}

std::unique_ptr<HttpBackend> HttpBackend::open(const HttpBackendOptions& o) {
  if (o.model.empty()) throw Error("--model: no model name given (see GET /v1/models)");
  if (o.top_n < 1 || o.top_n > 1000)
    throw Error("--top-n is " + std::to_string(o.top_n) + " (allowed: 1..1000)");
  TransportOptions t;
  t.url = parse_endpoint(o.endpoint);
  t.slots = o.concurrency;
  t.timeout_s = o.timeout_s;
  t.retry.retries = o.retries;
  t.retry.max_total_retries = o.max_total_retries;
  t.retry.base_delay_s = o.retry_base_delay_s;
  if (!(o.max_retry_after_s >= 0))
    throw Error(fmt::format("--max-retry-after-s is {:g} (allowed: >= 0)", o.max_retry_after_s));
  t.retry.max_retry_after_s = o.max_retry_after_s;
  t.retry.give_up_after_s = o.give_up_after_s;
  t.adaptive.enabled = o.adaptive_concurrency;
  t.permanent = llamacpp_output_refused;
  t.cache_dir = o.request_cache;
  t.api_key = read_api_key(o.api_key_env);
  if (o.prefill_pieces < 1)
    throw Error(fmt::format("--prefill-pieces is {} (allowed: >= 1)", o.prefill_pieces));
  if (o.prefill_pieces > 1 &&
      (o.concurrency != 1 || o.mode != ScoreMode::kLogprob || o.api != ApiKind::kCompletions))
    throw Error(
        "--prefill-pieces > 1 sends a prompt's pieces to one server slot in turn: it needs "
        "--concurrency 1, --mode logprob and --api completions");
  std::unique_ptr<HttpBackend> b(new HttpBackend(o, std::make_unique<Transport>(std::move(t))));
  try {
    if (o.dialect == "auto") {
      b->detect(0);
    } else {
      b->dialect_ = dialect_from_string(o.dialect);
      b->dialect_source_ = "--dialect";
    }
    b->load_model_card(0);
    if (o.api == ApiKind::kChat) b->learn_chat_template(0);
    if (o.prefill_pieces > 1 && b->dialect_ != Dialect::kLlamacpp)
      throw Error("--prefill-pieces > 1: the server is " + to_string(b->dialect_) +
                  "; pieces are sent to llama.cpp's /completion only (allowed with --dialect "
                  "llamacpp)");
  } catch (const RequestFailed& e) {
    throw Error(std::string("endpoint ") + o.endpoint + ": " + e.what());
  } catch (const ProtocolError& e) {
    throw Error(std::string("endpoint ") + o.endpoint + ": " + e.what());
  }
  return b;
}

// /v1/models names the engine in owned_by (vLLM, SGLang, llama.cpp and phasekv all do); older
// servers are recognised by a route only one of them has.
void HttpBackend::detect(int slot) {
  try {
    for (const auto& card : parse_models(transport_->get(slot, "/v1/models"))) {
      if (auto d = dialect_from_owner(card.owned_by)) {
        dialect_ = *d;
        dialect_source_ = "detected: /v1/models owned_by '" + card.owned_by + "'";
        return;
      }
    }
  } catch (const RequestFailed& e) {
    if (e.status == 0) throw;  // unreachable: probing other routes will not help
  } catch (const ProtocolError&) {
  }
  auto probe = [&](const char* route, const char* key) {
    try {
      const json j = transport_->get(slot, route);
      return j.is_object() && j.contains(key);
    } catch (const std::exception&) {
      return false;
    }
  };
  if (probe("/props", "default_generation_settings")) {
    dialect_ = Dialect::kLlamacpp;
    dialect_source_ = "detected: GET /props (llama.cpp)";
  } else if (probe("/get_model_info", "model_path")) {
    dialect_ = Dialect::kSglang;
    dialect_source_ = "detected: GET /get_model_info (SGLang)";
  } else {
    throw Error("endpoint " + transport_->url().url("") +
                ": cannot tell the server's dialect (no owned_by in /v1/models, no /props, no "
                "/get_model_info); pass --dialect vllm|sglang|llamacpp");
  }
}

void HttpBackend::load_model_card(int slot) {
  std::vector<ModelCard> cards;
  try {
    cards = parse_models(transport_->get(slot, "/v1/models"));
  } catch (const std::exception&) {
    // llama.cpp before mid-2024 has no /v1/models; it serves one model whatever the name.
    if (dialect_ != Dialect::kLlamacpp) throw;
  }
  std::string served;
  std::optional<int64_t> meta_n_ctx;
  for (const auto& c : cards) {
    served += (served.empty() ? "" : ", ") + c.id;
    // llama.cpp answers for its one model under any name.
    if (c.id != options_.model && !(dialect_ == Dialect::kLlamacpp && cards.size() == 1)) continue;
    if (c.id == options_.model || card_.empty()) card_ = c.raw;
    if (c.max_model_len)
      server_context_ = ContextLimit{*c.max_model_len, "/v1/models max_model_len"};
    meta_n_ctx = c.meta_n_ctx;
  }
  // llama.cpp answers for its one model under any name.
  if (card_.empty() && !cards.empty() && dialect_ != Dialect::kLlamacpp)
    throw Error("endpoint " + transport_->url().url("/v1/models") + " does not serve model '" +
                options_.model + "' (served: " + served + ")");
  // llama.cpp: a slot's context (/props default_generation_settings.n_ctx) is what a request
  // must fit; meta.n_ctx, where a build publishes it, is the whole context of all slots.
  if (dialect_ == Dialect::kLlamacpp && !server_context_) {
    try {
      if (auto n = llamacpp_context(transport_->get(slot, "/props")))
        server_context_ = ContextLimit{*n, "/props default_generation_settings.n_ctx (per slot)"};
    } catch (const std::exception&) {
    }
    if (!server_context_ && meta_n_ctx)
      server_context_ = ContextLimit{*meta_n_ctx, "/v1/models meta.n_ctx"};
  }
}

std::optional<ContextLimit> HttpBackend::context_limit() const {
  if (options_.max_context > 0) return ContextLimit{options_.max_context, "--max-context"};
  return server_context_;
}

int64_t HttpBackend::max_prompt(int new_tokens) const {
  const auto limit = context_limit();
  if (!limit) return std::numeric_limits<int64_t>::max();
  const bool echo =
      dialect_ == Dialect::kVllm && options_.mode == ScoreMode::kLogprob && new_tokens <= 1;
  return limit->tokens -
         positions_needed(dialect_, options_.api == ApiKind::kChat, echo, 0, new_tokens);
}

int64_t HttpBackend::max_context() const {
  return max_prompt(1);
}

std::string HttpBackend::stop_reason() const {
  return transport_->down_reason();
}

UsageTotals HttpBackend::usage() const {
  UsageTotals u;
  u.prompt_tokens = usage_prompt_.load();
  u.completion_tokens = usage_completion_.load();
  u.cached_tokens = usage_cached_.load();
  u.answers_with_usage = usage_with_.load();
  u.answers_without_usage = usage_without_.load();
  u.answers_from_cache = usage_cached_answers_.load();
  return u;
}

json HttpBackend::post_counted(int slot, const HttpCall& call) {
  bool from_cache = false;
  json response = transport_->post(slot, call.route, call.body, &from_cache);
  if (from_cache) {
    ++usage_cached_answers_;
    return response;
  }
  const Usage u =
      parse_usage(call.route == "/v1/chat/completions" ? Dialect::kVllm : dialect_, response);
  if (u.present) {
    usage_prompt_ += u.prompt;
    usage_completion_ += u.completion;
    usage_cached_ += u.cached;
    ++usage_with_;
  } else {
    ++usage_without_;
  }
  return response;
}

CallParams HttpBackend::call_params() const {
  CallParams p;
  p.model = options_.model;
  p.top_n = options_.top_n;
  // Pieces must find their prefix in the slot's cache.
  p.disable_cache = options_.defeat_prefix_cache && options_.prefill_pieces == 1;
  if (p.disable_cache && dialect_ == Dialect::kVllm) p.cache_salt = fresh_salt();
  return p;
}

void HttpBackend::prefill(int slot, const std::vector<int32_t>& context) {
  const auto k_max = static_cast<size_t>(options_.prefill_pieces);
  for (size_t k = 1; k < k_max; ++k) {
    const size_t cut = context.size() * k / k_max;
    if (cut == 0) continue;
    const std::vector<int32_t> prefix(context.begin(), context.begin() + static_cast<long>(cut));
    post_counted(slot, generate_call(dialect_, call_params(), prefix, 1));
  }
}

std::string HttpBackend::failure_text(const RequestFailed& e) const {
  std::string text = e.what();
  if (context_rejection(e.status, e.body))
    text +=
        " -- the prompt does not fit the server's context, so a rerun will not help: the "
        "audit checks its prompts against the context size before sending when it knows "
        "it (--max-context N" +
        std::string(options_.max_context > 0 ? " is larger than the server's" : "") + ")";
  return text;
}

std::string HttpBackend::request_error(const std::vector<int32_t>& context, int new_tokens) const {
  if (context.empty()) return "empty context (the model needs at least one token)";
  if (static_cast<int64_t>(context.size()) > max_prompt(new_tokens)) {
    const ContextLimit limit = *context_limit();
    return "context of " + std::to_string(context.size()) + " tokens does not fit the server's " +
           "context size " + std::to_string(limit.tokens) + " (" + limit.source + "; " +
           context_rule(dialect_, options_.api == ApiKind::kChat) + ": at most " +
           std::to_string(max_prompt(new_tokens)) + " context tokens)";
  }
  return "";
}

void HttpBackend::learn_chat_template(int slot) {
  check_reasoning(options_.reasoning);
  if (!options_.chat_template_file.empty()) {
    chat_source_ = ChatRenderSource::kTemplateFile;
    chat_template_text_ = read_file(options_.chat_template_file);
    fill_template_file(chat_template_text_, options_.chat_template_file, "");  // one slot
  } else {
    chat_source_ = dialect_ == Dialect::kLlamacpp ? ChatRenderSource::kApplyTemplate
                                                  : ChatRenderSource::kServerTokenize;
  }
  try {
    chat_frame_ = {render_chat(slot, ""), {}};
  } catch (const RequestFailed& e) {
    if (e.status < 400 || e.status >= 500 || chat_source_ == ChatRenderSource::kTemplateFile) throw;
    throw Error("endpoint " + options_.endpoint + " cannot render chat messages (" +
                (chat_source_ == ChatRenderSource::kApplyTemplate ? "POST /apply-template"s
                                                                  : "POST /tokenize {messages}"s) +
                " answered " + std::to_string(e.status) +
                "), so the templated position of the key is unknown; give --chat-template FILE "
                "with the template's rendering of one user message: " +
                e.what());
  }
}

std::vector<int32_t> HttpBackend::render_chat(int slot, const std::string& content) {
  std::string text;
  if (chat_source_ == ChatRenderSource::kServerTokenize) {
    const HttpCall call =
        chat_render_call(chat_source_, options_.model, content, options_.reasoning);
    return parse_tokenize(transport_->post(slot, call.route, call.body));
  }
  if (chat_source_ == ChatRenderSource::kApplyTemplate) {
    const HttpCall call =
        chat_render_call(chat_source_, options_.model, content, options_.reasoning);
    text = parse_applied_template(transport_->post(slot, call.route, call.body));
  } else {
    text = fill_template_file(chat_template_text_, options_.chat_template_file, content);
  }
  // llama.cpp's chat route tokenizes the rendered text with its special tokens (the BOS that
  // /apply-template leaves out); a template file holds everything itself.
  const bool special = chat_source_ == ChatRenderSource::kApplyTemplate;
  HttpCall call = tokenize_call(dialect_, options_.model, text, special);
  if (dialect_ == Dialect::kLlamacpp) call.body["parse_special"] = true;
  return parse_tokenize(transport_->post(slot, call.route, call.body));
}

const ChatFrame& HttpBackend::frame_chat(const std::string& probe) {
  if (options_.api != ApiKind::kChat) throw Error("internal: frame_chat without --api chat");
  try {
    auto frame_of = [&](const std::string& text) {
      const HttpCall tok = tokenize_call(dialect_, options_.model, text, false);
      const auto ids = parse_tokenize(transport_->post(0, tok.route, tok.body));
      return std::pair{frame_from_probe(render_chat(0, text), ids), ids};
    };
    const auto [frame, ids] = frame_of(probe);
    // A second probe of another length must get the same frame (a template whose additions
    // depend on the content, e.g. a date or a length, cannot be planned around).
    const auto [again, ids2] = frame_of(probe + " again");
    if (again.prefix != frame.prefix || again.suffix != frame.suffix)
      throw ProtocolError("the chat template adds other tokens around '" + probe + " again' (" +
                          std::to_string(again.prefix.size()) + " before, " +
                          std::to_string(again.suffix.size()) + " after) than around '" + probe +
                          "' (" + std::to_string(frame.prefix.size()) + ", " +
                          std::to_string(frame.suffix.size()) + ")");
    chat_frame_ = frame;
  } catch (const RequestFailed& e) {
    throw Error("endpoint " + options_.endpoint + ": rendering a probe chat message: " + e.what());
  } catch (const ProtocolError& e) {
    throw Error("endpoint " + options_.endpoint + ": " + e.what());
  }
  return chat_frame_;
}

std::string HttpBackend::chat_content(int slot, const std::vector<int32_t>& context) {
  const auto& [prefix, suffix] = chat_frame_;
  if (context.size() < prefix.size() + suffix.size() ||
      !std::equal(prefix.begin(), prefix.end(), context.begin()) ||
      !std::equal(suffix.rbegin(), suffix.rend(), context.rbegin()))
    throw ProtocolError("the planned prompt does not start with the chat template's " +
                        std::to_string(prefix.size()) + " leading tokens and end with its " +
                        std::to_string(suffix.size()) +
                        " trailing tokens, so no message renders into it");
  const std::vector<int32_t> body(context.begin() + static_cast<std::ptrdiff_t>(prefix.size()),
                                  context.end() - static_cast<std::ptrdiff_t>(suffix.size()));
  const HttpCall detok = detokenize_call(dialect_, options_.model, body);
  const std::string content = parse_detokenize(transport_->post(slot, detok.route, detok.body));
  const std::string mismatch = chat_render_mismatch(render_chat(slot, content), context);
  if (!mismatch.empty()) throw ProtocolError(mismatch);
  return content;
}

ChatCallOptions HttpBackend::chat_options(int max_tokens) const {
  ChatCallOptions o;
  o.max_tokens = max_tokens;
  o.reasoning = options_.reasoning;
  // Token logprobs of a whole reasoning trace are large and unused: the answer is read as text.
  o.logprobs = options_.mode == ScoreMode::kLogprob || options_.reasoning.empty() ||
               options_.reasoning == "off";
  o.disable_cache = options_.defeat_prefix_cache;
  return o;
}

Generated HttpBackend::generate_one(int slot, const std::vector<int32_t>& context, int max_tokens) {
  if (options_.api == ApiKind::kChat) {
    const HttpCall call =
        chat_call(call_params(), chat_content(slot, context), chat_options(max_tokens));
    return parse_chat_generate(post_counted(slot, call), context.size());
  }
  const HttpCall call = generate_call(dialect_, call_params(), context, max_tokens);
  return parse_generate(dialect_, post_counted(slot, call));
}

ScoreResult HttpBackend::argmax_by_probs(int slot, const ScoreRequest& r) {
  const HttpCall call = score_call(dialect_, call_params(), r);
  ScoreResult s = parse_score(dialect_, post_counted(slot, call), r);
  s.target_logprob = std::numeric_limits<double>::quiet_NaN();  // generate mode reports none
  s.censored = false;
  return s;
}

ScoreResult HttpBackend::score_one(int slot, const ScoreRequest& r) {
  ScoreResult out;
  out.error = request_error(r.context, 1);
  if (!out.error.empty()) return out;
  try {
    if (options_.mode == ScoreMode::kLogprob && options_.api == ApiKind::kChat) {
      const HttpCall call =
          chat_call(call_params(), chat_content(slot, r.context), chat_options(1));
      return parse_chat_score(post_counted(slot, call), r);
    }
    if (options_.mode == ScoreMode::kLogprob) {
      if (options_.prefill_pieces > 1) prefill(slot, r.context);
      const HttpCall call = score_call(dialect_, call_params(), r);
      return parse_score(dialect_, post_counted(slot, call), r);
    }
    Generated g;
    try {
      g = generate_one(slot, r.context, 1);
    } catch (const RequestFailed& e) {
      if (dialect_ != Dialect::kLlamacpp || options_.api == ApiKind::kChat ||
          !llamacpp_output_refused(e.status, e.body))
        throw;
      return argmax_by_probs(slot, r);  // the greedy token is an incomplete UTF-8 sequence
    }
    if (g.invalid_utf8) return argmax_by_probs(slot, r);
    if (g.tokens.empty()) throw ProtocolError("the server generated no token");
    out.argmax = g.tokens.front();
    out.argmax_logprob = g.first_logprob.value_or(std::numeric_limits<double>::quiet_NaN());
    out.target_logprob = std::numeric_limits<double>::quiet_NaN();
  } catch (const RequestFailed& e) {
    out.error = failure_text(e);
  } catch (const ProtocolError& e) {
    out.error = transport_->url().origin() + ": unexpected response: " + e.what();
  } catch (const std::exception& e) {
    out.error = transport_->url().origin() + ": " + e.what();
  }
  return out;
}

std::vector<ScoreResult> HttpBackend::score(const std::vector<ScoreRequest>& requests) {
  std::vector<ScoreResult> out(requests.size());
  parallel_for(options_.concurrency, requests.size(),
               [&](int slot, size_t i) { out[i] = score_one(slot, requests[i]); });
  return out;
}

std::vector<Generation> HttpBackend::generate_many(
    const std::vector<std::vector<int32_t>>& contexts, int max_tokens) {
  std::vector<Generation> out(contexts.size());
  parallel_for(options_.concurrency, contexts.size(), [&](int slot, size_t i) {
    Generation& g = out[i];
    g.error = request_error(contexts[i], max_tokens);
    if (!g.error.empty()) return;
    try {
      Generated parsed = generate_one(slot, contexts[i], max_tokens);
      g.tokens = std::move(parsed.tokens);
      g.first_logprob = parsed.first_logprob;
      g.invalid_utf8 = parsed.invalid_utf8;
      g.text = std::move(parsed.text);
      g.reasoning = std::move(parsed.reasoning);
      g.answer_missing = parsed.answer_missing;
      g.finish_reason = std::move(parsed.finish_reason);
    } catch (const RequestFailed& e) {
      if (llamacpp_output_refused(e.status, e.body))
        g.invalid_utf8 = true;  // a scored outcome: the output is not valid text
      else
        g.error = failure_text(e);
    } catch (const std::exception& e) {
      g.error = e.what();
    }
  });
  return out;
}

std::vector<int32_t> HttpBackend::generate(const std::vector<int32_t>& context, int max_tokens) {
  if (max_tokens <= 0) return {};
  Generation g = generate_many({context}, max_tokens).front();
  if (!g.error.empty()) throw Error("generate: " + g.error);
  return g.tokens;
}

std::vector<std::vector<int32_t>> HttpBackend::tokenize_many(const std::vector<std::string>& texts,
                                                             bool add_special_tokens) {
  std::vector<std::vector<int32_t>> out(texts.size());
  std::vector<std::string> errors(texts.size());
  parallel_for(options_.concurrency, texts.size(), [&](int slot, size_t i) {
    try {
      const HttpCall call = tokenize_call(dialect_, options_.model, texts[i], add_special_tokens);
      out[i] = parse_tokenize(transport_->post(slot, call.route, call.body));
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (size_t i = 0; i < texts.size(); ++i)
    if (!errors[i].empty())
      throw Error("tokenize '" + texts[i].substr(0, 60) + "' with " +
                  transport_->url().url("/tokenize") + ": " + errors[i]);
  return out;
}

std::vector<std::string> HttpBackend::detokenize_many(
    const std::vector<std::vector<int32_t>>& ids) {
  std::vector<std::string> out(ids.size());
  std::vector<std::string> errors(ids.size());
  parallel_for(options_.concurrency, ids.size(), [&](int slot, size_t i) {
    try {
      const HttpCall call = detokenize_call(dialect_, options_.model, ids[i]);
      out[i] = parse_detokenize(transport_->post(slot, call.route, call.body));
    } catch (const std::exception& e) {
      errors[i] = e.what();
    }
  });
  for (size_t i = 0; i < ids.size(); ++i)
    if (!errors[i].empty())
      throw Error("detokenize with " + transport_->url().url("/detokenize") + ": " + errors[i]);
  return out;
}

std::vector<int32_t> HttpBackend::tokenize(const std::string& text) {
  return tokenize_many({text}, false).front();
}

std::string HttpBackend::detokenize(const std::vector<int32_t>& ids) {
  return detokenize_many({ids}).front();
}

json HttpBackend::describe() const {
  json d = {
      {"backend", "http"},
      {"endpoint", transport_->url().url("")},
      {"model", options_.model},
      {"dialect", to_string(dialect_)},
      {"dialect_source", dialect_source_},
      {"mode", to_string(options_.mode)},
      {"api", to_string(options_.api)},
      {"top_n", options_.top_n},
      {"prefix_cache",
       prefix_cache_policy(dialect_, options_.defeat_prefix_cache && options_.prefill_pieces == 1)},
      {"concurrency", options_.concurrency},
      {"timeout_s", options_.timeout_s},
      {"retries", options_.retries},
      {"max_total_retries", options_.max_total_retries},
      {"api_key_env", options_.api_key_env.empty() ? json(nullptr) : json(options_.api_key_env)},
      {"max_context",
       max_context() == std::numeric_limits<int64_t>::max() ? json(nullptr) : json(max_context())},
      {"adaptive_concurrency", options_.adaptive_concurrency},
      {"request_cache",
       options_.request_cache.empty() ? json(nullptr) : json(options_.request_cache)},
      {"max_retry_after_s", options_.max_retry_after_s},
      {"give_up_after_s", options_.give_up_after_s}};
  if (options_.prefill_pieces > 1) d["prefill_pieces"] = options_.prefill_pieces;
  const auto limit = context_limit();
  d["context_limit"] = limit
                           ? json{{"tokens", limit->tokens},
                                  {"source", limit->source},
                                  {"rule", context_rule(dialect_, options_.api == ApiKind::kChat)}}
                           : json(nullptr);
  if (options_.api == ApiKind::kChat) {
    d["chat_template"] = to_string(chat_source_) + "; every prompt checked token for token";
    if (chat_source_ == ChatRenderSource::kTemplateFile) {
      d["chat_template_file"] = options_.chat_template_file;
      d["chat_template_file_fnv1a64"] = fnv1a64_hex(chat_template_text_);
    }
    d["chat_template_leading_tokens"] = chat_frame_.prefix;
    d["chat_template_trailing_tokens"] = chat_frame_.suffix;
    d["reasoning"] = options_.reasoning.empty() ? json("server default") : json(options_.reasoning);
    d["reasoning_request_fields"] = reasoning_fields(options_.reasoning);
    d["censoring"] = "targets outside the top " +
                     std::to_string(std::min(options_.top_n, kMaxChatTopLogprobs)) +
                     " (top_logprobs) are censored: wrong, logprob unknown";
  }
  if (dialect_ == Dialect::kLlamacpp)
    d["censoring"] = "targets outside the top " + std::to_string(options_.top_n) +
                     " (n_probs) are censored: wrong, logprob unknown";
  if (card_.contains("owned_by")) d["owned_by"] = card_["owned_by"];
  if (card_.contains("phasekv") && card_["phasekv"].is_object()) {
    const json& p = card_["phasekv"];
    for (const char* key : {"config_hash", "vocab_size"})
      if (p.contains(key)) d[key] = p[key];
  }
  return d;
}

}  // namespace phasekv
