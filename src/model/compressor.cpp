#include "model/compressor.h"

#include "model/fused.h"
#include "util/error.h"

namespace phasekv {

int64_t CompressorTokens::bytes() const {
  int64_t total = 0;
  for (const auto* t : {&pk, &pv, &gk, &gv})
    if (t->defined()) total += t->numel() * static_cast<int64_t>(t->element_size());
  return total;
}

CompressorTokens CompressorTokens::heads(int64_t h0, int64_t n) const {
  CompressorTokens out;
  auto part = [&](const torch::Tensor& t) { return t.defined() ? t.narrow(3, h0, n) : t; };
  out.pk = part(pk), out.pv = part(pv), out.gk = part(gk), out.gv = part(gv);
  return out;
}

CompressorImpl::CompressorImpl(const ModelConfig& model, const AttentionConfig& attn)
    : cfg(attn),
      n_kv(model.n_kv_heads),
      head_dim(model.head_dim),
      rope(model.head_dim, attn.entry_rope == EntryRope::kNone ? 0 : model.rotary_dims(),
           model.rope_theta) {
  const int64_t D = model.d_model, W = cfg.width, L = cfg.lanes(), kv = n_kv * head_dim;
  if (cfg.payload == PayloadKind::kPerSlot) {
    // The study's kernel: slot i's token enters the entry as C_i x (+ b_i with qkv_bias).
    payload_k = register_parameter("payload_k", torch::randn({W, kv, D}) * 0.02);
    if (model.qkv_bias) bias_payload_k = register_parameter("bias_payload_k", torch::zeros({W, kv}));
    if (!cfg.tied_kv) {
      payload_v = register_parameter("payload_v", torch::randn({W, kv, D}) * 0.02);
      if (model.qkv_bias)
        bias_payload_v = register_parameter("bias_payload_v", torch::zeros({W, kv}));
    }
  }
  for (int64_t l = 1; l < L && cfg.payload == PayloadKind::kShared; ++l) {
    // Lanes >= 1 are projections like lane 0's wk/wv, so they carry a bias when those do.
    const std::string lane = "lane" + std::to_string(l);
    lane_wk.push_back(register_module(lane + "_wk", make_linear(D, kv, model.qkv_bias)));
    if (!cfg.tied_kv)
      lane_wv.push_back(register_module(lane + "_wv", make_linear(D, kv, model.qkv_bias)));
  }
  lane_of_slot = (W - 1 - torch::arange(W, torch::kInt64)).div(cfg.stride, "floor");
  std::vector<int64_t> offsets(static_cast<size_t>(n_kv), cfg.grid_offset);
  if (!cfg.kv_head_offsets.empty()) offsets.assign(cfg.kv_head_offsets.begin(), cfg.kv_head_offsets.end());
  head_offset = torch::tensor(offsets, torch::kInt64);
  auto make_gate = [&](const std::string& suffix) {
    if (cfg.gate == GateKind::kScalar) {
      // One gate map per slot: the offset-specific scalar gate of the study's reference kernel.
      gate_k = register_parameter("gate_" + suffix, torch::randn({W, n_kv, D}) * 0.02);
      if (cfg.gate_bias) bias_k = register_parameter("bias_" + suffix, torch::zeros({W, n_kv}));
    } else {
      // DeepSeek-V4: one gate map per lane, a per-slot-per-channel bias ("ape").
      gate_k = register_parameter("gate_" + suffix, torch::randn({L, kv, D}) * 0.02);
      if (cfg.gate_bias)
        bias_k = register_parameter("bias_" + suffix, torch::zeros({W, n_kv, head_dim}));
    }
  };
  if (cfg.gate != GateKind::kMean) {
    make_gate("k");
    if (!cfg.tied_kv_gates && !cfg.tied_kv) {
      auto gk = gate_k, bk = bias_k;
      make_gate("v");
      gate_v = gate_k, bias_v = bias_k;
      gate_k = gk, bias_k = bk;
    }
  }
  if (cfg.entry_norm)
    k_norm = register_module("k_norm", std::make_shared<RMSNormImpl>(head_dim, model.norm_eps));
  if (cfg.payload_norm) {
    k_payload_norm = register_module("k_payload_norm",
                                     std::make_shared<RMSNormImpl>(head_dim, model.norm_eps));
    if (!cfg.tied_kv)
      v_payload_norm = register_module("v_payload_norm",
                                       std::make_shared<RMSNormImpl>(head_dim, model.norm_eps));
  }
}

int64_t CompressorImpl::entry_position(int64_t j, int64_t o) const {
  // With a grid offset o every position moves o earlier (entry 0's may be negative: RoPE is
  // defined there, and only differences to the query's position matter).
  switch (cfg.entry_rope) {
    case EntryRope::kStart:
      return j * cfg.stride - o;
    case EntryRope::kPrev:
      return (j - 1) * cfg.stride - o;
    case EntryRope::kLast:
      return j * cfg.stride + cfg.stride - 1 - o;
    case EntryRope::kNone:
      return 0;
  }
  return 0;
}

torch::Tensor CompressorImpl::gate_scores(const torch::Tensor& x, const torch::Tensor& gate,
                                          const torch::Tensor& bias) {
  const int64_t B = x.size(0), T = x.size(1), W = cfg.width;
  auto g = gate.to(x.scalar_type());
  torch::Tensor s;
  if (cfg.gate == GateKind::kScalar) {
    s = linear(x, g.reshape({-1, x.size(2)}), torch::Tensor()).view({B, T, W, n_kv});
  } else {
    s = linear(x, g.reshape({-1, x.size(2)}), torch::Tensor())
            .view({B, T, cfg.lanes(), n_kv, head_dim});
    s = s.index_select(2, lane_of_slot.to(x.device()));
  }
  return bias.defined() ? s + bias.to(s.scalar_type()) : s;
}

// Every slot's map applied to every token ([B, T, W, kv], one GEMM), then each token keeps the
// slot it occupies in each lane's entry: slot W - S(l+1) + (p + o) mod S for lane l, o the KV
// head's grid offset (heads on different grids see the same token in different slots).
torch::Tensor CompressorImpl::per_slot_payloads(const torch::Tensor& x, const torch::Tensor& maps,
                                                const torch::Tensor& bias, int64_t tok0) {
  const int64_t B = x.size(0), T = x.size(1), W = cfg.width, S = cfg.stride, L = cfg.lanes();
  const int64_t kv = n_kv * head_dim;
  auto all = linear(x, maps.to(x.scalar_type()).reshape({W * kv, x.size(2)}), torch::Tensor())
                 .view({B, T, W, kv});
  if (bias.defined()) all = all + bias.to(all.scalar_type());
  // (p + o) mod S per KV head, [T, 1, Hkv]: the token's place in its stride block, the grid
  // moved o earlier.
  auto p = (torch::arange(tok0, tok0 + T, torch::kInt64).unsqueeze(1) + head_offset.unsqueeze(0))
               .remainder(S)
               .unsqueeze(1);
  // A token's slot in lane l's entry; outside [0, W) when W is not a multiple of S and the token
  // is in no entry of that lane (W8/S6: lane 1 holds only the 2 tokens before each stride). Such
  // rows are never pooled, so the clamp only keeps the gather in bounds.
  auto lane = torch::arange(L, torch::kInt64).view({1, L, 1});
  auto slot = (p + (W - S) - S * lane).clamp(0, W - 1);  // [T, L, Hkv]
  auto idx = slot.to(x.device()).view({1, T, L, n_kv, 1}).expand({B, T, L, n_kv, head_dim});
  return all.view({B, T, W, n_kv, head_dim}).gather(2, idx);
}

CompressorTokens CompressorImpl::project(const torch::Tensor& x, const torch::Tensor& k_lin,
                                         const torch::Tensor& v_lin, int64_t tok0) {
  const int64_t B = x.size(0), T = x.size(1);
  CompressorTokens out;
  if (cfg.payload == PayloadKind::kPerSlot) {
    out.pk = per_slot_payloads(x, payload_k, bias_payload_k, tok0);
    if (!cfg.tied_kv) out.pv = per_slot_payloads(x, payload_v, bias_payload_v, tok0);
  } else {
    std::vector<torch::Tensor> ks{k_lin}, vs{v_lin};
    for (size_t l = 0; l < lane_wk.size(); ++l) ks.push_back(linear(x, lane_wk[l]));
    for (size_t l = 0; l < lane_wv.size(); ++l) vs.push_back(linear(x, lane_wv[l]));
    out.pk = torch::stack(ks, 2).view({B, T, cfg.lanes(), n_kv, head_dim});
    if (!cfg.tied_kv) out.pv = torch::stack(vs, 2).view({B, T, cfg.lanes(), n_kv, head_dim});
  }
  if (k_payload_norm) out.pk = k_payload_norm->forward(out.pk);
  if (v_payload_norm) out.pv = v_payload_norm->forward(out.pv);
  if (cfg.gate != GateKind::kMean) {
    out.gk = gate_scores(x, gate_k, bias_k);
    if (!cfg.tied_kv_gates && !cfg.tied_kv) out.gv = gate_scores(x, gate_v, bias_v);
  }
  return out;
}

// per_token: [B, T, ...] -> [B, n, W, ...], row e holding the W slots of entry j0+e.
torch::Tensor CompressorImpl::gather_slots(const torch::Tensor& per_token,
                                           const torch::Tensor& flat_idx, int64_t n) {
  auto g = per_token.index_select(1, flat_idx);
  std::vector<int64_t> shape{g.size(0), n, cfg.width};
  for (int64_t d = 2; d < g.dim(); ++d) shape.push_back(g.size(d));
  return g.view(shape);
}

// Each token carries its score for every slot; entry slot i needs the score for slot i of the
// token sitting there: the diagonal of [.., slot, score-slot, ..].
torch::Tensor CompressorImpl::gather_scores(const torch::Tensor& per_token,
                                            const torch::Tensor& flat_idx, int64_t n) {
  return torch::diagonal(gather_slots(per_token, flat_idx, n), 0, 2, 3).movedim(-1, 2);
}

// Softmax over the W slots (dim 2); slots before position 0 (only j = 0 when W > S) get -inf.
torch::Tensor CompressorImpl::weights(const torch::Tensor& scores, const torch::Tensor& valid,
                                      int64_t n, const torch::Tensor& like) {
  const int64_t W = cfg.width;
  if (!scores.defined()) {  // mean pooling over the valid slots
    auto v = valid.to(like.scalar_type());
    return (v / v.sum(1, true)).view({1, n, W, 1, 1});
  }
  if (scores.dim() == 4) {
    auto s = scores.masked_fill(~valid.view({1, n, W, 1}), -INFINITY);
    return torch::softmax(s, 2).unsqueeze(-1);
  }
  auto s = scores.masked_fill(~valid.view({1, n, W, 1, 1}), -INFINITY);
  return torch::softmax(s, 2);
}

torch::Tensor CompressorImpl::slot_positions(int64_t j0, int64_t j1, int64_t o) const {
  const int64_t S = cfg.stride, W = cfg.width;
  return torch::arange(j0, j1, torch::kInt64).unsqueeze(1) * S + (S - W - o) +
         torch::arange(W, torch::kInt64).unsqueeze(0);
}

torch::Tensor CompressorImpl::raw_pool_weights(const CompressorTokens& tokens, int64_t tok0,
                                               int64_t j0, int64_t j1, int64_t o,
                                               bool value_side) {
  const int64_t n = j1 - j0;
  auto dev = tokens.pk.device();
  auto pos = slot_positions(j0, j1, o);
  auto valid = (pos >= 0).to(dev);
  auto rel = (pos - tok0).clamp_min(0);
  if (n > 0) {
    int64_t hi = rel.max().item<int64_t>(),
            lo_valid = (pos.masked_select(pos >= 0) - tok0).min().item<int64_t>();
    if (lo_valid < 0 || hi >= tokens.length())
      throw Error("compressor: tokens [" + std::to_string(tok0) + ", " +
                  std::to_string(tok0 + tokens.length()) + ") do not cover entries [" +
                  std::to_string(j0) + ", " + std::to_string(j1) + ")");
  }
  auto flat = rel.flatten().to(dev);
  const torch::Tensor& per_token = value_side && tokens.gv.defined() ? tokens.gv : tokens.gk;
  torch::Tensor scores = per_token.defined() ? gather_scores(per_token, flat, n) : torch::Tensor();
  return weights(scores, valid, n, tokens.pk);
}

torch::Tensor CompressorImpl::pool_weights(const CompressorTokens& tokens, int64_t tok0,
                                           int64_t j0, int64_t j1, int64_t o, bool value_side) {
  auto a = raw_pool_weights(tokens, tok0, j0, j1, o, value_side);
  if (cfg.gate == GateKind::kVector) return a;
  // scalar: [B, n, W, Hkv, 1]; mean: [1, n, W, 1, 1]
  return a.squeeze(-1).expand({tokens.pk.size(0), j1 - j0, cfg.width, tokens.pk.size(3)});
}

std::pair<torch::Tensor, torch::Tensor> CompressorImpl::pool(const CompressorTokens& tokens,
                                                             int64_t tok0, int64_t j0, int64_t j1,
                                                             int64_t o) {
  const int64_t W = cfg.width, n = j1 - j0, B = tokens.pk.size(0), heads = tokens.pk.size(3);
  auto dev = tokens.pk.device();
  auto pos = slot_positions(j0, j1, o);
  auto valid = (pos >= 0).to(dev);
  auto flat = (pos - tok0).clamp_min(0).flatten().to(dev);

  auto a_k = raw_pool_weights(tokens, tok0, j0, j1, o, false);

  auto payload = [&](const torch::Tensor& per_token) {  // [B, n, W, Hkv, hd], lane picked per slot
    if (cfg.lanes() == 1) return gather_slots(per_token, flat, n).select(3, 0);
    // Each lane serves a run of consecutive slots (lane_of_slot is non-increasing): gather only
    // those slots from that lane. Gathering every lane and then picking one per slot moved twice
    // the data, and the pick's backward (scatter_add) cost more than the rest of the pooling.
    std::vector<torch::Tensor> runs;
    auto slots = flat.view({n, W});
    auto lane = lane_of_slot.accessor<int64_t, 1>();
    for (int64_t lo = 0, hi = 0; lo < W; lo = hi) {
      while (hi < W && lane[hi] == lane[lo]) ++hi;
      auto idx = slots.narrow(1, lo, hi - lo).flatten();
      runs.push_back(per_token.select(2, lane[lo])
                         .index_select(1, idx)
                         .view({B, n, hi - lo, heads, head_dim}));
    }
    return runs.size() == 1 ? runs[0] : torch::cat(runs, 2);
  };
  auto k = (a_k * payload(tokens.pk)).sum(2).transpose(1, 2);  // [B, Hkv, n, hd]
  if (k_norm) k = k_norm->forward(k);
  if (cfg.entry_rope != EntryRope::kNone && n > 0) {
    std::vector<int64_t> epos;
    for (int64_t j = j0; j < j1; ++j) epos.push_back(entry_position(j, o));
    k = rope.apply(k, torch::tensor(epos, torch::kInt64).to(dev));
  }
  if (cfg.tied_kv) return {k, k};  // the study's tied K/V: the value is the normalised, rotated key
  torch::Tensor a_v = a_k;
  if (tokens.gv.defined()) a_v = weights(gather_scores(tokens.gv, flat, n), valid, n, tokens.pk);
  auto v = (a_v * payload(tokens.pv)).sum(2).transpose(1, 2);
  return {k, v};
}

}  // namespace phasekv
