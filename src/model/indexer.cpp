#include "model/indexer.h"

#include <cmath>

#include "model/attend_indexed.h"
#include "model/fused.h"
#include "model/visibility.h"

namespace phasekv {

IndexerImpl::IndexerImpl(const ModelConfig& m, const AttentionConfig& attn)
    : cfg(attn),
      heads(attn.index_heads),
      dim(attn.index_dim),
      rope(attn.index_dim, indexer_model(m, attn).rotary_dims(), m.rope_theta) {
  const ModelConfig im = indexer_model(m, attn);
  wq = register_module("wq", make_linear(m.d_model, heads * dim));
  ww = register_module("ww", make_linear(m.d_model, heads));
  // Lane 0 of a shared-payload compressor is the raw key projection; per-slot payloads have
  // their own maps and need none.
  if (attn.payload == PayloadKind::kShared)
    wk = register_module("wk", make_linear(m.d_model, dim, m.qkv_bias));
  comp = register_module("comp", Compressor(im, indexer_attention(attn)));
}

IndexerImpl::Tokens IndexerImpl::project(const torch::Tensor& x_in, int64_t tok0) {
  auto x = x_in.detach();
  const int64_t B = x.size(0), T = x.size(1);
  auto pos =
      torch::arange(tok0, tok0 + T, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
  Tokens t;
  t.q = rope.apply(linear(x, wq).view({B, T, heads, dim}).transpose(1, 2), pos);
  t.w = linear(x, ww) * (1.0 / std::sqrt(static_cast<double>(heads)));
  t.keys = comp->project(x, wk ? linear(x, wk) : torch::Tensor(), torch::Tensor(), tok0);
  return t;
}

torch::Tensor IndexerImpl::pool(const CompressorTokens& keys, int64_t tok0, int64_t j0,
                                int64_t j1) {
  // On the layer's grid (one grid, validated), as the streaming cache pools them: entry j of
  // the indexer and of the layer cover the same tokens, and a query sees both at once.
  return comp->pool(keys, tok0, j0, j1, cfg.grid_offset).first;
}

torch::Tensor IndexerImpl::scores(const Tokens& t, const torch::Tensor& keys) const {
  // [B, Hi, Tq, di] x [B, 1, di, E] -> [B, Hi, Tq, E]: every head against the one key set.
  auto qk =
      torch::matmul(t.q, keys.transpose(-1, -2)) * (1.0 / std::sqrt(static_cast<double>(dim)));
  return (torch::relu(qk) * t.w.transpose(1, 2).unsqueeze(-1)).sum(1);
}

torch::Tensor select_entries(const AttentionConfig& a, const torch::Tensor& scores,
                             const torch::Tensor& q_pos) {
  auto top = top_entries(a, scores, q_pos);
  return torch::zeros(scores.sizes(), top.valid.options()).scatter_(-1, top.index, top.valid);
}

torch::Tensor index_loss(const AttentionConfig& a, const torch::Tensor& scores,
                         const torch::Tensor& entry_mass, const torch::Tensor& q_pos) {
  const int64_t E = scores.size(-1);
  auto vis = entry_visibility(a, q_pos, 0, E).to(scores.device()).unsqueeze(0);  // [1, Tq, E]
  // At least f32 (bf16 under autocast), f64 kept (the gradient tests).
  const auto dt = scores.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  auto mass = entry_mass.detach().to(dt).masked_fill(~vis, 0.0);
  auto p = mass / mass.sum(-1, true).clamp_min(1e-30);
  // A large finite fill (not -inf) keeps rows with no visible entry finite; their p is 0.
  auto logq = torch::log_softmax(scores.to(dt).masked_fill(~vis, -1e30), -1);
  auto kl = (p * (torch::log(p.clamp_min(1e-30)) - logq)).sum(-1);  // [B, Tq]
  const double rows = static_cast<double>(scores.size(0)) * vis.any(-1).sum().item<double>();
  return kl.sum() / std::max(rows, 1.0);
}

}  // namespace phasekv
