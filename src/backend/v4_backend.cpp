#include "backend/v4_backend.h"

#include <algorithm>
#include <set>
#include <thread>

#include "backend/in_process.h"
#include "kernels/compute_threads.h"
#include "util/error.h"
#include "util/hash.h"
#include "v4/config.h"
#include "v4/model_dir.h"

namespace phasekv {

V4Backend::V4Backend(v4::V4Model model, std::optional<Tokenizer> tokenizer, std::string name,
                     int threads)
    : model_(std::move(model)),
      tokenizer_(std::move(tokenizer)),
      name_(std::move(name)),
      threads_(threads > 0 ? threads
                           : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()))) {
  if (tokenizer_ && tokenizer_->size() > model_.cfg.vocab_size)
    throw Error("model " + name_ + ": tokenizer.json has " + std::to_string(tokenizer_->size()) +
                " tokens but the model's vocab_size is " + std::to_string(model_.cfg.vocab_size));
  kernels::set_compute_threads(threads_);
}

V4Backend V4Backend::from_dir(const std::string& dir, int threads) {
  return V4Backend(v4::load_v4_dir(dir), load_tokenizer_if_present(dir), model_name_of_dir(dir),
                   threads);
}

std::string V4Backend::config_hash() const {
  return fnv1a64_hex(v4::config_to_json(model_.cfg).dump()).substr(0, 12);
}

std::string V4Backend::model_id() const {
  return name_ + "@" + config_hash();
}

std::vector<int32_t> V4Backend::tokenize(const std::string& text) {
  return encode_with(tokenizer_, name_, text);
}

std::string V4Backend::detokenize(const std::vector<int32_t>& ids) {
  return decode_with(tokenizer_, name_, ids);
}

int64_t V4Backend::max_context() const {
  return model_.cfg.max_position_embeddings;
}

torch::Tensor V4Backend::last_logprobs(const std::vector<int32_t>& context) const {
  torch::NoGradGuard no_grad;
  const torch::Tensor tokens =
      torch::tensor(std::vector<int64_t>(context.begin(), context.end()), torch::kInt64);
  const torch::Tensor logits = model_.forward(tokens);
  return torch::log_softmax(logits[logits.size(0) - 1].to(torch::kFloat64), -1).contiguous();
}

std::vector<ScoreResult> V4Backend::score(const std::vector<ScoreRequest>& requests) {
  std::vector<ScoreResult> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    ScoreResult& r = out[i];
    r.error = score_request_error(requests[i], model_.cfg.vocab_size, max_context());
    if (!r.error.empty()) continue;
    try {  // the interface promises per-request errors, never a throw that ends a sweep
      const torch::Tensor logp = last_logprobs(requests[i].context);
      const auto lp = logp.accessor<double, 1>();
      r.argmax = static_cast<int32_t>(logp.argmax().item<int64_t>());
      r.argmax_logprob = lp[r.argmax];
      r.target_logprob = lp[requests[i].target];
    } catch (const std::exception& e) {
      r.error = std::string("forward failed: ") + e.what();
    }
  }
  return out;
}

std::vector<Distribution> V4Backend::next_token_distributions(
    const std::vector<ScoreRequest>& requests) {
  std::vector<Distribution> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    out[i].error = score_request_error(requests[i], model_.cfg.vocab_size, max_context());
    if (!out[i].error.empty()) continue;
    try {
      const torch::Tensor p = last_logprobs(requests[i].context).exp().contiguous();
      out[i].probs.assign(p.data_ptr<double>(), p.data_ptr<double>() + p.numel());
    } catch (const std::exception& e) {
      out[i].error = std::string("forward failed: ") + e.what();
    }
  }
  return out;
}

std::vector<int32_t> V4Backend::generate(const std::vector<int32_t>& context, int max_tokens) {
  const std::string why = score_request_error({context, 0}, model_.cfg.vocab_size, max_context());
  if (!why.empty()) throw Error("generate: " + why);
  if (max_tokens <= 0) return {};
  torch::NoGradGuard no_grad;
  v4::V4Cache cache;
  torch::Tensor logits = model_.forward(
      torch::tensor(std::vector<int64_t>(context.begin(), context.end()), torch::kInt64), cache);
  std::vector<int32_t> out;
  for (int i = 0; i < max_tokens; ++i) {
    const auto token = static_cast<int32_t>(logits[logits.size(0) - 1].argmax().item<int64_t>());
    out.push_back(token);
    if (cache.n_tokens >= max_context()) break;  // the next step would exceed it
    if (i + 1 < max_tokens)
      logits = model_.forward(torch::tensor({static_cast<int64_t>(token)}, torch::kInt64), cache);
  }
  return out;
}

int V4Backend::model_stride() const {
  return v4::chunked_stride(model_.cfg);
}

nlohmann::json V4Backend::describe() const {
  const v4::V4Config& c = model_.cfg;
  std::set<int64_t> strides;
  for (int64_t r : c.compress_ratios)
    if (r > 0) strides.insert(r);
  const int stride = model_stride();
  std::string dtype = "f32";
  for (const torch::Tensor& p : model_.parameters()) {
    if (p.scalar_type() == torch::kBFloat16) dtype = "bf16";
    break;
  }
  return {{"backend", "local"},
          {"family", "deepseek_v4"},
          {"model_id", model_id()},
          {"config_hash", config_hash()},
          {"stride", stride > 0 ? nlohmann::json(stride) : nlohmann::json(nullptr)},
          {"strides", strides},
          {"compress_ratios", c.compress_ratios},
          {"vocab_size", c.vocab_size},
          {"max_context", max_context()},
          {"dtype", dtype},
          {"threads", threads_},
          {"tokenizer", tokenizer_ ? tokenizer_->kind() : "none"}};
}

}  // namespace phasekv
