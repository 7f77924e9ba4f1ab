#include "v4/moe.h"

namespace phasekv::v4 {

torch::Tensor swiglu_ffn(const TensorMap& w, const std::string& prefix, const torch::Tensor& y,
                         double limit) {
  auto gate = torch::matmul(y, get(w, prefix + "w1.weight").t());
  auto up = torch::matmul(y, get(w, prefix + "w3.weight").t());
  if (limit > 1e-6) {  // llama.cpp applies no clamp at a limit of 0
    gate = gate.clamp_max(limit);
    up = up.clamp(-limit, limit);
  }
  return torch::matmul(torch::silu(gate) * up, get(w, prefix + "w2.weight").t());
}

Routing moe_route(const V4Config& c, const TensorMap& w, int64_t layer, const torch::Tensor& y,
                  const torch::Tensor& tokens) {
  auto logits = torch::matmul(y, get(w, layer_name(layer, "ffn.gate.weight")).t());
  auto scores = torch::sqrt(torch::softplus(logits));
  Routing r;
  if (layer < c.num_hash_layers) {
    r.experts = get(w, layer_name(layer, "ffn.gate.tid2eid")).index_select(0, tokens);
  } else {
    torch::NoGradGuard no_grad;
    auto biased = scores + get(w, layer_name(layer, "ffn.gate.bias"));
    r.experts = std::get<1>(biased.topk(c.num_experts_per_tok, 1));
  }
  r.weights = scores.gather(1, r.experts);
  if (c.norm_topk_prob) r.weights = r.weights / r.weights.sum(1, true).clamp_min(6.103515625e-5);
  // llama.cpp skips a scale of 0 (as "unset"); so does phasekv.
  if (c.routed_scaling_factor != 0.0) r.weights = r.weights * c.routed_scaling_factor;
  return r;
}

torch::Tensor moe_forward(const V4Config& c, const TensorMap& w, int64_t layer,
                          const torch::Tensor& y, const torch::Tensor& tokens,
                          torch::Tensor* load) {
  const Routing r = moe_route(c, w, layer, y, tokens);
  if (load) {
    auto counts = torch::bincount(r.experts.flatten(), {}, c.n_routed_experts);
    *load = load->defined() ? *load + counts : counts;
  }
  auto out = torch::zeros_like(y);
  for (int64_t e = 0; e < c.n_routed_experts; ++e) {
    auto chosen = r.experts == e;  // [T, k]
    auto rows = chosen.any(1).nonzero().squeeze(1);
    if (rows.numel() == 0) continue;
    auto weight = (r.weights * chosen).sum(1).index_select(0, rows).unsqueeze(1);
    const std::string prefix = layer_name(layer, "ffn.experts." + std::to_string(e) + ".");
    auto contrib = swiglu_ffn(w, prefix, y.index_select(0, rows), c.swiglu_limit) * weight;
    out = out.index_add(0, rows, contrib);
  }
  if (c.n_shared_experts > 0)
    out = out + swiglu_ffn(w, layer_name(layer, "ffn.shared_experts."), y, c.swiglu_limit);
  return out;
}

}  // namespace phasekv::v4
