#include "v4/rope.h"

#include <algorithm>
#include <cmath>

namespace phasekv::v4 {

RopeParams layer_rope(const V4Config& cfg, int64_t layer) {
  RopeParams p;
  p.dims = cfg.qk_rope_head_dim;
  if (cfg.compress_ratios.at(layer) == 0) {
    p.base = static_cast<float>(cfg.rope_theta);
    return p;
  }
  p.base = static_cast<float>(cfg.compress_rope_theta);
  if (cfg.rope_scaling.enabled) {
    p.freq_scale = static_cast<float>(1.0 / cfg.rope_scaling.factor);
    p.ext_factor = 1.0f;
    p.n_ctx_orig = cfg.rope_scaling.original_max_position_embeddings;
    p.beta_fast = static_cast<float>(cfg.rope_scaling.beta_fast);
    p.beta_slow = static_cast<float>(cfg.rope_scaling.beta_slow);
  }
  return p;
}

namespace {

// YaRN's correction range in pair units (ggml_rope_yarn_corr_dims).
void yarn_corr_dims(const RopeParams& p, float dims[2]) {
  auto corr = [&](float n_rot) {
    return static_cast<float>(p.dims) *
           std::log(static_cast<float>(p.n_ctx_orig) / (n_rot * 2 * static_cast<float>(M_PI))) /
           (2 * std::log(p.base));
  };
  dims[0] = std::max(0.0f, std::floor(corr(p.beta_fast)));
  dims[1] = std::min(static_cast<float>(p.dims - 1), std::ceil(corr(p.beta_slow)));
}

}  // namespace

RopeTable rope_table(const RopeParams& p, const std::vector<int64_t>& pos,
                     torch::ScalarType dtype) {
  const int64_t half = p.dims / 2;
  auto cos = torch::empty({static_cast<int64_t>(pos.size()), half}, torch::kFloat32);
  auto sin = torch::empty_like(cos);
  float corr[2] = {0.0f, 0.0f};
  if (p.ext_factor != 0.0f) yarn_corr_dims(p, corr);
  const float theta_scale = std::pow(p.base, -2.0f / static_cast<float>(p.dims));
  // deepseek4.cpp passes attn_factor = 1 / (1 + 0.1 ln(1/s)) so that YaRN's magnitude factor
  // cancels: the rotation stays a pure rotation. The product is kept in float, as ggml has it.
  float mscale = 1.0f;
  if (p.ext_factor != 0.0f) mscale = 1.0f / (1.0f + 0.1f * std::log(1.0f / p.freq_scale));
  float* c = cos.data_ptr<float>();
  float* s = sin.data_ptr<float>();
  for (size_t t = 0; t < pos.size(); ++t) {
    float theta = static_cast<float>(pos[t]);
    for (int64_t i = 0; i < half; ++i) {
      const float extrap = theta;
      const float interp = p.freq_scale * extrap;
      float angle = interp, m = mscale;
      if (p.ext_factor != 0.0f) {
        const float y = (static_cast<float>(i) - corr[0]) / std::max(0.001f, corr[1] - corr[0]);
        const float ramp = (1 - std::min(1.0f, std::max(0.0f, y))) * p.ext_factor;
        angle = interp * (1 - ramp) + extrap * ramp;
        m *= 1.0f + 0.1f * std::log(1.0f / p.freq_scale);
      }
      c[t * half + i] = std::cos(angle) * m;
      s[t * half + i] = std::sin(angle) * m;
      theta *= theta_scale;
    }
  }
  return {cos.to(dtype), sin.to(dtype)};
}

torch::Tensor rope_apply(const torch::Tensor& x, const RopeTable& t, bool inverse,
                         int64_t pos_dim) {
  const int64_t rd = t.cos.size(1) * 2;
  if (rd == 0) return x;
  const int64_t hd = x.size(-1);
  std::vector<int64_t> shape(x.dim(), 1);
  shape[pos_dim] = t.cos.size(0);
  shape[x.dim() - 1] = rd / 2;
  auto cos = t.cos.view(shape);
  auto sin = inverse ? -t.sin.view(shape) : t.sin.view(shape);
  auto pairs = x.narrow(-1, hd - rd, rd).unflatten(-1, {rd / 2, 2});
  auto x0 = pairs.select(-1, 0), x1 = pairs.select(-1, 1);
  auto rotated = torch::stack({x0 * cos - x1 * sin, x0 * sin + x1 * cos}, -1).flatten(-2);
  return torch::cat({x.narrow(-1, 0, hd - rd), rotated}, -1);
}

}  // namespace phasekv::v4
