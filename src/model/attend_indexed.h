// The attention of an indexed layer (CSA, docs/ARCHITECTURE.md section 5, "Indexer") at
// inference: each query reads only its top-k entries, gathered, so a decode step costs O(k + raw
// window) in the attention instead of O(entries). The full-sequence and training forward keep the
// masked reference core (attend_reference with an entry selection), which also yields the dense
// entry mass the indexer's loss needs; both read the same selection (top_entries).
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"

namespace phasekv {

// The entries a query reads, in entry order: index [B, Tq, K] (int64) with
// K = min(index_topk, E), valid [B, Tq, K] (false where the query sees fewer than K entries:
// those slots hold invisible entries and are never read). Ties go to the lower entry index, so
// prefill, chunked prefill and decode pick the same set.
struct TopEntries {
  torch::Tensor index, valid;
};
TopEntries top_entries(const AttentionConfig& a, const torch::Tensor& scores,
                       const torch::Tensor& q_pos);

// attend_reference's result for an entry selection given as top_entries (equal up to the order
// of summation), computed from the K gathered entries of each query, the raw keys it sees and
// the sink. Shapes as attend_reference; the entry set ek/ev must be defined (E may be 0).
torch::Tensor attend_gathered(const AttentionConfig& a, const torch::Tensor& q,
                              const torch::Tensor& q_pos, const torch::Tensor& ek,
                              const torch::Tensor& ev, const torch::Tensor& rk,
                              const torch::Tensor& rv, const torch::Tensor& r_pos,
                              const torch::Tensor& sink, const TopEntries& selected);

}  // namespace phasekv
