#include "v4/model.h"

#include "util/error.h"
#include "v4/attention.h"
#include "v4/hyper.h"
#include "v4/moe.h"

namespace phasekv::v4 {

V4Model::V4Model(V4Config c) : cfg(std::move(c)) {
  for (const TensorSpec& s : tensor_specs(cfg))
    tensors[s.name] =
        torch::zeros(s.shape, s.init == Init::kHashTable ? torch::kInt64 : torch::kFloat32);
}

namespace {

void fill(torch::Tensor& t, Init init, at::Generator& gen, int64_t n_experts) {
  switch (init) {
    case Init::kLinear:
      t.normal_(0.0, 1.0 / std::sqrt(static_cast<double>(t.size(1))), gen);
      break;
    case Init::kEmbed:
    case Init::kSmall:
      t.normal_(0.0, 0.5, gen);
      break;
    case Init::kNorm:
      t.normal_(1.0, 0.1, gen);
      break;
    case Init::kHcScale:
      t.uniform_(0.5, 1.0, gen);
      break;
    case Init::kSink:
      t.normal_(0.0, 1.0, gen);
      break;
    case Init::kHashTable:
      // Distinct experts per token, as a routing table must have.
      for (int64_t v = 0; v < t.size(0); ++v)
        t[v].copy_(torch::randperm(n_experts, gen, torch::kInt64).narrow(0, 0, t.size(1)));
      break;
  }
}

}  // namespace

void V4Model::init_random(uint64_t seed) {
  torch::NoGradGuard no_grad;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  for (const TensorSpec& s : tensor_specs(cfg)) {
    auto& t = tensors.at(s.name);
    auto f32 = torch::empty(s.shape, s.init == Init::kHashTable ? torch::kInt64 : torch::kFloat32);
    fill(f32, s.init, gen, cfg.n_routed_experts);
    t.copy_(f32);
  }
}

std::vector<torch::Tensor> V4Model::parameters() const {
  std::vector<torch::Tensor> out;
  for (const auto& [name, t] : tensors)
    if (t.is_floating_point()) out.push_back(t);
  return out;
}

void V4Model::to(torch::ScalarType dtype) {
  for (auto& [name, t] : tensors)
    if (t.is_floating_point()) t = t.detach().to(dtype);
}

torch::Tensor V4Model::forward(const torch::Tensor& tokens) const {
  V4Cache cache;
  return forward(tokens, cache);
}

void V4Model::check_tokens(const torch::Tensor& tokens, int64_t dims) const {
  if (tokens.dim() != dims || tokens.scalar_type() != torch::kInt64)
    throw Error(dims == 1 ? "v4 forward: tokens must be a 1-D int64 tensor"
                          : "v4 forward_batch: tokens must be a 2-D int64 tensor [B, T]");
  if (tokens.numel() > 0 &&
      (tokens.min().item<int64_t>() < 0 || tokens.max().item<int64_t>() >= cfg.vocab_size))
    throw Error("v4 forward: token ids must lie in [0, " + std::to_string(cfg.vocab_size) + ")");
}

torch::Tensor V4Model::forward_batch(const torch::Tensor& tokens,
                                     std::vector<torch::Tensor>* loads) const {
  check_tokens(tokens, 2);
  const TensorMap& w = tensors;
  const double eps = cfg.rms_norm_eps;
  const int64_t B = tokens.size(0), T = tokens.size(1), d = cfg.hidden_size;
  const torch::Tensor flat = tokens.reshape({B * T});
  if (loads) loads->assign(static_cast<size_t>(cfg.num_hidden_layers), torch::Tensor());
  auto x =
      get(w, "embed.weight").index_select(0, flat).unsqueeze(1).expand({B * T, cfg.hc_mult, d});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    auto mix =
        hc_mix(x, get(w, layer_name(i, "hc_attn_fn")), get(w, layer_name(i, "hc_attn_scale")),
               get(w, layer_name(i, "hc_attn_base")), cfg.hc_sinkhorn_iters, cfg.hc_eps, eps);
    auto y = rms_norm(hc_reduce(x, mix.pre), eps, get(w, layer_name(i, "attn_norm.weight")));
    x = hc_expand(attention_forward_batch(cfg, w, i, y.view({B, T, d})).reshape({B * T, d}), x,
                  mix);
    mix = hc_mix(x, get(w, layer_name(i, "hc_ffn_fn")), get(w, layer_name(i, "hc_ffn_scale")),
                 get(w, layer_name(i, "hc_ffn_base")), cfg.hc_sinkhorn_iters, cfg.hc_eps, eps);
    y = rms_norm(hc_reduce(x, mix.pre), eps, get(w, layer_name(i, "ffn_norm.weight")));
    x = hc_expand(moe_forward(cfg, w, i, y, flat, loads ? &(*loads)[i] : nullptr), x, mix);
  }
  auto out = hc_head(x, get(w, "hc_head_fn"), get(w, "hc_head_scale"), get(w, "hc_head_base"),
                     cfg.hc_eps, eps);
  out = rms_norm(out, eps, get(w, "norm.weight"));
  return torch::matmul(out, get(w, "head.weight").t()).view({B, T, cfg.vocab_size});
}

torch::Tensor V4Model::forward(const torch::Tensor& tokens, V4Cache& cache) const {
  check_tokens(tokens, 1);
  const TensorMap& w = tensors;
  const double eps = cfg.rms_norm_eps;
  const int64_t T = tokens.size(0), p0 = cache.n_tokens;
  cache.layers.resize(cfg.num_hidden_layers);
  cache.expert_load.resize(cfg.num_hidden_layers);
  auto h = get(w, "embed.weight").index_select(0, tokens);
  auto x = h.unsqueeze(1).expand({T, cfg.hc_mult, cfg.hidden_size});
  for (int64_t i = 0; i < cfg.num_hidden_layers; ++i) {
    auto mix =
        hc_mix(x, get(w, layer_name(i, "hc_attn_fn")), get(w, layer_name(i, "hc_attn_scale")),
               get(w, layer_name(i, "hc_attn_base")), cfg.hc_sinkhorn_iters, cfg.hc_eps, eps);
    auto y = rms_norm(hc_reduce(x, mix.pre), eps, get(w, layer_name(i, "attn_norm.weight")));
    x = hc_expand(attention_forward(cfg, w, i, y, p0, cache.layers[i]), x, mix);
    mix = hc_mix(x, get(w, layer_name(i, "hc_ffn_fn")), get(w, layer_name(i, "hc_ffn_scale")),
                 get(w, layer_name(i, "hc_ffn_base")), cfg.hc_sinkhorn_iters, cfg.hc_eps, eps);
    y = rms_norm(hc_reduce(x, mix.pre), eps, get(w, layer_name(i, "ffn_norm.weight")));
    x = hc_expand(moe_forward(cfg, w, i, y, tokens, &cache.expert_load[i]), x, mix);
  }
  auto out = hc_head(x, get(w, "hc_head_fn"), get(w, "hc_head_scale"), get(w, "hc_head_base"),
                     cfg.hc_eps, eps);
  out = rms_norm(out, eps, get(w, "norm.weight"));
  cache.n_tokens += T;
  return torch::matmul(out, get(w, "head.weight").t());
}

}  // namespace phasekv::v4
