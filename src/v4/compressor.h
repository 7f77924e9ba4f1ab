// DeepSeek-V4's KV compressor: every `ratio` tokens become one entry.
//   kv_t = W_kv y_t,  g_t = W_gate y_t + ape[t mod ratio]          (per channel)
//   entry_b = RoPE_{b ratio}( RMSNorm( sum_slots softmax_slots(g) (.) kv ) )
// Block b holds tokens [b ratio, (b+1) ratio). With overlap (ratio 4) the maps are twice as wide
// and an entry pools 2 ratio slots: the first half of the channels of the previous block's tokens
// (zero values, -inf gates for block 0: an empty previous half) and the second half of its own
// tokens. Entry b is rotated at its block's start position b ratio and becomes visible from the
// token that completes the block, t = (b+1) ratio - 1 (llama.cpp: n_visible = (t+1) / ratio).
#pragma once
#include <torch/torch.h>

#include "v4/rope.h"

namespace phasekv::v4 {

struct CompressorWeights {
  torch::Tensor wkv, wgate;  // [lanes * width, d]
  torch::Tensor ape;         // [ratio, lanes * width]
  torch::Tensor norm;        // [width]
};

// y [T, d] -> the entries of the complete blocks, [T / ratio, width].
torch::Tensor compress_entries(const torch::Tensor& y, const CompressorWeights& w, int64_t ratio,
                               bool overlap, const RopeParams& rope, double norm_eps);

// [T, n] bool: entry j visible to token t iff j < (t + 1) / ratio.
torch::Tensor entry_visible(int64_t T, int64_t n, int64_t ratio);

}  // namespace phasekv::v4
