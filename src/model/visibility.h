// Which cached keys a query may attend to. One place for the rules, shared by the full forward,
// the streaming session and the tests.
//
// Compressed entry j is visible to a query at position t iff j < floor((t+1+o)/S), o the layer's
// grid_offset: the entry becomes visible at the token that completes it (DeepSeek rule; entry j
// ends at position jS+S-1-o). Raw token p is visible iff
//   full:    p <= t
//   window:  t - n_win < p <= t
//   chunked: t - n_win < p <= t, or (uncompressed_tail and tail_start(t) <= p <= t), where
//            tail_start(t) = S*floor((t+1+o)/S) - o is the first token of no visible entry.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"

namespace phasekv {

// The attention cores and these rules see one grid: a layer with per-KV-head grids
// (kv_head_offsets) calls them once per grid group (AttentionImpl, GridGroup).
inline constexpr const char* kOneGridOnly =
    "attention core: a config with kv_head_offsets must be split into grid groups first";

// Number of entries visible to a query at position t.
inline int64_t visible_entries(const AttentionConfig& a, int64_t t) {
  return (t + 1 + a.grid_offset) / a.stride;
}
// Entries completed by the first n tokens (positions 0 .. n-1).
inline int64_t complete_entries(const AttentionConfig& a, int64_t n) {
  return visible_entries(a, n - 1);
}

// [Tq, E] bool: entries j0 .. j0+E-1 against query positions q_pos [Tq] (int64).
torch::Tensor entry_visibility(const AttentionConfig& a, const torch::Tensor& q_pos, int64_t j0,
                               int64_t n_entries);
// [Tq, R] bool: raw tokens at positions r_pos [R] against query positions q_pos [Tq].
torch::Tensor raw_visibility(const AttentionConfig& a, const torch::Tensor& q_pos,
                             const torch::Tensor& r_pos);
// The smallest raw position any query at t >= t_next can still see: older raw tokens can be
// dropped.
int64_t raw_keep_from(const AttentionConfig& a, int64_t t_next);

}  // namespace phasekv
