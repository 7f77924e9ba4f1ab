#include "perf/flops.h"

#include <algorithm>

namespace phasekv {

int64_t visible_keys(const AttentionConfig& a, int64_t t) {
  switch (a.kind) {
    case AttentionKind::kFull:
      return t + 1;
    case AttentionKind::kWindow:
      return std::min<int64_t>(t + 1, a.n_win);
    case AttentionKind::kChunked: {
      const int64_t S = a.stride, all = (t + 1 + a.grid_offset) / S;
      // An indexed layer attends only its top-k entries (its indexer scores them all: below).
      const int64_t entries = a.indexed() ? std::min<int64_t>(all, a.index_topk) : all;
      int64_t raw = std::min<int64_t>(t + 1, a.n_win);
      // tail: [S e - o, t]
      if (a.uncompressed_tail) raw = std::max(raw, t + 1 - (S * all - a.grid_offset));
      return entries + raw;
    }
  }
  return 0;
}

namespace {

// Per-token matmul parameters of one layer (multiply-adds per token).
double layer_linear_macs(const ModelConfig& m, const AttentionConfig& a) {
  const double D = m.d_model, q = double(m.n_heads) * m.head_dim,
               kv = double(m.n_kv_heads) * m.head_dim, F = m.d_ff;
  double macs = D * q + 2 * D * kv + q * D + 3 * D * F;
  if (a.kind == AttentionKind::kChunked) {
    macs += 2.0 * (a.lanes() - 1) * D * kv;  // lane 1.. payload projections
    const double gate_rows = a.gate == GateKind::kScalar   ? double(a.width) * m.n_kv_heads
                             : a.gate == GateKind::kVector ? a.lanes() * kv
                                                           : 0;
    macs += (a.tied_kv_gates ? 1 : 2) * gate_rows * D;
  }
  if (a.indexed()) {  // the indexer: queries, head weights, its key lanes and gates
    const double di = a.index_dim;
    const double gate_rows = a.gate == GateKind::kScalar   ? double(a.width)
                             : a.gate == GateKind::kVector ? a.lanes() * di
                                                           : 0;
    macs += D * (a.index_heads * di + a.index_heads + a.lanes() * di + gate_rows);
  }
  return macs;
}

}  // namespace

ForwardFlops forward_flops(const ModelConfig& m, int64_t B, int64_t T) {
  ForwardFlops f;
  for (const auto& a : m.layers) {
    f.linear += 2.0 * layer_linear_macs(m, a) * double(B * T);
    // Per grid group (one without kv_head_offsets): its query heads see its grid's keys.
    for (const GridGroup& g : grid_groups(m, a)) {
      int64_t keys = 0;
      for (int64_t t = 0; t < T; ++t) keys += visible_keys(g.attn, t);
      const double q_heads = double(m.n_heads) * g.heads / m.n_kv_heads;
      // q.k and p.v: 2 matmuls of head_dim multiply-adds per (query head, key).
      f.attention += 2.0 * 2.0 * q_heads * m.head_dim * double(keys) * double(B);
    }
    if (a.indexed()) {  // the indexer scores every visible entry: one q.k per (head, entry)
      int64_t entries = 0;
      for (int64_t t = 0; t < T; ++t) entries += (t + 1) / a.stride;
      f.attention += 2.0 * a.index_heads * a.index_dim * double(entries) * double(B);
    }
  }
  f.lm_head = 2.0 * double(m.d_model) * m.vocab_size * double(B * T);
  return f;
}

double train_step_flops(const ModelConfig& m, int64_t B, int64_t T) {
  return 3.0 * forward_flops(m, B, T).total();
}

}  // namespace phasekv
