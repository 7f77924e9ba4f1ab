// DeepSeek-V4's mixture of experts, one layer.
//   s = sqrt(softplus(W_gate y))                                  [T, E] affinities
//   experts: the top num_experts_per_tok of s + bias (bias only selects), or on the first
//            num_hash_layers layers the token's row of the tid2eid table
//   weights: s of the chosen experts, divided by their sum (norm_topk_prob; the sum clamped below
//            at 2^-14 as llama.cpp does), times routed_scaling_factor
//   out = sum_k weight_k E_k(y) + shared(y),  E(y) = W2 (silu(min(W1 y, L)) * clamp(W3 y, -L, L))
// with L = swiglu_limit on the routed and the shared experts (llama.cpp's converter writes the
// same limit for both).
#pragma once
#include <torch/torch.h>

#include "v4/config.h"
#include "v4/weights.h"

namespace phasekv::v4 {

struct Routing {
  torch::Tensor experts;  // [T, k] int64
  torch::Tensor weights;  // [T, k]
};

// y [T, d], tokens [T] int64.
Routing moe_route(const V4Config& cfg, const TensorMap& w, int64_t layer, const torch::Tensor& y,
                  const torch::Tensor& tokens);
// `load`, when given, gets each expert's count of (token, slot) assignments added ([E] int64):
// what the routing-bias update balances.
torch::Tensor moe_forward(const V4Config& cfg, const TensorMap& w, int64_t layer,
                          const torch::Tensor& y, const torch::Tensor& tokens,
                          torch::Tensor* load = nullptr);
// The clamped SwiGLU feed-forward, prefix "layers.{i}.ffn.experts.{e}." or "...shared_experts.".
torch::Tensor swiglu_ffn(const TensorMap& w, const std::string& prefix, const torch::Tensor& y,
                         double limit);

}  // namespace phasekv::v4
