#include "runtime/session.h"

#include <c10/core/InferenceMode.h>

#include "model/visibility.h"

namespace phasekv {

Session::Session(Decoder model) : model_(std::move(model)) {
  reset();
}

void Session::reset() {
  caches_.assign(model_->blocks.size(), LayerCache{});
}

torch::Tensor Session::feed(const std::vector<int64_t>& tokens) {
  // Inference mode, not just no-grad: the many small ops of a decode step skip version counters
  // and view tracking. Cache tensors become inference tensors (read-only outside this scope);
  // the returned logits are only read by callers.
  c10::InferenceMode inference;
  auto t = torch::tensor(tokens, torch::kInt64).unsqueeze(0);
  return model_->forward_cached(t, caches_).squeeze(0);
}

torch::Tensor Session::decode(int64_t token) {
  return feed({token}).squeeze(0);
}

std::vector<LayerBytes> Session::cache_bytes() const {
  std::vector<LayerBytes> out;
  for (const auto& c : caches_) out.push_back({c.raw_bytes(), c.entry_bytes(), c.pending_bytes()});
  return out;
}

std::vector<LayerBytes> Session::reserved_bytes() const {
  std::vector<LayerBytes> out;
  for (const auto& c : caches_)
    out.push_back({c.raw_reserved_bytes(), c.entry_reserved_bytes(), c.pending_reserved_bytes(),
                   c.scratch_bytes()});
  return out;
}

void Session::reserve(int64_t n_tokens) {
  for (size_t i = 0; i < caches_.size(); ++i)
    model_->blocks[i]->attn->reserve(caches_[i], n_tokens);
}

namespace {

// One grid group's cache (the whole layer without kv_head_offsets): `heads` KV heads on a's grid.
LayerBytes group_bytes(const ModelConfig& m, int64_t heads, const AttentionConfig& a, int64_t T,
                       int64_t elem) {
  const int64_t kv = heads * m.head_dim;
  const int64_t token_bytes = 2 * kv * elem;  // one K and one V vector (a raw token's size)
  LayerBytes b;
  const bool raw = a.kind != AttentionKind::kChunked || a.n_win > 0 || a.uncompressed_tail;
  if (raw) b.raw = std::max<int64_t>(0, T - raw_keep_from(a, T)) * token_bytes;
  if (a.kind != AttentionKind::kChunked || T == 0) return b;
  const int64_t S = a.stride, W = a.width, complete = complete_entries(a, T);
  // A key and a value per entry; one vector with tied_kv (the value is the key).
  b.entries = complete * (a.tied_kv ? 1 : 2) * kv * elem;
  // Partial entry: projected tokens from the next entry's first slot on, each holding one
  // payload pair per lane plus its gate scores for every slot.
  const int64_t pending = T - std::max<int64_t>(0, complete * S + S - W - a.grid_offset);
  // Per token: one payload per lane (key and value, or the key alone with tied_kv).
  int64_t per_token = a.lanes() * (a.tied_kv ? 1 : 2) * kv * elem;
  const int64_t gate = a.gate == GateKind::kScalar   ? W * heads
                       : a.gate == GateKind::kVector ? W * kv
                                                     : 0;
  per_token += (a.tied_kv_gates || a.tied_kv ? 1 : 2) * gate * elem;
  b.pending = std::max<int64_t>(pending, 0) * per_token;
  return b;
}

}  // namespace

LayerBytes cache_bytes_theory(const ModelConfig& m, const AttentionConfig& a, int64_t T,
                              int64_t elem) {
  // Groups on different grids hold different numbers of complete entries and pending tokens.
  LayerBytes total;
  for (const GridGroup& g : grid_groups(m, a)) {
    const LayerBytes b = group_bytes(m, g.heads, g.attn, T, elem);
    total.raw += b.raw, total.entries += b.entries, total.pending += b.pending;
  }
  if (a.indexed()) {  // the indexer's own compressed keys and pending tokens
    const LayerBytes b = group_bytes(indexer_model(m, a), 1, indexer_attention(a), T, elem);
    total.entries += b.entries, total.pending += b.pending;
  }
  return total;
}

}  // namespace phasekv
