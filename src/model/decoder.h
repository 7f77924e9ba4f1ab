// The Qwen3-style decoder: embedding, n_layers pre-norm blocks (attention + SwiGLU), final norm,
// LM head (optionally tied to the embedding). Parameter names are the weights-file tensor names
// (docs/ARCHITECTURE.md), e.g. "layers.0.attn.comp.gate_k".
#pragma once
#include <torch/torch.h>

#include "config/model_config.h"
#include "model/attention.h"
#include "model/kv_cache.h"
#include "model/layers.h"

namespace phasekv {

struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelConfig& m, const AttentionConfig& a);
  torch::Tensor forward(const torch::Tensor& x, AttentionProbe* probe = nullptr);
  torch::Tensor forward_cached(const torch::Tensor& x, LayerCache& cache);
  // forward()'s output at the last position only: [B, T, D] -> [B, 1, D] (AttentionImpl::
  // forward_last; the MLP runs on that position alone).
  torch::Tensor forward_last(const torch::Tensor& x);
  RMSNorm attn_norm{nullptr}, mlp_norm{nullptr};
  Attention attn{nullptr};
  SwiGLU mlp{nullptr};
};
TORCH_MODULE(Block);

struct DecoderImpl : torch::nn::Module {
  explicit DecoderImpl(const ModelConfig& cfg);

  // tokens [B, T] int64 -> logits [B, T, vocab] (float32 unless the model runs in bf16).
  torch::Tensor forward(const torch::Tensor& tokens);
  // Streaming: tokens [B, Tn] continue the sequence held in caches (one per layer).
  torch::Tensor forward_cached(const torch::Tensor& tokens, std::vector<LayerCache>& caches);
  // Hidden states after the final norm, for callers that only need some positions' logits.
  // probes: empty, or one AttentionProbe per layer (knockouts and captures at the last position,
  // model/attention.h); the forward fills the probes' captures.
  torch::Tensor hidden(const torch::Tensor& tokens, std::vector<AttentionProbe>* probes = nullptr);
  // hidden(tokens)[:, T-1] without the last layer's work for the other positions: [B, D]. Every
  // layer but the last still runs on the whole sequence (the next layer's keys need it).
  torch::Tensor hidden_last(const torch::Tensor& tokens);
  torch::Tensor logits_from_hidden(const torch::Tensor& h);
  // The indexed layers' indexer losses from the last training forward, summed (undefined when
  // the model has no indexed layer); the trainer adds it to the LM loss.
  torch::Tensor index_loss() const;

  // Seeded initialisation: N(0, 0.02); residual output projections scaled by 1/sqrt(2 n_layers).
  void init_weights(uint64_t seed);

  ModelConfig cfg;
  torch::nn::Embedding embed{nullptr};
  torch::nn::ModuleList layers{nullptr};
  std::vector<Block> blocks;
  RMSNorm final_norm{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(Decoder);

}  // namespace phasekv
