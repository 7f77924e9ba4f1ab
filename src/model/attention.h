// Attention with pluggable key sets: full causal, raw sliding window, or chunked (compressed
// entries plus a raw window in one joint softmax, optionally with a learned sink).
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"
#include "model/compressor.h"
#include "model/indexer.h"
#include "model/kv_cache.h"
#include "model/layers.h"

namespace phasekv {

// An intervention and probe on one layer's full-sequence forward, at the LAST position T-1 of
// every sequence of the batch (docs/ARCHITECTURE.md section 11; the explanation analyses,
// src/explain). A default-constructed probe changes nothing and captures nothing.
struct AttentionProbe {
  // KV-head knockout: the outputs o_{T-1,h} (before wo) of the G query heads h in [gG, (g+1)G)
  // that read KV head g are replaced by head_means[h] for every g in replace_kv_heads.
  std::vector<int64_t> replace_kv_heads;
  torch::Tensor head_means;  // [H, hd]
  // Whole-layer knockout: the layer's attention output (after wo) at T-1 is replaced by
  // layer_mean [D] (applied after any head replacement).
  torch::Tensor layer_mean;
  // Captures, filled by the forward when asked (before any replacement):
  bool capture_final = false;
  torch::Tensor heads;  // [B, H, hd]: o_{T-1,h}
  torch::Tensor out;    // [B, D]: the attention output at T-1
  // Pool weights of every entry 0..n-1 complete at T on every KV head's grid (n = floor(T/S)
  // without offsets; chunked layers only): [B, n, W, Hkv] (scalar,
  // mean) or [B, n, W, Hkv, hd] (vector); invalid slots (before position 0) weigh 0. gate_v is
  // gate_k's tensor when the value side has no gate of its own (tied_kv_gates, mean) and
  // undefined with tied_kv (no value branch).
  bool capture_gates = false;
  torch::Tensor gate_k, gate_v;
  bool active() const {
    return !replace_kv_heads.empty() || layer_mean.defined() || capture_final || capture_gates;
  }
};

struct AttentionImpl : torch::nn::Module {
  AttentionImpl(const ModelConfig& model, const AttentionConfig& attn);

  // Full sequence at positions 0..T-1; x is the pre-normed hidden state [B, T, D]. `probe`
  // (optional) intervenes at / captures the last position, see AttentionProbe.
  torch::Tensor forward(const torch::Tensor& x, AttentionProbe* probe = nullptr);
  // The full-sequence forward's output at the last position only: [B, T, D] -> [B, 1, D]. Keys,
  // values and entries still come from every position; queries, scores and wo only from T-1
  // (scoring the last layer of a sweep's forward). Indexed layers are not supported (their
  // training target needs every query): callers use forward() and select T-1 there.
  torch::Tensor forward_last(const torch::Tensor& x);
  // Streaming: x holds the next tokens, at positions cache.n_tokens onwards; updates the cache.
  torch::Tensor forward_cached(const torch::Tensor& x, LayerCache& cache);
  // Capacity in the cache for n_tokens tokens in total (the parts that grow with the context, and
  // the decode scratch), so that a caller that knows the final length avoids regrowing.
  void reserve(LayerCache& cache, int64_t n_tokens) const;

  AttentionConfig cfg;
  // The layer's grid groups (config/model_config.h): one, unless kv_head_offsets puts KV heads on
  // different grids; each group is attended on its own and the heads are concatenated.
  std::vector<GridGroup> groups;
  int64_t n_heads, n_kv, head_dim;
  Rope rope;
  torch::nn::Linear wq{nullptr}, wk{nullptr}, wv{nullptr}, wo{nullptr};
  std::shared_ptr<RMSNormImpl> q_norm, k_norm;
  torch::Tensor sink;  // [H] learned logit with zero value, if cfg.sink
  Compressor comp{nullptr};
  Indexer indexer{nullptr};  // indexed layers (index_topk > 0) only
  // The indexer's loss from the last forward in training mode with gradients on (index_loss in
  // model/indexer.h); undefined otherwise. The trainer adds it to the LM loss.
  torch::Tensor last_index_loss;

 private:
  struct Projected {
    torch::Tensor q, k, v;       // heads-first, q and k normed and rotated
    torch::Tensor k_lin, v_lin;  // [B, T, Hkv*hd] before norm/RoPE (compressor payloads)
  };
  // Queries only from position q_from on (keys and values from every position).
  Projected project(const torch::Tensor& x, const torch::Tensor& positions, int64_t q_from = 0);
  // The heads [B, H, Tq, hd] of queries q_from..T-1 over the layer's key sets of positions
  // 0..T-1 (forward without the indexer).
  torch::Tensor attend_heads(const torch::Tensor& x, const Projected& p, const torch::Tensor& pos,
                             const CompressorTokens& tokens, int64_t q_from);
  torch::Tensor output(const torch::Tensor& heads);  // [B, H, T, hd] -> [B, T, D]
  // output() with the probe's replacements and captures at T-1.
  torch::Tensor probed_output(const torch::Tensor& heads, AttentionProbe& probe);
  void capture_gates(const CompressorTokens& tokens, int64_t T, AttentionProbe& probe);
  // The indexed layer's attention over its entries ek/ev (entries 0..E-1) for queries at pos:
  // the indexer picks each query's entries; in training it also sets last_index_loss.
  torch::Tensor attend_indexed(const IndexerImpl::Tokens& idx, const torch::Tensor& ik,
                               const torch::Tensor& q, const torch::Tensor& pos,
                               const torch::Tensor& ek, const torch::Tensor& ev,
                               const torch::Tensor& rk, const torch::Tensor& rv,
                               const torch::Tensor& r_pos, const torch::Tensor& sk);
  // Group g's cache: the layer's own with one group, else its sub-cache.
  LayerCache& group_cache(LayerCache& c, size_t g) const;
  // The indexer's cache (its keys and pending tokens) inside the layer's.
  static LayerCache& index_cache(LayerCache& c);
  bool uses_raw() const;
};
TORCH_MODULE(Attention);

}  // namespace phasekv
