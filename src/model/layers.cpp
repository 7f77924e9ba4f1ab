#include "model/layers.h"

namespace phasekv {

RMSNormImpl::RMSNormImpl(int64_t dim, double eps_) : eps(eps_) {
  weight = register_parameter("weight", torch::ones({dim}));
}

torch::Tensor RMSNormImpl::forward(const torch::Tensor& x) {
  // Normalise in at least f32 when x is bf16: the mean of squares loses too much precision
  // otherwise. f64 (gradient checks) stays f64.
  auto compute = x.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto xf = x.to(compute);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (y * weight.to(compute)).to(x.scalar_type());
}

Rope::Rope(int64_t head_dim, int64_t rotary_dims, double theta)
    : head_dim_(head_dim), rotary_dims_(rotary_dims) {
  if (rotary_dims_ > 0) {
    auto i = torch::arange(0, rotary_dims_, 2, torch::kFloat64);
    inv_freq_ = torch::pow(theta, -i / static_cast<double>(rotary_dims_));
  }
}

torch::Tensor Rope::apply(const torch::Tensor& x, const torch::Tensor& positions) const {
  if (rotary_dims_ == 0) return x;
  // Angles in f64 so that positions of 64K+ keep their precision, then cast to x's dtype.
  auto ang = positions.to(torch::kFloat64).unsqueeze(-1) * inv_freq_.unsqueeze(0);  // [T, rd/2]
  auto cos = torch::cos(ang).to(x.scalar_type());
  auto sin = torch::sin(ang).to(x.scalar_type());
  int64_t half = rotary_dims_ / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  if (rotary_dims_ == head_dim_) return rotated;
  return torch::cat({rotated, x.narrow(-1, rotary_dims_, head_dim_ - rotary_dims_)}, -1);
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
  return w_down(torch::silu(w_gate(x)) * w_up(x));
}

}  // namespace phasekv
