#include "server/response_shapes.h"

#include <fmt/format.h>

#include <atomic>
#include <cstring>
#include <random>

namespace phasekv {

using json = nlohmann::json;

std::string response_id(const std::string& prefix) {
  static std::atomic<uint64_t> counter{0};
  static const uint64_t base = std::mt19937_64{std::random_device{}()}();
  return fmt::format("{}-{:016x}{:08x}", prefix, base, counter++ & 0xffffffffu);
}

json usage_json(int64_t prompt_tokens, int64_t completion_tokens) {
  return {{"prompt_tokens", prompt_tokens},
          {"completion_tokens", completion_tokens},
          {"total_tokens", prompt_tokens + completion_tokens}};
}

EngineParams engine_params(const SamplingRequest& r, int top_n, bool prompt_logprobs,
                           size_t index) {
  EngineParams p;
  p.max_tokens = r.max_tokens;
  p.temperature = r.temperature;
  p.top_p = r.top_p;
  p.top_k = r.top_k;
  p.top_n = top_n;
  p.prompt_logprobs = prompt_logprobs;
  p.seed = r.seed ? *r.seed + index : std::random_device{}();
  return p;
}

std::string text_of(const std::vector<int32_t>& ids, const ModelLimits& limits) {
  if (!limits.tokenizer || ids.empty()) return "";
  return limits.tokenizer->decode(ids);
}

std::string completion_text(const std::vector<int32_t>& generated, const ModelLimits& limits) {
  const std::string text = text_of(generated, limits);
  return text.empty() ? text : limits.tokenizer->separator() + text;
}

std::string TextDeltas::next(const std::vector<int32_t>& generated, bool last) {
  const std::string text = whole_(generated, limits_);
  static const std::string kReplacement = "\xEF\xBF\xBD";
  const bool incomplete =
      text.size() >= kReplacement.size() &&
      text.compare(text.size() - kReplacement.size(), kReplacement.size(), kReplacement) == 0;
  if ((incomplete && !last) || text.size() <= sent_) return "";
  std::string delta = text.substr(sent_);
  sent_ = text.size();
  return delta;
}

void LogprobsBuilder::add(int32_t id, const TokenLogprobs* lp) {
  const std::string text = token_text(id, as_ids_, limits_);
  // Token texts join with the tokenizer's separator (one space between words).
  const size_t gap =
      limits_.tokenizer && !as_ids_ ? std::strlen(limits_.tokenizer->separator()) : 1;
  const size_t start = tokens_.empty() ? 0 : offset_ + gap;
  offsets_.push_back(start);
  offset_ = start + text.size();
  tokens_.push_back(text);
  if (!lp || !lp->logprob) {
    token_logprobs_.push_back(nullptr);
    top_.push_back(nullptr);
    return;
  }
  token_logprobs_.push_back(*lp->logprob);
  json t = json::object();
  for (const auto& [tid, v] : lp->top) t[token_text(tid, as_ids_, limits_)] = v;
  top_.push_back(std::move(t));
}

json LogprobsBuilder::build(size_t from) const {
  auto slice = [from](const std::vector<json>& v) {
    return json(std::vector<json>(v.begin() + static_cast<std::ptrdiff_t>(from), v.end()));
  };
  return {{"text_offset", slice(offsets_)},
          {"token_logprobs", slice(token_logprobs_)},
          {"tokens", slice(tokens_)},
          {"top_logprobs", slice(top_)}};
}

json completion_choice(size_t index, const std::vector<int32_t>& prompt, const EngineResult& r,
                       const CompletionRequest& req, const ModelLimits& limits) {
  std::string text = completion_text(r.generated, limits);
  if (req.echo) text = text_of(prompt, limits) + text;
  json logprobs = nullptr;
  if (req.logprobs) {
    LogprobsBuilder b(limits, req.tokens_as_ids);
    if (req.echo)
      for (size_t t = 0; t < prompt.size(); ++t) b.add(prompt[t], &r.prompt.at(t));
    for (size_t t = 0; t < r.generated.size(); ++t) b.add(r.generated[t], &r.completion.at(t));
    logprobs = b.build();
  }
  json c = {{"index", index},         {"text", text},
            {"logprobs", logprobs},   {"finish_reason", "length"},
            {"stop_reason", nullptr}, {"prompt_logprobs", nullptr}};
  if (req.return_token_ids) {
    c["prompt_token_ids"] = prompt;
    c["token_ids"] = r.generated;
  }
  return c;
}

namespace {

json utf8_bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

}  // namespace

json chat_logprob(int32_t id, const TokenLogprobs& lp, int top_n, bool as_ids,
                  const ModelLimits& limits) {
  const std::string token = token_text(id, as_ids, limits);
  json top = json::array();
  // The engine lists the top N, then the chosen token when it is not among them; chat's
  // top_logprobs are the N best only.
  for (size_t i = 0; i < lp.top.size() && static_cast<int>(i) < top_n; ++i) {
    const std::string t = token_text(lp.top[i].first, as_ids, limits);
    top.push_back({{"token", t}, {"logprob", lp.top[i].second}, {"bytes", utf8_bytes(t)}});
  }
  return {{"token", token},
          {"logprob", lp.logprob.value_or(0.0)},
          {"bytes", utf8_bytes(token)},
          {"top_logprobs", top}};
}

json chat_choice(const EngineResult& r, const ChatRequest& req, const ModelLimits& limits) {
  json logprobs = nullptr;
  if (req.logprobs) {
    json content = json::array();
    for (size_t t = 0; t < r.generated.size(); ++t)
      content.push_back(chat_logprob(r.generated[t], r.completion.at(t), req.top_logprobs,
                                     req.tokens_as_ids, limits));
    logprobs = {{"content", content}};
  }
  json c = {{"index", 0},
            {"message",
             {{"role", "assistant"},
              {"content", text_of(r.generated, limits)},
              {"tool_calls", json::array()}}},
            {"logprobs", logprobs},
            {"finish_reason", "length"},
            {"stop_reason", nullptr}};
  if (req.return_token_ids) {
    c["prompt_token_ids"] = req.prompt;
    c["token_ids"] = r.generated;
  }
  return c;
}

}  // namespace phasekv
