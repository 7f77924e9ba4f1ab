#include "server/server_engine.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>

#include "runtime/session.h"

namespace phasekv {
namespace {

// Log-probabilities in float64 (as LocalBackend), so a target far down the distribution keeps
// its exact value.
torch::Tensor log_probs(const torch::Tensor& logits) {
  return torch::log_softmax(logits.to(torch::kFloat64), -1).contiguous();
}

TokenLogprobs entry(const torch::Tensor& logp, int32_t token, int top_n) {
  TokenLogprobs e;
  e.logprob = logp[token].item<double>();
  if (top_n > 0) {
    auto [values, indices] = logp.topk(std::min<int64_t>(top_n, logp.size(0)));
    for (int64_t i = 0; i < values.size(0); ++i)
      e.top.emplace_back(static_cast<int32_t>(indices[i].item<int64_t>()),
                         values[i].item<double>());
  }
  // vLLM lists the chosen (or prompt) token too, even outside the top N.
  const bool listed =
      std::any_of(e.top.begin(), e.top.end(), [&](const auto& t) { return t.first == token; });
  if (!listed) e.top.emplace_back(token, *e.logprob);
  return e;
}

// Greedy, or a draw from softmax(logp / T) restricted by top_k and top_p.
int32_t choose(const torch::Tensor& logp, const EngineParams& p, std::mt19937_64& rng) {
  if (p.temperature <= 0) return static_cast<int32_t>(logp.argmax().item<int64_t>());
  auto probs = torch::softmax(logp / p.temperature, -1).contiguous();
  auto [sorted, order] = probs.sort(-1, /*descending=*/true);
  auto ps = sorted.accessor<double, 1>();
  auto ids = order.accessor<int64_t, 1>();
  int64_t keep = ps.size(0);
  if (p.top_k > 0) keep = std::min<int64_t>(keep, p.top_k);
  double mass = 0.0;
  for (int64_t i = 0; i < keep; ++i) {
    mass += ps[i];
    if (mass >= p.top_p) {
      keep = i + 1;
      break;
    }
  }
  double total = 0.0;
  for (int64_t i = 0; i < keep; ++i) total += ps[i];
  double u = std::uniform_real_distribution<double>(0.0, total)(rng);
  for (int64_t i = 0; i < keep; ++i) {
    u -= ps[i];
    if (u <= 0) return static_cast<int32_t>(ids[i]);
  }
  return static_cast<int32_t>(ids[keep - 1]);
}

}  // namespace

EngineResult ModelEngine::run(const std::vector<int32_t>& prompt, const EngineParams& p,
                              const TokenCallback& on_token) {
  EngineResult r;
  if (p.max_tokens <= 0 && !p.prompt_logprobs) return r;
  std::lock_guard<std::mutex> lock(mutex_);
  torch::NoGradGuard no_grad;  // grad mode is per thread: every HTTP worker needs its own guard
  Decoder model = backend_.model();
  const auto T = static_cast<int64_t>(prompt.size());
  std::vector<int64_t> ids(prompt.begin(), prompt.end());
  auto tokens = torch::tensor(ids, torch::kInt64).view({1, T});
  torch::Tensor last;
  if (p.prompt_logprobs) {
    auto logp = log_probs(model->logits_from_hidden(model->hidden(tokens)[0]));
    r.prompt.push_back({});  // the first token has no context
    for (int64_t t = 1; t < T; ++t) r.prompt.push_back(entry(logp[t - 1], prompt[t], p.top_n));
    last = logp[T - 1];
  } else {
    // Only the last position, exactly as LocalBackend::score computes it.
    last = log_probs(model->logits_from_hidden(model->hidden_last(tokens)))[0];
  }
  std::mt19937_64 rng(p.seed);
  std::optional<Session> session;
  for (int step = 0; step < p.max_tokens; ++step) {
    const int32_t token = choose(last, p, rng);
    r.generated.push_back(token);
    if (p.top_n >= 0) r.completion.push_back(entry(last, token, p.top_n));
    ++generated_;
    if (on_token && !on_token(r)) break;
    if (step + 1 == p.max_tokens) break;
    if (!session) {
      // The streaming session only from the second token on: the first one comes from the
      // same forward as LocalBackend's scoring.
      session.emplace(model);
      ids.push_back(token);
      auto logits = session->feed(ids);
      last = log_probs(logits[logits.size(0) - 1]);
    } else {
      last = log_probs(session->decode(token));
    }
  }
  return r;
}

}  // namespace phasekv
