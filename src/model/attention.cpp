#include "model/attention.h"

#include <cmath>

#include "model/attend_cached.h"
#include "model/attend_indexed.h"
#include "model/attend_reference.h"
#include "model/attend_fast.h"
#include "model/component_scope.h"
#include "model/fused.h"
#include "model/visibility.h"

namespace phasekv {

namespace {

// Pools the entries completed by tokens up to t_end (only the new ones: finished entries are
// never recomputed) and keeps the projected tokens the next entries still need. The layer's
// compressor (per grid group) and an indexer's both go through here; keep_values = false keeps
// only the keys (the indexer's).
void extend_entries(CompressorImpl& comp, const AttentionConfig& a, const CompressorTokens& tokens,
                    LayerCache& c, int64_t t_end, bool keep_values) {
  if (c.pending.length() == 0) c.pending_start = c.n_tokens;
  c.pending.append(tokens);
  const int64_t done = c.n_entries(), complete = complete_entries(a, t_end);
  if (complete > done) {
    auto [k, v] = comp.pool(c.pending.tokens(), c.pending_start, done, complete, a.grid_offset);
    c.ent_k.append(k);
    if (keep_values) c.ent_v.append(v);
  }
  // The next entry's window starts at complete*S + S - W - o; older projected tokens are done.
  const int64_t keep =
      std::max<int64_t>(0, complete * a.stride + a.stride - a.width - a.grid_offset);
  if (keep > c.pending_start) {
    c.pending.drop_front(std::min(keep - c.pending_start, c.pending.length()));
    c.pending_start = keep;
  }
}

}  // namespace

AttentionImpl::AttentionImpl(const ModelConfig& m, const AttentionConfig& attn)
    : cfg(attn),
      groups(grid_groups(m, attn)),
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
    if (cfg.indexed()) indexer = register_module("index", Indexer(m, attn));
  }
}

bool AttentionImpl::uses_raw() const {
  return cfg.kind != AttentionKind::kChunked || cfg.n_win > 0 || cfg.uncompressed_tail;
}

AttentionImpl::Projected AttentionImpl::project(const torch::Tensor& x,
                                                const torch::Tensor& positions, int64_t q_from) {
  const int64_t B = x.size(0), T = x.size(1), Tq = T - q_from;
  Projected p;
  p.k_lin = linear(x, wk);
  p.v_lin = linear(x, wv);
  p.q = linear(q_from == 0 ? x : x.narrow(1, q_from, Tq), wq)
            .view({B, Tq, n_heads, head_dim})
            .transpose(1, 2);
  p.k = p.k_lin.view({B, T, n_kv, head_dim}).transpose(1, 2);
  p.v = p.v_lin.view({B, T, n_kv, head_dim}).transpose(1, 2);
  if (q_norm) {
    p.q = q_norm->forward(p.q);
    p.k = k_norm->forward(p.k);
  }
  p.q = rope.apply(p.q, q_from == 0 ? positions : positions.narrow(0, q_from, Tq));
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

torch::Tensor AttentionImpl::attend_indexed(const IndexerImpl::Tokens& idx,
                                            const torch::Tensor& ik, const torch::Tensor& q,
                                            const torch::Tensor& pos, const torch::Tensor& ek,
                                            const torch::Tensor& ev, const torch::Tensor& rk,
                                            const torch::Tensor& rv, const torch::Tensor& r_pos,
                                            const torch::Tensor& sk) {
  auto scores = indexer->scores(idx, ik);  // [B, Tq, E]
  auto selected = select_entries(cfg, scores, pos);
  const bool train = is_training() && torch::GradMode::is_enabled();
  torch::Tensor mass;
  auto out = attend_reference(cfg, q, pos, ek, ev, rk, rv, r_pos, sk, selected,
                              train ? &mass : nullptr);
  last_index_loss = train ? index_loss(cfg, scores, mass, pos) : torch::Tensor();
  return out;
}

torch::Tensor AttentionImpl::forward(const torch::Tensor& x, AttentionProbe* probe) {
  const int64_t T = x.size(1);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
  auto p = project(x, pos);
  CompressorTokens tokens;
  if (comp) {
    ComponentScope scope(Component::kCompressor);
    tokens = comp->project(x, p.k_lin, p.v_lin, 0);
  }
  if (probe && probe->capture_gates && comp) capture_gates(tokens, T, *probe);
  auto heads = attend_heads(x, p, pos, tokens, 0);
  return probe && probe->active() ? probed_output(heads, *probe) : output(heads);
}

torch::Tensor AttentionImpl::forward_last(const torch::Tensor& x) {
  TORCH_CHECK(!indexer, "forward_last: indexed layers need every query (use forward)");
  const int64_t T = x.size(1);
  auto pos = torch::arange(T, torch::TensorOptions().dtype(torch::kInt64).device(x.device()));
  auto p = project(x, pos, T - 1);
  CompressorTokens tokens;
  if (comp) {
    ComponentScope scope(Component::kCompressor);
    tokens = comp->project(x, p.k_lin, p.v_lin, 0);
  }
  return output(attend_heads(x, p, pos, tokens, T - 1));
}

torch::Tensor AttentionImpl::attend_heads(const torch::Tensor& x, const Projected& p,
                                          const torch::Tensor& pos, const CompressorTokens& tokens,
                                          int64_t q_from) {
  const int64_t T = x.size(1), Gq = n_heads / n_kv;
  // Queries at q_from..T-1: attend() takes the banded fast path for the whole sequence and the
  // masked reference (one row of scores per query) for a suffix.
  const auto q_pos = q_from == 0 ? pos : pos.narrow(0, q_from, T - q_from);
  std::vector<torch::Tensor> outs;
  for (const GridGroup& g : groups) {
    torch::Tensor ek, ev;
    if (comp) {
      ComponentScope scope(Component::kCompressor);
      std::tie(ek, ev) = comp->pool(tokens.heads(g.head0, g.heads), 0, 0,
                                    complete_entries(g.attn, T), g.attn.grid_offset);
    }
    torch::Tensor rk, rv;
    if (uses_raw()) rk = p.k.narrow(1, g.head0, g.heads), rv = p.v.narrow(1, g.head0, g.heads);
    auto q = p.q.narrow(1, g.head0 * Gq, g.heads * Gq);
    auto sk = sink.defined() ? sink.narrow(0, g.head0 * Gq, g.heads * Gq) : sink;
    if (indexer) {  // one grid (validated): the whole layer
      auto idx = indexer->project(x, 0);
      outs.push_back(attend_indexed(idx, indexer->pool(idx.keys, 0, 0, ek.size(2)), q, pos, ek,
                                    ev, rk, rv, pos, sk));
      continue;
    }
    // The training forward: attend() takes the banded fast path unless the reference is selected.
    outs.push_back(attend(g.attn, q, q_pos, ek, ev, rk, rv, pos, sk));
  }
  return outs.size() == 1 ? outs[0] : torch::cat(outs, 1);
}

// The pool weights of the entries complete in every group (all of them with one grid), the
// heads of every group side by side.
void AttentionImpl::capture_gates(const CompressorTokens& tokens, int64_t T,
                                  AttentionProbe& probe) {
  int64_t E = complete_entries(groups[0].attn, T);
  for (const GridGroup& g : groups) E = std::min(E, complete_entries(g.attn, T));
  auto weights = [&](bool value_side) {
    std::vector<torch::Tensor> parts;
    for (const GridGroup& g : groups)
      parts.push_back(comp->pool_weights(tokens.heads(g.head0, g.heads), 0, 0, E,
                                         g.attn.grid_offset, value_side)
                          .detach());
    return parts.size() == 1 ? parts[0] : torch::cat(parts, 3);
  };
  probe.gate_k = weights(false);
  if (!cfg.tied_kv) probe.gate_v = tokens.gv.defined() ? weights(true) : probe.gate_k;
}

LayerCache& AttentionImpl::index_cache(LayerCache& c) {
  if (c.index.empty()) c.index.resize(1);
  return c.index[0];
}

LayerCache& AttentionImpl::group_cache(LayerCache& c, size_t g) const {
  if (groups.size() == 1) return c;
  if (c.groups.size() != groups.size()) c.groups.resize(groups.size());
  return c.groups[g];
}

torch::Tensor AttentionImpl::forward_cached(const torch::Tensor& x, LayerCache& c) {
  const int64_t Tn = x.size(1), t0 = c.n_tokens, t_end = t0 + Tn, Gq = n_heads / n_kv;
  auto opts = torch::TensorOptions().dtype(torch::kInt64).device(x.device());
  auto pos = torch::arange(t0, t_end, opts);
  auto p = project(x, pos);
  CompressorTokens tokens;
  if (comp) tokens = comp->project(x, p.k_lin, p.v_lin, t0);
  std::vector<torch::Tensor> outs;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const GridGroup& g = groups[gi];
    const AttentionConfig& a = g.attn;
    LayerCache& cg = group_cache(c, gi);
    // Tied K/V (V4's shared latent) stores each entry once: its value is its key.
    if (comp) extend_entries(*comp, a, tokens.heads(g.head0, g.heads), cg, t_end, !a.tied_kv);
    if (uses_raw()) {
      cg.raw_k.append(p.k.narrow(1, g.head0, g.heads));
      cg.raw_v.append(p.v.narrow(1, g.head0, g.heads));
    }
    cg.n_tokens = t_end;  // after extend_entries, which reads the position before these tokens
    auto q = p.q.narrow(1, g.head0 * Gq, g.heads * Gq);
    auto sk = sink.defined() ? sink.narrow(0, g.head0 * Gq, g.heads * Gq) : sink;
    CachedKeys keys{cg.entry_keys(), a.tied_kv ? cg.entry_keys() : cg.entry_values(),
                    cg.raw_keys(), cg.raw_values(), cg.raw_start()};
    if (indexer) {
      LayerCache& ic = index_cache(cg);
      auto idx = indexer->project(x, t0);
      extend_entries(*indexer->comp, a, idx.keys, ic, t_end, false);
      ic.n_tokens = t_end;
      auto r_pos = torch::arange(cg.raw_start(), t_end, opts);
      // No entry finished yet: an empty key set of the indexer's shape (the buffer is unset).
      auto ik = ic.n_entries() > 0 ? ic.entry_keys()
                                   : torch::zeros({x.size(0), 1, 0, indexer->dim}, x.options());
      // Streaming reads each query's top-k entries only (attend_indexed.h); the full forward's
      // masked core gives the same result and the indexer's training target.
      auto top = top_entries(a, indexer->scores(idx, ik), pos);
      outs.push_back(
          attend_gathered(a, q, pos, keys.ek, keys.ev, keys.rk, keys.rv, r_pos, sk, top));
    } else if (attention_path() == AttentionPath::kFast) {
      outs.push_back(attend_cached(a, q, t0, keys, sk, cg.scratch));
    } else {  // the masked reference, for comparisons
      auto r_pos = torch::arange(cg.raw_start(), t_end, opts);
      outs.push_back(
          attend_reference(a, q, pos, keys.ek, keys.ev, keys.rk, keys.rv, r_pos, sk));
    }
    if (uses_raw()) cg.drop_raw_before(raw_keep_from(a, t_end));
  }
  c.n_tokens = t_end;
  return output(outs.size() == 1 ? outs[0] : torch::cat(outs, 1));
}

void AttentionImpl::reserve(LayerCache& c, int64_t n_tokens) const {
  // Only the parts that grow with the context; the sliding raw window and the pending tokens
  // settle at a fixed capacity after their first few feeds.
  const int64_t Gq = n_heads / n_kv;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const AttentionConfig& a = groups[gi].attn;
    LayerCache& cg = group_cache(c, gi);
    if (a.kind == AttentionKind::kFull) {
      cg.raw_k.reserve(n_tokens);
      cg.raw_v.reserve(n_tokens);
    }
    const int64_t entries = comp ? complete_entries(a, n_tokens) : 0;
    cg.ent_k.reserve(entries);
    if (!a.tied_kv) cg.ent_v.reserve(entries);
    if (indexer) index_cache(cg).ent_k.reserve(entries);
    // Decode scores: one row per query head, a column per visible key and the sink.
    const int64_t raw = uses_raw() ? n_tokens - raw_keep_from(a, n_tokens) + 1 : 0;
    cg.scratch.reserve(groups[gi].heads * Gq * (entries + raw + 1));
  }
}

}  // namespace phasekv
