// DeepSeek-V4's attention, one layer, for tokens at positions [p0, p0 + n) after the p0 tokens
// its cache holds (the full forward: p0 = 0 and an empty cache).
//   q    = RMSNorm_h( W_qb RMSNorm(W_qa y) )            per head, weightless; [T, H, hd]
//   kv   = RMSNorm(W_kv y)                               one KV head, K = V; [T, hd]
//   q, kv rotated at their positions (last rd dims, interleaved pairs)
//   keys = the raw kv of the window (0 <= t - s < sliding_window), then, on a compressed layer,
//          the compressor's entries visible to t (and, at ratio 4, picked by the indexer)
//   o_h  = softmax over keys and the head's sink of (q_h . k / sqrt(hd)), times the same keys
//   o_h rotated back at t (the values carry the keys' rotation), heads split in o_groups groups,
//   each projected by its block of wo_a to o_lora_rank dims, then wo_b.
#pragma once
#include <torch/torch.h>

#include "v4/compressor.h"
#include "v4/config.h"
#include "v4/weights.h"

namespace phasekv::v4 {

// What a layer keeps between calls: the raw kv of the last sliding_window - 1 tokens (all a later
// token can see) and the compressors' state (compressor.h).
struct AttentionCache {
  torch::Tensor raw_kv;  // [rows, hd], rotated: positions [raw_start, raw_start + rows)
  int64_t raw_start = 0;
  CompressorCache entries, index_keys;
};

// y [n, d] (the normed block input at positions [p0, p0 + n)) -> [n, d]; appends to `cache`.
torch::Tensor attention_forward(const V4Config& cfg, const TensorMap& w, int64_t layer,
                                const torch::Tensor& y, int64_t p0, AttentionCache& cache);

// The full forward of B sequences at once (positions 0..T-1 each, no cache): y [B, T, d] ->
// [B, T, d], equal to attention_forward on each row up to the rounding of batched matmuls. The
// training path: one set of batched ops instead of one per sequence.
torch::Tensor attention_forward_batch(const V4Config& cfg, const TensorMap& w, int64_t layer,
                                      const torch::Tensor& y);

// The indexer of a ratio-4 layer: which of the n entries each token attends to, [n_tokens, n]
// bool (`visible` says which it may; `keys` is the indexer's own compressor cache). score(t, j) =
// sum_h relu(q_h(t) . k_j) w_h(t), w = W_proj y / sqrt(IH Id); the top min(index_topk, n) scores
// among the visible entries are kept, ties to the lower index. qr: the query latent RMSNorm(W_qa y)
// [T, q_lora_rank]. Selection carries no gradient (it is a choice).
torch::Tensor indexer_select(const V4Config& cfg, const TensorMap& w, int64_t layer,
                             const torch::Tensor& y, const torch::Tensor& qr, int64_t p0,
                             const torch::Tensor& visible, CompressorCache& keys);

}  // namespace phasekv::v4
