#include "v4/weights.h"

namespace phasekv::v4 {

std::string layer_name(int64_t layer, const std::string& suffix) {
  return "layers." + std::to_string(layer) + "." + suffix;
}

const torch::Tensor& get(const TensorMap& w, const std::string& name) {
  auto it = w.find(name);
  if (it == w.end()) throw std::logic_error("v4: no tensor '" + name + "'");
  return it->second;
}

namespace {

void add_attention(const V4Config& c, int64_t i, std::vector<TensorSpec>& out) {
  const int64_t d = c.hidden_size, hd = c.head_dim, H = c.num_attention_heads;
  auto add = [&](const std::string& s, std::vector<int64_t> shape, Init init) {
    out.push_back({layer_name(i, s), std::move(shape), init});
  };
  add("attn_norm.weight", {d}, Init::kNorm);
  add("attn.attn_sink", {H}, Init::kSink);
  add("attn.wq_a.weight", {c.q_lora_rank, d}, Init::kLinear);
  add("attn.q_norm.weight", {c.q_lora_rank}, Init::kNorm);
  add("attn.wq_b.weight", {H * hd, c.q_lora_rank}, Init::kLinear);
  add("attn.wkv.weight", {hd, d}, Init::kLinear);
  add("attn.kv_norm.weight", {hd}, Init::kNorm);
  // wo_a holds o_groups blocks of o_lora_rank rows, group g reading heads [g H/G, (g+1) H/G).
  add("attn.wo_a.weight", {c.o_groups * c.o_lora_rank, H * hd / c.o_groups}, Init::kLinear);
  add("attn.wo_b.weight", {d, c.o_groups * c.o_lora_rank}, Init::kLinear);
  const int64_t r = c.compress_ratios[i];
  if (r == 0) return;
  const int64_t lanes = c.overlap(i) ? 2 : 1;
  add("attn.compressor.ape", {r, lanes * hd}, Init::kSmall);
  add("attn.compressor.wkv.weight", {lanes * hd, d}, Init::kLinear);
  add("attn.compressor.wgate.weight", {lanes * hd, d}, Init::kLinear);
  add("attn.compressor.norm.weight", {hd}, Init::kNorm);
  if (!c.has_indexer(i)) return;
  const int64_t id = c.index_head_dim;
  add("attn.indexer.wq_b.weight", {c.index_n_heads * id, c.q_lora_rank}, Init::kLinear);
  add("attn.indexer.weights_proj.weight", {c.index_n_heads, d}, Init::kLinear);
  add("attn.indexer.compressor.ape", {r, 2 * id}, Init::kSmall);
  add("attn.indexer.compressor.wkv.weight", {2 * id, d}, Init::kLinear);
  add("attn.indexer.compressor.wgate.weight", {2 * id, d}, Init::kLinear);
  add("attn.indexer.compressor.norm.weight", {id}, Init::kNorm);
}

void add_ffn(const V4Config& c, int64_t i, std::vector<TensorSpec>& out) {
  const int64_t d = c.hidden_size, f = c.moe_intermediate_size, E = c.n_routed_experts;
  auto add = [&](const std::string& s, std::vector<int64_t> shape, Init init) {
    out.push_back({layer_name(i, s), std::move(shape), init});
  };
  add("ffn_norm.weight", {d}, Init::kNorm);
  add("ffn.gate.weight", {E, d}, Init::kLinear);
  // Hash layers route by token id; the others add a selection bias (DeepSeek's Gate has one or
  // the other).
  if (i < c.num_hash_layers)
    add("ffn.gate.tid2eid", {c.vocab_size, c.num_experts_per_tok}, Init::kHashTable);
  else
    add("ffn.gate.bias", {E}, Init::kSmall);
  for (int64_t e = 0; e < E; ++e) {
    const std::string p = "ffn.experts." + std::to_string(e) + ".";
    add(p + "w1.weight", {f, d}, Init::kLinear);
    add(p + "w2.weight", {d, f}, Init::kLinear);
    add(p + "w3.weight", {f, d}, Init::kLinear);
  }
  if (c.n_shared_experts == 0) return;
  const int64_t fs = f * c.n_shared_experts;
  add("ffn.shared_experts.w1.weight", {fs, d}, Init::kLinear);
  add("ffn.shared_experts.w2.weight", {d, fs}, Init::kLinear);
  add("ffn.shared_experts.w3.weight", {fs, d}, Init::kLinear);
}

void add_hc(const V4Config& c, int64_t i, std::vector<TensorSpec>& out) {
  const int64_t wide = c.hc_mult * c.hidden_size, mix = c.mix_dim();
  for (const std::string p : {"hc_attn_", "hc_ffn_"}) {
    out.push_back({layer_name(i, p + "fn"), {mix, wide}, Init::kLinear});
    out.push_back({layer_name(i, p + "base"), {mix}, Init::kSmall});
    out.push_back({layer_name(i, p + "scale"), {3}, Init::kHcScale});
  }
}

}  // namespace

std::vector<TensorSpec> tensor_specs(const V4Config& c) {
  std::vector<TensorSpec> out;
  out.push_back({"embed.weight", {c.vocab_size, c.hidden_size}, Init::kEmbed});
  for (int64_t i = 0; i < c.num_hidden_layers; ++i) {
    add_hc(c, i, out);
    add_attention(c, i, out);
    add_ffn(c, i, out);
  }
  out.push_back({"hc_head_fn", {c.hc_mult, c.hc_mult * c.hidden_size}, Init::kLinear});
  out.push_back({"hc_head_base", {c.hc_mult}, Init::kSmall});
  out.push_back({"hc_head_scale", {1}, Init::kHcScale});
  out.push_back({"norm.weight", {c.hidden_size}, Init::kNorm});
  out.push_back({"head.weight", {c.vocab_size, c.hidden_size}, Init::kLinear});
  return out;
}

}  // namespace phasekv::v4
