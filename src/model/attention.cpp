#include "model/attention.h"

#include <cmath>

#include "model/attend_cached.h"
#include "model/attend_fast.h"
#include "model/component_scope.h"
#include "model/fused.h"
#include "model/visibility.h"

namespace phasekv {

torch::Tensor attend_reference(const AttentionConfig& a, const torch::Tensor& q,
                               const torch::Tensor& q_pos, const torch::Tensor& ek,
                               const torch::Tensor& ev, const torch::Tensor& rk,
                               const torch::Tensor& rv, const torch::Tensor& r_pos,
                               const torch::Tensor& sink) {
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), hd = q.size(3);
  const bool has_e = ek.defined() && ek.size(2) > 0, has_r = rk.defined() && rk.size(2) > 0;
  if (!has_e && !has_r) return torch::zeros_like(q);
  const int64_t Hkv = has_e ? ek.size(1) : rk.size(1), G = H / Hkv;
  // Grouped-query attention without copying K/V: query heads are grouped [B, Hkv, G, Tq, hd].
  auto qg = q.reshape({B, Hkv, G, Tq, hd}) * (1.0 / std::sqrt(static_cast<double>(hd)));
  std::vector<torch::Tensor> scores, masks;
  if (has_e) {
    scores.push_back(torch::matmul(qg, ek.unsqueeze(2).transpose(-1, -2)));
    masks.push_back(entry_visibility(a, q_pos, 0, ek.size(2)));
  }
  if (has_r) {
    scores.push_back(torch::matmul(qg, rk.unsqueeze(2).transpose(-1, -2)));
    masks.push_back(raw_visibility(a, q_pos, r_pos));
  }
  auto s = torch::cat(scores, -1);
  auto mask = torch::cat(masks, -1).to(q.device());  // [Tq, N]
  const int64_t N = s.size(-1);
  // A query that sees no key (chunked, n_win = 0, t < S-1) must output 0, not NaN: let it
  // "see" everything to keep the softmax finite, then zero its weights.
  auto sees_any = mask.any(-1, /*keepdim=*/true);
  s = s.masked_fill(~(mask | ~sees_any), -INFINITY);
  if (sink.defined()) {
    auto col = sink.to(s.scalar_type()).view({1, Hkv, G, 1, 1}).expand({B, Hkv, G, Tq, 1});
    s = torch::cat({s, col}, -1);
  }
  auto p = torch::softmax(s, -1).narrow(-1, 0, N) * sees_any.to(s.scalar_type());
  torch::Tensor out;
  int64_t off = 0;
  if (has_e) {
    out = torch::matmul(p.narrow(-1, 0, ek.size(2)), ev.unsqueeze(2));
    off = ek.size(2);
  }
  if (has_r) {
    auto o = torch::matmul(p.narrow(-1, off, rk.size(2)), rv.unsqueeze(2));
    out = out.defined() ? out + o : o;
  }
  return out.reshape({B, H, Tq, hd});
}

AttentionImpl::AttentionImpl(const ModelConfig& m, const AttentionConfig& attn)
    : cfg(attn),
      n_heads(m.n_heads),
      n_kv(m.n_kv_heads),
      head_dim(m.head_dim),
      rope(m.head_dim, m.rotary_dims(), m.rope_theta) {
  wq = register_module("wq", make_linear(m.d_model, n_heads * head_dim, m.qkv_bias));
  wk = register_module("wk", make_linear(m.d_model, n_kv * head_dim, m.qkv_bias));
  wv = register_module("wv", make_linear(m.d_model, n_kv * head_dim, m.qkv_bias));
  wo = register_module("wo", make_linear(n_heads * head_dim, m.d_model));
  if (m.qk_norm) {
    q_norm = register_module("q_norm", std::make_shared<RMSNormImpl>(head_dim, m.norm_eps));
    k_norm = register_module("k_norm", std::make_shared<RMSNormImpl>(head_dim, m.norm_eps));
  }
  if (cfg.kind == AttentionKind::kChunked) {
    if (cfg.sink) sink = register_parameter("sink", torch::zeros({n_heads}));
    comp = register_module("comp", Compressor(m, attn));
  }
}

bool AttentionImpl::uses_raw() const {
  return cfg.kind != AttentionKind::kChunked || cfg.n_win > 0 || cfg.uncompressed_tail;
}

AttentionImpl::Projected AttentionImpl::project(const torch::Tensor& x,
                                                const torch::Tensor& positions) {
  const int64_t B = x.size(0), T = x.size(1);
  Projected p;
  p.k_lin = linear(x, wk);
  p.v_lin = linear(x, wv);
  p.q = linear(x, wq).view({B, T, n_heads, head_dim}).transpose(1, 2);
  p.k = p.k_lin.view({B, T, n_kv, head_dim}).transpose(1, 2);
  p.v = p.v_lin.view({B, T, n_kv, head_dim}).transpose(1, 2);
  if (q_norm) {
    p.q = q_norm->forward(p.q);
    p.k = k_norm->forward(p.k);
  }
  p.q = rope.apply(p.q, positions);
  p.k = rope.apply(p.k, positions);
  return p;
}

torch::Tensor AttentionImpl::output(const torch::Tensor& heads) {
  const int64_t B = heads.size(0), T = heads.size(2);
  return linear(heads.transpose(1, 2).reshape({B, T, n_heads * head_dim}), wo);
}

torch::Tensor AttentionImpl::probed_output(const torch::Tensor& heads, AttentionProbe& probe) {
  const int64_t T = heads.size(2), G = n_heads / n_kv;
  if (probe.capture_final) probe.heads = heads.select(2, T - 1).detach().clone();
  torch::Tensor h = heads;
  if (!probe.replace_kv_heads.empty()) {
    TORCH_CHECK(probe.head_means.defined() && probe.head_means.size(0) == n_heads &&
                    probe.head_means.size(1) == head_dim,
                "AttentionProbe: head_means must be [H, hd] = [", n_heads, ", ", head_dim, "]");
    h = heads.clone();
    auto last = h.select(2, T - 1);  // [B, H, hd], a view into h
    for (int64_t g : probe.replace_kv_heads) {
      TORCH_CHECK(g >= 0 && g < n_kv, "AttentionProbe: KV head ", g, " outside [0, ", n_kv, ")");
      last.narrow(1, g * G, G).copy_(
          probe.head_means.narrow(0, g * G, G).to(h.scalar_type()).unsqueeze(0).expand_as(
              last.narrow(1, g * G, G)));
    }
  }
  auto out = output(h);
  if (probe.capture_final) probe.out = out.select(1, T - 1).detach().clone();
  if (probe.layer_mean.defined()) {
    out = out.clone();
    out.select(1, T - 1).copy_(probe.layer_mean.to(out.scalar_type()).unsqueeze(0).expand_as(
        out.select(1, T - 1)));
  }
  return out;
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, AttentionProbe* probe) {
  const int64_t T = x.size(1);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
  auto p = project(x, pos);
  torch::Tensor ek, ev;
  if (comp) {
    ComponentScope scope(Component::kCompressor);
    auto tokens = comp->project(x, p.k_lin, p.v_lin, 0);
    const int64_t E = complete_entries(cfg, T);
    std::tie(ek, ev) = comp->pool(tokens, 0, 0, E);
    if (probe && probe->capture_gates) {
      probe->gate_k = comp->pool_weights(tokens, 0, 0, E, false).detach();
      if (!cfg.tied_kv)
        probe->gate_v = tokens.gv.defined()
                            ? comp->pool_weights(tokens, 0, 0, E, true).detach()
                            : probe->gate_k;
    }
  }
  torch::Tensor rk = uses_raw() ? p.k : torch::Tensor(), rv = uses_raw() ? p.v : torch::Tensor();
  // The training forward: attend() takes the banded fast path unless the reference is selected.
  auto heads = attend(cfg, p.q, pos, ek, ev, rk, rv, pos, sink);
  return probe && probe->active() ? probed_output(heads, *probe) : output(heads);
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, LayerCache& c) {
  const int64_t Tn = x.size(1), t0 = c.n_tokens, t_end = t0 + Tn;
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  auto pos = torch::arange(t0, t_end, opts);
  auto p = project(x, pos);
  if (comp) extend_entries(x, p, c, t_end);
  if (uses_raw()) {
    c.raw_k.append(p.k);
    c.raw_v.append(p.v);
  }
  c.n_tokens = t_end;  // after extend_entries, which reads the position before these tokens
  CachedKeys keys{c.entry_keys(), c.entry_values(), c.raw_keys(), c.raw_values(), c.raw_start()};
  torch::Tensor out;
  if (attention_path() == AttentionPath::kFast) {
    out = attend_cached(cfg, p.q, t0, keys, sink, c.scratch);
  } else {  // the masked reference, for comparisons
    auto r_pos = torch::arange(c.raw_start(), t_end, opts);
    out = attend_reference(cfg, p.q, pos, keys.ek, keys.ev, keys.rk, keys.rv, r_pos, sink);
  }
  if (uses_raw()) c.drop_raw_before(raw_keep_from(cfg, t_end));
  return output(out);
}

// Pools the entries completed by tokens up to t_end (only the new ones: finished entries are
// never recomputed) and keeps the projected tokens the next entries still need.
void AttentionImpl::extend_entries(const torch::Tensor& x, const Projected& p, LayerCache& c,
                                   int64_t t_end) {
  if (c.pending.length() == 0) c.pending_start = c.n_tokens;
  c.pending.append(comp->project(x, p.k_lin, p.v_lin, c.n_tokens));
  const int64_t done = c.n_entries(), complete = complete_entries(cfg, t_end);
  if (complete > done) {
    auto [k, v] = comp->pool(c.pending.tokens(), c.pending_start, done, complete);
    c.ent_k.append(k);
    c.ent_v.append(v);
  }
  // The next entry's window starts at complete*S + S - W - o; older projected tokens are done.
  const int64_t keep = std::max<int64_t>(
      0, complete * cfg.stride + cfg.stride - cfg.width - cfg.grid_offset);
  if (keep > c.pending_start) {
    c.pending.drop_front(std::min(keep - c.pending_start, c.pending.length()));
    c.pending_start = keep;
  }
}

void AttentionImpl::reserve(LayerCache& c, int64_t n_tokens) const {
  // Only the parts that grow with the context; the sliding raw window and the pending tokens
  // settle at a fixed capacity after their first few feeds.
  if (cfg.kind == AttentionKind::kFull) {
    c.raw_k.reserve(n_tokens);
    c.raw_v.reserve(n_tokens);
  }
  const int64_t entries = comp ? complete_entries(cfg, n_tokens) : 0;
  c.ent_k.reserve(entries);
  c.ent_v.reserve(entries);
  // Decode scores: one row per query head, a column per visible key and the sink.
  const int64_t raw = uses_raw() ? n_tokens - raw_keep_from(cfg, n_tokens) + 1 : 0;
  c.scratch.reserve(n_heads * (entries + raw + 1));
}

}  // namespace phasekv
