// Building blocks of the Qwen3-style decoder: RMSNorm, rotary embedding, SwiGLU MLP.
#pragma once
#include <torch/torch.h>

namespace phasekv {

// RMSNorm over the last dimension with a learned scale (initialised to 1).
struct RMSNormImpl : torch::nn::Module {
  RMSNormImpl(int64_t dim, double eps);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor weight;
  double eps;
};
TORCH_MODULE(RMSNorm);

// Rotary embedding, NeoX layout (the rotated dims are split into two halves), applied to the first
// `rotary_dims` channels of each head; the rest pass through (partial RoPE).
class Rope {
 public:
  Rope(int64_t head_dim, int64_t rotary_dims, double theta);
  // x: [..., T, head_dim] with positions [T] (int64, absolute token positions).
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& positions) const;
  bool enabled() const { return rotary_dims_ > 0; }

 private:
  int64_t head_dim_, rotary_dims_;
  torch::Tensor inv_freq_;  // [rotary_dims / 2]
};

struct SwiGLUImpl : torch::nn::Module {
  SwiGLUImpl(int64_t d_model, int64_t d_ff);
  torch::Tensor forward(const torch::Tensor& x);
  torch::nn::Linear w_gate{nullptr}, w_up{nullptr}, w_down{nullptr};
};
TORCH_MODULE(SwiGLU);

torch::nn::Linear make_linear(int64_t in, int64_t out, bool bias = false);

}  // namespace phasekv
