// DeepSeek-V4's KV compressor: every `ratio` tokens become one entry.
//   kv_t = W_kv y_t,  g_t = W_gate y_t + ape[t mod ratio]          (per channel)
//   entry_b = RoPE_{b ratio}( RMSNorm( sum_slots softmax_slots(g) (.) kv ) )
// Block b holds tokens [b ratio, (b+1) ratio). With overlap (ratio 4) the maps are twice as wide
// and an entry pools 2 ratio slots: the first half of the channels of the previous block's tokens
// (zero values, -inf gates for block 0: an empty previous half) and the second half of its own
// tokens. Entry b is rotated at its block's start position b ratio and becomes visible from the
// token that completes the block, t = (b+1) ratio - 1 (llama.cpp: n_visible = (t+1) / ratio).
//
// Precision: llama.cpp with an f32 cache keeps the entries in f32, and so does phasekv (the engine
// it is compared with); DeepSeek's reference code stores its caches in low precision.
//
// The state is kept as a cache so that the full forward and streaming are one code path: the
// full forward is one append to an empty cache. Between appends the cache holds the projected
// rows of the block in progress (and, with overlap, of the block before it, whose first lane the
// next entry still reads) and every entry pooled so far.
#pragma once
#include <torch/torch.h>

#include "v4/rope.h"

namespace phasekv::v4 {

struct CompressorWeights {
  torch::Tensor wkv, wgate;  // [lanes * width, d]
  torch::Tensor ape;         // [ratio, lanes * width]
  torch::Tensor norm;        // [width]
};

struct CompressorCache {
  torch::Tensor kv, gate;  // [rows, lanes * width]: positions [start, start + rows)
  int64_t start = 0;
  torch::Tensor entries;  // [n, width]: blocks [0, n), all complete
  int64_t n_entries() const { return entries.defined() ? entries.size(0) : 0; }
};

// Appends the tokens y [n, d] at positions [p0, p0 + n) (p0 = the tokens appended so far) and
// pools every block they complete.
void compress_append(CompressorCache& cache, const torch::Tensor& y, int64_t p0,
                     const CompressorWeights& w, int64_t ratio, bool overlap,
                     const RopeParams& rope, double norm_eps);

// The entries of the complete blocks of y [T, d] (positions 0..T-1): [T / ratio, width].
torch::Tensor compress_entries(const torch::Tensor& y, const CompressorWeights& w, int64_t ratio,
                               bool overlap, const RopeParams& rope, double norm_eps);
// The same for B sequences at once, y [B, T, d] -> [B, T / ratio, width]: every block pooled in
// one pass, without a cache (the training forward; compress_entries is this with B = 1).
torch::Tensor compress_entries_batch(const torch::Tensor& y, const CompressorWeights& w,
                                     int64_t ratio, bool overlap, const RopeParams& rope,
                                     double norm_eps);

// [n_tokens, n] bool: entry j visible to the token at position p0 + i iff j < (p0 + i + 1) / ratio.
torch::Tensor entry_visible(int64_t p0, int64_t n_tokens, int64_t n, int64_t ratio);

}  // namespace phasekv::v4
