// DeepSeek-V4's rotary embedding: interleaved pairs (x[2i], x[2i+1]) on the LAST rope_dims of each
// head (the first head_dim - rope_dims dims carry no position), as llama.cpp's GGML_ROPE_TYPE_NORM
// with ggml_rope_set_offset computes it. The compressed layers use compress_rope_theta and YaRN
// (when rope_scaling is set); the sliding-window layers rope_theta without scaling.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "v4/config.h"

namespace phasekv::v4 {

struct RopeParams {
  int64_t dims = 0;  // rotated dims (qk_rope_head_dim)
  float base = 10000.0f;
  float freq_scale = 1.0f;  // 1 / rope_scaling.factor
  float ext_factor = 0.0f;  // 1 with YaRN
  int64_t n_ctx_orig = 0;
  float beta_fast = 0.0f, beta_slow = 0.0f;
};

// The RoPE of layer `layer`'s queries, keys, compressed entries and indexer queries.
RopeParams layer_rope(const V4Config& cfg, int64_t layer);

// cos and sin, each [P, dims/2], for positions `pos`, computed in float exactly as ggml's CPU rope
// cache does (the angle by repeated multiplication, YaRN's ramp, the magnitude factor that
// deepseek4.cpp cancels), so that phasekv and llama.cpp rotate by the same float angles.
struct RopeTable {
  torch::Tensor cos, sin;
};
RopeTable rope_table(const RopeParams& p, const std::vector<int64_t>& pos, torch::ScalarType dtype);

// Rotates x [P, ..., head_dim] (positions along dim 0, or along `pos_dim`: [B, P, ...] for a
// batch of sequences) on its last p.dims dims; `inverse` rotates back (ggml_rope_ext_back), which
// DeepSeek-V4 applies to the attention output.
torch::Tensor rope_apply(const torch::Tensor& x, const RopeTable& t, bool inverse = false,
                         int64_t pos_dim = 0);

}  // namespace phasekv::v4
