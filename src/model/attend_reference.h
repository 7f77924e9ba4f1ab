// The reference attention core (the specification the fast and streaming cores are tested
// against): scores over every key and the visibility masks, materialised. The layer
// (model/attention.h), attend_fast and attend_cached fall back to it.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"

namespace phasekv {

// The reference attention core: materialises the [Tq, E + R] scores and the visibility masks.
// q: [B, H, Tq, hd] (rotated), q_pos: [Tq]; entries ek/ev: [B, Hkv, E, hd] holding entries
// 0..E-1; raw rk/rv: [B, Hkv, R, hd] at positions r_pos [R]; sink: [H] or undefined.
// Either key set may be undefined. Returns [B, H, Tq, hd]; a query that sees nothing gets 0.
// entry_select (indexed layers): [B, Tq, E] bool, the entries each query may use besides the
// visibility rule (select_entries). entry_mass (if given) receives the softmax mass each entry
// would get without that selection, summed over the query heads: [B, Tq, E], detached (the
// indexer's target, index_loss).
torch::Tensor attend_reference(const AttentionConfig& a, const torch::Tensor& q,
                               const torch::Tensor& q_pos, const torch::Tensor& ek,
                               const torch::Tensor& ev, const torch::Tensor& rk,
                               const torch::Tensor& rv, const torch::Tensor& r_pos,
                               const torch::Tensor& sink,
                               const torch::Tensor& entry_select = torch::Tensor(),
                               torch::Tensor* entry_mass = nullptr);

}  // namespace phasekv
