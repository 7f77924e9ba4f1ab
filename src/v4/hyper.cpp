#include "v4/hyper.h"

#include "model/fused.h"

namespace phasekv::v4 {

torch::Tensor rms_norm(const torch::Tensor& x, double eps, const torch::Tensor& weight) {
  auto y = x * torch::rsqrt(x.pow(2).mean(-1, true) + eps);
  return weight.defined() ? y * weight : y;
}

torch::Tensor hc_sinkhorn(const torch::Tensor& c, int64_t iters, double eps) {
  auto m = torch::softmax(c, -1) + eps;
  m = m / (m.sum(-2, true) + eps);
  for (int64_t i = 1; i < iters; ++i) {
    m = m / (m.sum(-1, true) + eps);
    m = m / (m.sum(-2, true) + eps);
  }
  return m;
}

namespace {
// The mixes read all streams at once: [T, hc*d] normalised without weight, then projected.
torch::Tensor hc_mixes(const torch::Tensor& x, const torch::Tensor& fn, double norm_eps) {
  auto flat = x.reshape({x.size(0), x.size(1) * x.size(2)});
  return torch::matmul(rms_norm(flat, norm_eps), fn.t());
}
}  // namespace

HcMix hc_mix(const torch::Tensor& x, const torch::Tensor& fn, const torch::Tensor& scale,
             const torch::Tensor& base, int64_t iters, double hc_eps, double norm_eps) {
  const int64_t hc = x.size(1);
  auto mixes = hc_mixes(x, fn, norm_eps);
  HcMix m;
  m.pre = torch::sigmoid(mixes.narrow(1, 0, hc) * scale[0] + base.narrow(0, 0, hc)) + hc_eps;
  m.post = 2.0 * torch::sigmoid(mixes.narrow(1, hc, hc) * scale[1] + base.narrow(0, hc, hc));
  auto comb = mixes.narrow(1, 2 * hc, hc * hc) * scale[2] + base.narrow(0, 2 * hc, hc * hc);
  m.comb = hc_sinkhorn(comb.view({x.size(0), hc, hc}), iters, hc_eps);
  return m;
}

torch::Tensor hc_reduce(const torch::Tensor& x, const torch::Tensor& pre) {
  return (x * pre.unsqueeze(-1)).sum(1);
}

torch::Tensor hc_expand(const torch::Tensor& out, const torch::Tensor& x, const HcMix& m) {
  // X'[t, dst] = post[t, dst] out[t] + sum_src comb[t, src, dst] X[t, src]. One [hc, hc] x
  // [hc, d] product per token: libtorch 1.13's bmm loops over the tokens with a select per
  // operand and per token (104K resolve_conj and 261K select calls per study-geometry step);
  // batched_matmul runs them as one call of the small-matrix kernel, backward included.
  return m.post.unsqueeze(-1) * out.unsqueeze(1) +
         batched_matmul(m.comb.transpose(1, 2), x, /*trans_b=*/false);
}

torch::Tensor hc_head(const torch::Tensor& x, const torch::Tensor& fn, const torch::Tensor& scale,
                      const torch::Tensor& base, double hc_eps, double norm_eps) {
  auto pre = torch::sigmoid(hc_mixes(x, fn, norm_eps) * scale[0] + base) + hc_eps;
  return hc_reduce(x, pre);
}

}  // namespace phasekv::v4
