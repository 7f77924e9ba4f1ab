#include "v4/attention.h"

#include <cmath>
#include <limits>
#include <numeric>

#include "v4/compressor.h"
#include "v4/hyper.h"
#include "v4/rope.h"

namespace phasekv::v4 {

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

std::vector<int64_t> positions(int64_t T) {
  std::vector<int64_t> pos(T);
  std::iota(pos.begin(), pos.end(), 0);
  return pos;
}

CompressorWeights compressor_weights(const TensorMap& w, int64_t layer, const std::string& p) {
  return {get(w, layer_name(layer, p + "wkv.weight")),
          get(w, layer_name(layer, p + "wgate.weight")), get(w, layer_name(layer, p + "ape")),
          get(w, layer_name(layer, p + "norm.weight"))};
}

// [T, T] bool: raw token s is visible to t iff 0 <= t - s < window (llama.cpp's standard SWA).
torch::Tensor window_visible(int64_t T, int64_t window) {
  auto t = torch::arange(T, torch::kInt64).unsqueeze(1);
  auto s = torch::arange(T, torch::kInt64).unsqueeze(0);
  return (s <= t) & (t - s < window);
}

// Softmax over the keys and one sink logit per head; the sink takes probability, no value.
torch::Tensor attend_with_sinks(const torch::Tensor& q, const torch::Tensor& keys,
                                const torch::Tensor& visible, const torch::Tensor& sink) {
  const int64_t T = q.size(0), H = q.size(1);
  auto scores = torch::matmul(q, keys.t()) / std::sqrt(static_cast<double>(q.size(2)));
  scores = scores.masked_fill(visible.logical_not().unsqueeze(1), -kInf);
  auto logits = torch::cat({scores, sink.view({1, H, 1}).expand({T, H, 1})}, 2);
  auto p = torch::softmax(logits, 2).narrow(2, 0, keys.size(0));
  return torch::matmul(p, keys);  // V = K
}

// Heads in o_groups groups, group g through rows [g r, (g+1) r) of wo_a, then wo_b.
torch::Tensor grouped_output(const V4Config& c, const TensorMap& w, int64_t layer,
                             const torch::Tensor& o) {
  const int64_t T = o.size(0), G = c.o_groups;
  auto grouped = o.reshape({T, G, -1});
  auto wo_a = get(w, layer_name(layer, "attn.wo_a.weight")).view({G, c.o_lora_rank, -1});
  auto low = torch::einsum("tgk,grk->tgr", {grouped, wo_a}).reshape({T, G * c.o_lora_rank});
  return torch::matmul(low, get(w, layer_name(layer, "attn.wo_b.weight")).t());
}

}  // namespace

torch::Tensor indexer_select(const V4Config& c, const TensorMap& w, int64_t layer,
                             const torch::Tensor& y, const torch::Tensor& qr,
                             const torch::Tensor& visible) {
  torch::NoGradGuard no_grad;
  const int64_t T = y.size(0), n = visible.size(1);
  if (n == 0) return visible;
  const RopeParams rope = layer_rope(c, layer);
  auto keys = compress_entries(y, compressor_weights(w, layer, "attn.indexer.compressor."),
                               c.compress_ratios[layer], true, rope, c.rms_norm_eps);
  auto q = torch::matmul(qr, get(w, layer_name(layer, "attn.indexer.wq_b.weight")).t())
               .view({T, c.index_n_heads, c.index_head_dim});
  q = rope_apply(q, rope_table(rope, positions(T), y.scalar_type()));
  auto weights =
      torch::matmul(y, get(w, layer_name(layer, "attn.indexer.weights_proj.weight")).t()) /
      std::sqrt(static_cast<double>(c.index_n_heads * c.index_head_dim));
  auto score = (torch::relu(torch::matmul(q, keys.t())) * weights.unsqueeze(-1)).sum(1);
  score = score.masked_fill(visible.logical_not(), -kInf);
  const int64_t k = std::min(c.index_topk, n);
  auto picked = torch::zeros_like(visible).scatter(1, std::get<1>(score.topk(k, 1)), true);
  return picked & visible;
}

torch::Tensor attention_forward(const V4Config& c, const TensorMap& w, int64_t layer,
                                const torch::Tensor& y) {
  const int64_t T = y.size(0), H = c.num_attention_heads, hd = c.head_dim;
  const double eps = c.rms_norm_eps;
  const RopeParams rope = layer_rope(c, layer);
  const RopeTable table = rope_table(rope, positions(T), y.scalar_type());
  auto qr = rms_norm(torch::matmul(y, get(w, layer_name(layer, "attn.wq_a.weight")).t()), eps,
                     get(w, layer_name(layer, "attn.q_norm.weight")));
  auto q = torch::matmul(qr, get(w, layer_name(layer, "attn.wq_b.weight")).t()).view({T, H, hd});
  q = rope_apply(rms_norm(q, eps), table);
  auto kv = rms_norm(torch::matmul(y, get(w, layer_name(layer, "attn.wkv.weight")).t()), eps,
                     get(w, layer_name(layer, "attn.kv_norm.weight")));
  kv = rope_apply(kv, table);
  auto keys = kv;
  auto visible = window_visible(T, c.sliding_window);
  const int64_t ratio = c.compress_ratios[layer];
  if (ratio > 0) {
    auto entries = compress_entries(y, compressor_weights(w, layer, "attn.compressor."), ratio,
                                    c.overlap(layer), rope, eps);
    auto entry_vis = entry_visible(T, entries.size(0), ratio);
    if (c.has_indexer(layer)) entry_vis = indexer_select(c, w, layer, y, qr, entry_vis);
    keys = torch::cat({kv, entries});
    visible = torch::cat({visible, entry_vis}, 1);
  }
  auto o = attend_with_sinks(q, keys, visible, get(w, layer_name(layer, "attn.attn_sink")));
  o = rope_apply(o, table, /*inverse=*/true);
  return grouped_output(c, w, layer, o);
}

}  // namespace phasekv::v4
