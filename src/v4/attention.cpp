#include "v4/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "v4/compressor.h"
#include "v4/hyper.h"
#include "v4/rope.h"

namespace phasekv::v4 {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int64_t> positions(int64_t p0, int64_t n) {
  std::vector<int64_t> pos(n);
  std::iota(pos.begin(), pos.end(), p0);
  return pos;
}

CompressorWeights compressor_weights(const TensorMap& w, int64_t layer, const std::string& p) {
  return {get(w, layer_name(layer, p + "wkv.weight")),
          get(w, layer_name(layer, p + "wgate.weight")), get(w, layer_name(layer, p + "ape")),
          get(w, layer_name(layer, p + "norm.weight"))};
}

// Appends the new rotated kv to the window cache; returns the visibility [n, rows] of its rows:
// raw token s is visible to t iff 0 <= t - s < window (llama.cpp's standard SWA).
torch::Tensor window_append(AttentionCache& c, const torch::Tensor& kv, int64_t p0,
                            int64_t window) {
  c.raw_kv = c.raw_kv.defined() ? torch::cat({c.raw_kv, kv}) : kv;
  const int64_t end = p0 + kv.size(0);
  auto t = torch::arange(p0, end, torch::kInt64).unsqueeze(1);
  auto s = torch::arange(c.raw_start, end, torch::kInt64).unsqueeze(0);
  return (s <= t) & (t - s < window);
}

// Later tokens (t >= end) see only s > end - window.
void window_trim(AttentionCache& c, int64_t end, int64_t window) {
  const int64_t keep = std::max(c.raw_start, end - window + 1);
  c.raw_kv = c.raw_kv.narrow(0, keep - c.raw_start, end - keep);
  c.raw_start = keep;
}

// Softmax over the keys and one sink logit per head; the sink takes probability, no value.
// q [..., T, H, hd], keys [..., S, hd], visible [..., T, S] (the leading dims: none for one
// sequence, B for a batch) -> [..., T, H, hd].
torch::Tensor attend_with_sinks(const torch::Tensor& q, const torch::Tensor& keys,
                                const torch::Tensor& visible, const torch::Tensor& sink) {
  const int64_t H = q.size(-2);
  auto scores =
      torch::einsum("...thd,...sd->...ths", {q, keys}) / std::sqrt(static_cast<double>(q.size(-1)));
  scores = scores.masked_fill(visible.logical_not().unsqueeze(-2), -kInf);
  std::vector<int64_t> sink_shape = scores.sizes().vec();
  sink_shape.back() = 1;
  auto logits = torch::cat({scores, sink.view({H, 1}).expand(sink_shape)}, -1);
  auto p = torch::softmax(logits, -1).narrow(-1, 0, keys.size(-2));
  return torch::einsum("...ths,...sd->...thd", {p, keys});  // V = K
}

// Heads in o_groups groups, group g through rows [g r, (g+1) r) of wo_a, then wo_b.
// o [..., T, H, hd] -> [..., T, d].
torch::Tensor grouped_output(const V4Config& c, const TensorMap& w, int64_t layer,
                             const torch::Tensor& o) {
  const int64_t G = c.o_groups;
  std::vector<int64_t> shape = o.sizes().vec();
  shape.pop_back();
  shape.back() = G;
  shape.push_back(-1);  // [..., T, G, H hd / G]
  auto wo_a = get(w, layer_name(layer, "attn.wo_a.weight")).view({G, c.o_lora_rank, -1});
  auto low = torch::einsum("...gk,grk->...gr", {o.reshape(shape), wo_a}).flatten(-2);
  return torch::matmul(low, get(w, layer_name(layer, "attn.wo_b.weight")).t());
}

// The query latent qr = RMSNorm(W_qa y), the heads' queries q [..., T, H, hd] and the one kv
// vector [..., T, hd] of y [..., T, d], both rotated at the table's positions (along pos_dim):
// shared by the streaming and the batched forward.
struct Projections {
  torch::Tensor qr, q, kv;
};
Projections project(const V4Config& c, const TensorMap& w, int64_t layer, const torch::Tensor& y,
                    const RopeTable& table, int64_t pos_dim) {
  const double eps = c.rms_norm_eps;
  Projections p;
  p.qr = rms_norm(torch::matmul(y, get(w, layer_name(layer, "attn.wq_a.weight")).t()), eps,
                  get(w, layer_name(layer, "attn.q_norm.weight")));
  auto q = torch::matmul(p.qr, get(w, layer_name(layer, "attn.wq_b.weight")).t())
               .unflatten(-1, {c.num_attention_heads, c.head_dim});
  p.q = rope_apply(rms_norm(q, eps), table, false, pos_dim);
  auto kv = rms_norm(torch::matmul(y, get(w, layer_name(layer, "attn.wkv.weight")).t()), eps,
                     get(w, layer_name(layer, "attn.kv_norm.weight")));
  p.kv = rope_apply(kv, table, false, pos_dim);
  return p;
}

// The indexer's score of every entry for every token, -inf where `visible` [T, n] says no:
// sum_h relu(q_h . k_j) w_h with q_h from the query latent qr [..., T, q_lora_rank] rotated at
// the table's positions (along pos_dim), w = W_proj y / sqrt(IH Id); keys [..., n, Id] ->
// [..., T, n].
torch::Tensor indexer_score(const V4Config& c, const TensorMap& w, int64_t layer,
                            const torch::Tensor& y, const torch::Tensor& qr,
                            const torch::Tensor& keys, const torch::Tensor& visible,
                            const RopeTable& table, int64_t pos_dim) {
  auto q = torch::matmul(qr, get(w, layer_name(layer, "attn.indexer.wq_b.weight")).t())
               .unflatten(-1, {c.index_n_heads, c.index_head_dim});
  q = rope_apply(q, table, false, pos_dim);
  auto weights =
      torch::matmul(y, get(w, layer_name(layer, "attn.indexer.weights_proj.weight")).t()) /
      std::sqrt(static_cast<double>(c.index_n_heads * c.index_head_dim));
  auto qk = torch::einsum("...thd,...nd->...thn", {q, keys});
  return (torch::relu(qk) * weights.unsqueeze(-1))
      .sum(-2)
      .masked_fill(visible.logical_not(), -kInf);
}

// The k highest scores of each row [T, n] as a mask, chosen as ggml's CPU top_k chooses them:
// std::partial_sort of the indices 0..n-1 by descending score. Equal scores (relu's zeros, common
// with few indexer heads) then fall where llama.cpp's selection puts them; a stable sort (ties
// to the lower index) picked other entries and moved logits by up to 0.78 (docs/DEEPSEEK-V4.md).
// The selection depends only on the row's scores in entry order, so the prefill split does not
// change it (entries not yet visible are -inf at the end and never enter the heap).
torch::Tensor top_k_as_llamacpp(const torch::Tensor& score, int64_t k) {
  const torch::Tensor s = score.to(torch::kFloat64).contiguous();  // exact for f32 scores
  const int64_t T = s.size(0), n = s.size(1);
  torch::Tensor picked = torch::zeros({T, n}, torch::kBool);
  auto mask = picked.accessor<bool, 2>();
  std::vector<int32_t> idx(static_cast<size_t>(n));
  for (int64_t t = 0; t < T; ++t) {
    const double* row = s.data_ptr<double>() + t * n;
    std::iota(idx.begin(), idx.end(), 0);
    std::partial_sort(idx.begin(), idx.begin() + k, idx.end(),
                      [row](int32_t a, int32_t b) { return row[a] > row[b]; });
    for (int64_t j = 0; j < k; ++j) mask[t][idx[static_cast<size_t>(j)]] = true;
  }
  return picked;
}

}  // namespace

torch::Tensor indexer_select(const V4Config& c, const TensorMap& w, int64_t layer,
                             const torch::Tensor& y, const torch::Tensor& qr, int64_t p0,
                             const torch::Tensor& visible, CompressorCache& cache) {
  // llama.cpp multiplies the indexer's queries and keys by a Hadamard matrix (k_rot; DeepSeek's
  // V3.2 reference does the same before rounding them to FP8); an orthogonal rotation of both
  // leaves every q.k unchanged, so phasekv skips it. Low-precision rounding: llama.cpp with an
  // f32 cache does none, and neither does phasekv (not checked against V4's own reference code).
  torch::NoGradGuard no_grad;
  const int64_t T = y.size(0), n = visible.size(1);
  const RopeParams rope = layer_rope(c, layer);
  compress_append(cache, y, p0, compressor_weights(w, layer, "attn.indexer.compressor."),
                  c.compress_ratios[layer], true, rope, c.rms_norm_eps);
  if (n == 0) return visible;
  auto score = indexer_score(c, w, layer, y, qr, cache.entries, visible,
                             rope_table(rope, positions(p0, T), y.scalar_type()), 0);
  return top_k_as_llamacpp(score, std::min(c.index_topk, n)) & visible;
}

torch::Tensor attention_forward(const V4Config& c, const TensorMap& w, int64_t layer,
                                const torch::Tensor& y, int64_t p0, AttentionCache& cache) {
  const int64_t T = y.size(0);
  const double eps = c.rms_norm_eps;
  const RopeParams rope = layer_rope(c, layer);
  const RopeTable table = rope_table(rope, positions(p0, T), y.scalar_type());
  const Projections p = project(c, w, layer, y, table, 0);
  auto visible = window_append(cache, p.kv, p0, c.sliding_window);
  auto keys = cache.raw_kv;
  window_trim(cache, p0 + T, c.sliding_window);
  const int64_t ratio = c.compress_ratios[layer];
  if (ratio > 0) {
    CompressorCache& comp = cache.entries;
    compress_append(comp, y, p0, compressor_weights(w, layer, "attn.compressor."), ratio,
                    c.overlap(layer), rope, eps);
    auto entry_vis = entry_visible(p0, T, comp.n_entries(), ratio);
    if (c.has_indexer(layer))
      entry_vis = indexer_select(c, w, layer, y, p.qr, p0, entry_vis, cache.index_keys);
    keys = torch::cat({keys, comp.entries});
    visible = torch::cat({visible, entry_vis}, 1);
  }
  auto o = attend_with_sinks(p.q, keys, visible, get(w, layer_name(layer, "attn.attn_sink")));
  o = rope_apply(o, table, /*inverse=*/true);
  return grouped_output(c, w, layer, o);
}

namespace {

// indexer_select for B whole sequences (no cache): y [B, T, d], qr [B, T, q_lora_rank], visible
// [T, n] -> [B, T, n].
torch::Tensor indexer_select_batch(const V4Config& c, const TensorMap& w, int64_t layer,
                                   const torch::Tensor& y, const torch::Tensor& qr,
                                   const torch::Tensor& visible, const RopeTable& table) {
  torch::NoGradGuard no_grad;
  const int64_t B = y.size(0), T = y.size(1), n = visible.size(1);
  auto keys =
      compress_entries_batch(y, compressor_weights(w, layer, "attn.indexer.compressor."),
                             c.compress_ratios[layer], true, layer_rope(c, layer), c.rms_norm_eps);
  auto score = indexer_score(c, w, layer, y, qr, keys, visible, table, /*pos_dim=*/1);
  auto picked = top_k_as_llamacpp(score.reshape({B * T, n}), std::min(c.index_topk, n));
  return picked.view({B, T, n}) & visible;
}

}  // namespace

torch::Tensor attention_forward_batch(const V4Config& c, const TensorMap& w, int64_t layer,
                                      const torch::Tensor& y) {
  const int64_t B = y.size(0), T = y.size(1);
  const double eps = c.rms_norm_eps;
  const RopeParams rope = layer_rope(c, layer);
  const RopeTable table = rope_table(rope, positions(0, T), y.scalar_type());
  const Projections p = project(c, w, layer, y, table, /*pos_dim=*/1);
  // window_append's rule on positions 0..T-1.
  auto t = torch::arange(T, torch::kInt64).unsqueeze(1), s = t.t();
  auto visible = ((s <= t) & (t - s < c.sliding_window)).expand({B, T, T});
  auto keys = p.kv;
  const int64_t ratio = c.compress_ratios[layer];
  if (ratio > 0) {
    auto entries = compress_entries_batch(y, compressor_weights(w, layer, "attn.compressor."),
                                          ratio, c.overlap(layer), rope, eps);
    auto entry_vis = entry_visible(0, T, entries.size(1), ratio);
    auto picked = c.has_indexer(layer)
                      ? indexer_select_batch(c, w, layer, y, p.qr, entry_vis, table)
                      : entry_vis.expand({B, T, entries.size(1)});
    keys = torch::cat({keys, entries}, 1);
    visible = torch::cat({visible, picked}, 2);
  }
  auto o = attend_with_sinks(p.q, keys, visible, get(w, layer_name(layer, "attn.attn_sink")));
  return grouped_output(c, w, layer, rope_apply(o, table, /*inverse=*/true, 1));
}

}  // namespace phasekv::v4
