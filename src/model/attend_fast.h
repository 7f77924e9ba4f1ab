// The fast attention core for the training forward (queries and raw keys are the whole sequence
// 0..T-1). Same contract and results as attend_reference, without the [T, E + T] scores or masks:
//
//  - compressed entries: [T, E] scores (E = T/S), masked by the entry-visibility rule;
//  - raw keys: every visible raw token of query t lies in one band [t - w + 1, t] (the sliding
//    window, and the uncompressed tail, which starts at S*floor((t+1)/S) > t - S + 1). Queries are
//    cut into blocks of Bq rows; block b only needs the Bq + w - 1 keys ending at its last row, so
//    the band costs T (Bq + w - 1) scores instead of T^2;
//  - one joint softmax over [entries, band, sink].
// Full causal attention (and a window as wide as the sequence) uses a causal path, blocked over
// queries for long sequences so that no block looks at keys beyond its last query.
//
// Memory and time are O(T (n_win + T/S)) for chunked layers; backward is plain autograd.
// Any other call (streaming: queries not at 0..T-1, or raw keys not the queries' positions) is
// forwarded to attend_reference.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"

namespace phasekv {

// q: [B, H, Tq, hd] (rotated), q_pos: [Tq]; ek/ev: [B, Hkv, E, hd] entries 0..E-1; rk/rv:
// [B, Hkv, R, hd] at positions r_pos [R]; sink: [H] or undefined. Returns [B, H, Tq, hd]; a query
// that sees nothing gets 0. The result may be a non-contiguous view (laid out as [B, Tq, H, hd]).
// Softmax runs in f32 (f64 for f64 inputs) even when the scores are bf16; the weights are cast
// back to the values' dtype for the second matmul.
torch::Tensor attend_fast(const AttentionConfig& a, const torch::Tensor& q,
                          const torch::Tensor& q_pos, const torch::Tensor& ek,
                          const torch::Tensor& ev, const torch::Tensor& rk, const torch::Tensor& rv,
                          const torch::Tensor& r_pos, const torch::Tensor& sink);

// Which core AttentionImpl::forward (the full-sequence forward) uses: attend_fast or the reference;
// and forward_cached (the streaming session): attend_cached (model/attend_cached.h) or the
// reference. Process-wide; tests and benchmarks switch to kReference to compare.
enum class AttentionPath { kReference, kFast };
void set_attention_path(AttentionPath p);
AttentionPath attention_path();

// Restores the previous path on scope exit.
class AttentionPathGuard {
 public:
  explicit AttentionPathGuard(AttentionPath p) : prev_(attention_path()) { set_attention_path(p); }
  ~AttentionPathGuard() { set_attention_path(prev_); }
  AttentionPathGuard(const AttentionPathGuard&) = delete;
  AttentionPathGuard& operator=(const AttentionPathGuard&) = delete;

 private:
  AttentionPath prev_;
};

// attend_fast or attend_reference, following attention_path().
torch::Tensor attend(const AttentionConfig& a, const torch::Tensor& q, const torch::Tensor& q_pos,
                     const torch::Tensor& ek, const torch::Tensor& ev, const torch::Tensor& rk,
                     const torch::Tensor& rv, const torch::Tensor& r_pos,
                     const torch::Tensor& sink);

}  // namespace phasekv
