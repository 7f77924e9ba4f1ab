#include "model/layers.h"

#include "model/fused.h"

namespace phasekv {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) { return rms_norm(x, weight, eps); }

Rope::Rope(int64_t head_dim, int64_t rotary_dims, double theta)
    : head_dim_(head_dim), rotary_dims_(rotary_dims) {
  if (rotary_dims_ > 0) {
    auto i = torch::arange(0, rotary_dims_, 2, torch::kFloat64);
    inv_freq_ = torch::pow(theta, -i / static_cast<double>(rotary_dims_));
  }
}

torch::Tensor Rope::apply(const torch::Tensor& x, const torch::Tensor& positions) const {
  if (rotary_dims_ == 0) return x;
  TORCH_CHECK(x.dim() >= 2 && x.size(-2) == positions.size(0) && x.size(-1) == head_dim_,
              "rope: x ", x.sizes(), " needs [..., ", positions.size(0), ", ", head_dim_, "]");
  // Angles in f64 so that positions of 64K+ keep their precision.
  auto ang = positions.to(torch::kFloat64).unsqueeze(-1) * inv_freq_.unsqueeze(0);  // [T, rd/2]
  return rope_rotate(x, torch::cos(ang), torch::sin(ang));
}

torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias) {
  return torch::nn::Linear(torch::nn::LinearOptions(in, out).bias(bias));
}

SwiGLUImpl::SwiGLUImpl(int64_t d_model, int64_t d_ff) {
  w_gate = register_module("w_gate", make_linear(d_model, d_ff));
  w_up = register_module("w_up", make_linear(d_model, d_ff));
  w_down = register_module("w_down", make_linear(d_ff, d_model));
}

torch::Tensor SwiGLUImpl::forward(const torch::Tensor& x) {
  return linear(swiglu(linear(x, w_gate), linear(x, w_up)), w_down);
}

}  // namespace phasekv
