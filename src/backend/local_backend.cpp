#include "backend/local_backend.h"

#include <algorithm>
#include <map>
#include <set>
#include <thread>

#include "backend/in_process.h"
#include "kernels/compute_threads.h"
#include "model/model_dir.h"
#include "runtime/session.h"
#include "util/error.h"

namespace phasekv {
namespace {

std::string dtype_name(const Decoder& model) {
  for (const auto& p : model->parameters())
    return p.scalar_type() == torch::kBFloat16 ? "bf16" : "f32";
  return "f32";
}

}  // namespace

LocalBackend::LocalBackend(Decoder model, std::optional<Tokenizer> tokenizer, std::string name,
                           int threads, int batch_size)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      name_(std::move(name)),
      threads_(threads > 0 ? threads
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))),
      batch_size_(batch_size) {
  if (batch_size_ < 1)
    throw Error("batch size is " + std::to_string(batch_size) + " (allowed: >= 1)");
  if (tokenizer_ && tokenizer_->size() > model_->cfg.vocab_size)
    throw Error("model " + name_ + ": tokenizer.json has " + std::to_string(tokenizer_->size()) +
                " tokens but the model's vocab_size is " + std::to_string(model_->cfg.vocab_size));
  // Debian's libtorch defaults to one thread; the setting is process-wide.
  kernels::set_compute_threads(threads_);
  model_->eval();
}

LocalBackend LocalBackend::from_dir(const std::string& dir, int threads, int batch_size) {
  Decoder model = load_model_dir(dir);
  return LocalBackend(model, load_tokenizer_if_present(dir), model_name_of_dir(dir), threads, batch_size);
}

std::string LocalBackend::model_id() const {
  return name_ + "@" + config_hash(model_->cfg);
}

std::vector<int32_t> LocalBackend::tokenize(const std::string& text) {
  return encode_with(tokenizer_, name_, text);
}

std::string LocalBackend::detokenize(const std::vector<int32_t>& ids) {
  return decode_with(tokenizer_, name_, ids);
}

int64_t LocalBackend::max_context() const {
  return model_->cfg.max_context;
}

std::string LocalBackend::request_error(const ScoreRequest& r) const {
  return score_request_error(r, model_->cfg.vocab_size, max_context());
}

torch::Tensor LocalBackend::last_logprobs(const std::vector<ScoreRequest>& requests,
                                          const std::vector<size_t>& group,
                                          std::vector<AttentionProbe>* probes) {
  const int64_t B = static_cast<int64_t>(group.size());
  const int64_t T = static_cast<int64_t>(requests[group.front()].context.size());
  auto tokens = torch::empty({B, T}, torch::kInt64);
  auto acc = tokens.accessor<int64_t, 2>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) acc[b][t] = requests[group[b]].context[t];
  torch::NoGradGuard no_grad;
  // Only the last position is scored: the LM head on [B, V] instead of [B, T, V], and without
  // probes the last layer runs for that position alone.
  auto last = probes && !probes->empty() ? model_->hidden(tokens, probes).select(1, T - 1)
                                         : model_->hidden_last(tokens);
  // float64 so that a target far down the distribution keeps its exact log-probability.
  return torch::log_softmax(model_->logits_from_hidden(last).to(torch::kFloat64), -1).contiguous();
}

std::vector<std::string> LocalBackend::for_each_group(const std::vector<ScoreRequest>& requests,
                                                      std::vector<AttentionProbe>* probes,
                                                      const GroupUse& use) {
  std::vector<std::string> errors(requests.size());
  std::map<size_t, std::vector<size_t>> by_length;  // length -> request indices, in order
  for (size_t i = 0; i < requests.size(); ++i) {
    errors[i] = request_error(requests[i]);
    if (errors[i].empty()) by_length[requests[i].context.size()].push_back(i);
  }
  for (const auto& [length, indices] : by_length) {
    for (size_t start = 0; start < indices.size(); start += static_cast<size_t>(batch_size_)) {
      const size_t end = std::min(indices.size(), start + static_cast<size_t>(batch_size_));
      const std::vector<size_t> group(indices.begin() + static_cast<long>(start),
                                      indices.begin() + static_cast<long>(end));
      // The interface promises per-request errors, never a throw that ends a sweep.
      try {
        use(group, last_logprobs(requests, group, probes));
      } catch (const std::exception& e) {
        for (size_t i : group) errors[i] = std::string("forward failed: ") + e.what();
      }
    }
  }
  return errors;
}

std::vector<ScoreResult> LocalBackend::score(const std::vector<ScoreRequest>& requests) {
  return score(requests, nullptr);
}

std::vector<ScoreResult> LocalBackend::score(const std::vector<ScoreRequest>& requests,
                                             std::vector<AttentionProbe>* probes) {
  std::vector<ScoreResult> out(requests.size());
  const auto errors = for_each_group(requests, probes, [&](const std::vector<size_t>& group,
                                                           const torch::Tensor& logp) {
    auto argmax = logp.argmax(-1).contiguous();
    auto lp = logp.accessor<double, 2>();
    auto am = argmax.accessor<int64_t, 1>();
    for (size_t b = 0; b < group.size(); ++b) {
      ScoreResult& r = out[group[b]];
      r.argmax = static_cast<int32_t>(am[b]);
      r.argmax_logprob = lp[b][am[b]];
      r.target_logprob = lp[b][requests[group[b]].target];
    }
  });
  for (size_t i = 0; i < out.size(); ++i) out[i].error = errors[i];
  return out;
}

std::vector<Distribution> LocalBackend::next_token_distributions(
    const std::vector<ScoreRequest>& requests) {
  std::vector<Distribution> out(requests.size());
  const auto errors = for_each_group(requests, nullptr, [&](const std::vector<size_t>& group,
                                                            const torch::Tensor& logp) {
    const torch::Tensor probs = logp.exp().contiguous();
    const double* p = probs.data_ptr<double>();
    const int64_t V = probs.size(1);
    for (size_t b = 0; b < group.size(); ++b)
      out[group[b]].probs.assign(p + static_cast<int64_t>(b) * V,
                                 p + static_cast<int64_t>(b + 1) * V);
  });
  for (size_t i = 0; i < out.size(); ++i) {
    out[i].error = errors[i];
    if (!errors[i].empty()) out[i].probs.clear();
  }
  return out;
}

std::vector<int32_t> LocalBackend::generate(const std::vector<int32_t>& context, int max_tokens) {
  const std::string why = request_error({context, 0});
  if (!why.empty()) throw Error("generate: " + why);
  if (max_tokens <= 0) return {};
  Session session(model_);
  std::vector<int64_t> prompt(context.begin(), context.end());
  auto logits = session.feed(prompt);
  auto next = logits[logits.size(0) - 1];
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const auto token = static_cast<int32_t>(next.argmax().item<int64_t>());
    out.push_back(token);
    if (session.position() >= max_context()) break;  // the next step would exceed it
    if (i + 1 < max_tokens) next = session.decode(token);
  }
  return out;
}

int LocalBackend::model_stride() const { return chunked_stride(model_->cfg); }

nlohmann::json LocalBackend::describe() const {
  const ModelConfig& c = model_->cfg;
  std::set<int> strides;
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& a : c.layers) {
    layers.push_back(phasekv::describe(a));
    if (a.kind == AttentionKind::kChunked) strides.insert(a.stride);
  }
  const int stride = model_stride();
  return {{"backend", "local"},
          {"model_id", model_id()},
          {"config_hash", config_hash(c)},
          {"stride", stride > 0 ? nlohmann::json(stride) : nlohmann::json(nullptr)},
          {"strides", strides},
          {"layers", layers},
          {"vocab_size", c.vocab_size},
          {"max_context", c.max_context},
          {"dtype", dtype_name(model_)},
          {"threads", threads_},
          {"batch_size", batch_size_},
          {"tokenizer", tokenizer_ ? tokenizer_->kind() : "none"}};
}

}  // namespace phasekv
