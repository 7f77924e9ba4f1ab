// The CSA indexer (DeepSeek-V4's compressed sparse attention): a light scorer with its own
// compressor picks, for each query, the index_topk visible compressed entries the attention
// uses (docs/ARCHITECTURE.md section 5, "Indexer").
//
//   I[t, j] = sum_h w_{t,h} ReLU(q_{t,h} . k_j / sqrt(di)),   w_t = ww u_t / sqrt(Hi)
//
// q_{t,h} = RoPE(wq u_t, t) (Hi heads of width di), k_j the indexer's own compressed key of
// entry j (a compressor of the layer's kind with one head of width di, keys only). The
// selection is not differentiable; the indexer learns from its own loss (index_loss), and its
// input is detached so that this loss never reaches the rest of the model.
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"
#include "model/compressor.h"
#include "model/layers.h"

namespace phasekv {

struct IndexerImpl : torch::nn::Module {
  IndexerImpl(const ModelConfig& model, const AttentionConfig& attn);

  struct Tokens {
    torch::Tensor q;        // [B, Hi, T, di], rotated at the tokens' positions
    torch::Tensor w;        // [B, T, Hi], the per-head weights (1/sqrt(Hi) included)
    CompressorTokens keys;  // the compressor's projected tokens (one head of width di)
  };
  // x: the layer's pre-normed input [B, T, D] at positions tok0.. (detached here).
  Tokens project(const torch::Tensor& x, int64_t tok0);
  // The indexer keys of entries [j0, j1) on the layer's grid (its grid_offset): [B, 1, j1-j0, di].
  torch::Tensor pool(const CompressorTokens& keys, int64_t tok0, int64_t j0, int64_t j1);
  // I[b, t, j] for the queries of `t` against keys [B, 1, E, di] (entries 0..E-1): [B, Tq, E].
  torch::Tensor scores(const Tokens& t, const torch::Tensor& keys) const;

  AttentionConfig cfg;  // the layer's
  int64_t heads, dim;
  Rope rope;
  torch::nn::Linear wq{nullptr}, ww{nullptr}, wk{nullptr};
  Compressor comp{nullptr};
};
TORCH_MODULE(Indexer);

// The entries each query attends: [B, Tq, E] bool, true for the min(index_topk, visible) visible
// entries with the highest scores (top_entries in model/attend_indexed.h as a mask). Ties go to
// the lower entry index, so the choice is deterministic and the same in the full forward and in
// streaming. scores: [B, Tq, E] for entries 0..E-1, q_pos: [Tq] absolute positions.
torch::Tensor select_entries(const AttentionConfig& a, const torch::Tensor& scores,
                             const torch::Tensor& q_pos);

// The indexer's loss (DeepSeek-V3.2's lightning-indexer objective, dense form): the mean over the
// queries that see an entry of KL(p_t || softmax_j I[t, j]) over the visible entries j, where p_t
// is the attention's dense distribution over those entries (entry_mass: the softmax mass every
// visible entry gets before selection, summed over query heads; detached) normalised to sum 1.
torch::Tensor index_loss(const AttentionConfig& a, const torch::Tensor& scores,
                         const torch::Tensor& entry_mass, const torch::Tensor& q_pos);

}  // namespace phasekv
