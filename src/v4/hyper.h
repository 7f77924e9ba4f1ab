// Hyper-connections (manifold-constrained, as DeepSeek-V4 has them): the residual stream is
// hc_mult parallel streams X [T, hc, d]. Before each block a learned mix, computed from the
// weightless RMS norm of all streams together, gives
//   pre  = sigmoid(m_pre * s0 + b_pre) + eps          [T, hc]  reads one input for the block,
//   post = 2 sigmoid(m_post * s1 + b_post)            [T, hc]  spreads its output back,
//   comb = Sinkhorn(m_comb * s2 + b_comb)             [T, hc(src), hc(dst)]  mixes the streams,
// and after the block X' = post (x) out + comb^T X. The output head mixes the streams once more
// with pre-style weights only.
#pragma once
#include <torch/torch.h>

namespace phasekv::v4 {

// Row softmax (over dst), +eps, one column normalisation, then (iters - 1) rounds of row and
// column normalisation, each sum +eps: the order of DeepSeek's reference and llama.cpp's
// build_hc_sinkhorn. c: [..., src, dst].
torch::Tensor hc_sinkhorn(const torch::Tensor& c, int64_t iters, double eps);

struct HcMix {
  torch::Tensor pre, post, comb;  // [T, hc], [T, hc], [T, hc, hc]
};

// fn [mix, hc*d], base [mix], scale [3]; norm_eps is the model's rms_norm_eps.
HcMix hc_mix(const torch::Tensor& x, const torch::Tensor& fn, const torch::Tensor& scale,
             const torch::Tensor& base, int64_t iters, double hc_eps, double norm_eps);
// sum_h pre[:, h] X[:, h, :] -> [T, d]
torch::Tensor hc_reduce(const torch::Tensor& x, const torch::Tensor& pre);
// post (x) out + comb^T X -> [T, hc, d]
torch::Tensor hc_expand(const torch::Tensor& out, const torch::Tensor& x, const HcMix& m);
// The output head's mix: fn [hc, hc*d], base [hc], scale [1] -> [T, d].
torch::Tensor hc_head(const torch::Tensor& x, const torch::Tensor& fn, const torch::Tensor& scale,
                      const torch::Tensor& base, double hc_eps, double norm_eps);

// x * rsqrt(mean(x^2) + eps) over the last dim (ggml_rms_norm; times `weight` when defined).
torch::Tensor rms_norm(const torch::Tensor& x, double eps,
                       const torch::Tensor& weight = torch::Tensor());

}  // namespace phasekv::v4
