// The streaming cache of one attention layer: raw keys/values of the tokens still visible raw,
// the compressed entries emitted so far, and the compressor's partial entry (projected tokens
// not yet pooled into every entry they belong to; with W > S a token feeds ceil(W/S) entries).
//
// Every part lives in a SeqBuffer (model/seq_buffer.h), written in place: a decode step copies
// only its own token (and, every S tokens, one entry) into spare capacity, instead of
// concatenating a new copy of the cache. The accessors return views of the used parts.
#pragma once
#include <torch/torch.h>

#include "model/compressor.h"
#include "model/seq_buffer.h"

namespace phasekv {

// The compressor's projected tokens, one SeqBuffer per CompressorTokens field (time is dim 1).
struct PendingTokens {
  SeqBuffer pk{1}, pv{1}, gk{1}, gv{1};

  int64_t length() const { return pk.length(); }
  void append(const CompressorTokens& t);
  void drop_front(int64_t n);
  CompressorTokens tokens() const;  // views of the used parts
  int64_t used_bytes() const;
  int64_t reserved_bytes() const;
};

struct LayerCache {
  SeqBuffer raw_k{2}, raw_v{2};  // [B, Hkv, R, hd], RoPE applied (raw_k): the last R tokens
  SeqBuffer ent_k{2}, ent_v{2};  // [B, Hkv, E, hd]: entries 0 .. E-1, finished
  PendingTokens pending;         // projected tokens from absolute position pending_start on
  int64_t pending_start = 0;
  int64_t n_tokens = 0;  // tokens seen so far (= next absolute position)
  Scratch scratch;       // the decode step's scores (model/attend_cached.h)
  // A layer with per-KV-head grids (kv_head_offsets) keeps one cache per grid group here and
  // leaves the parts above empty (n_tokens is kept in both); the byte counts include them.
  std::vector<LayerCache> groups;
  // An indexed layer (index_topk > 0) keeps its indexer's cache here (one element: the indexer
  // keys in ent_k and its pending tokens); the byte counts include it.
  std::vector<LayerCache> index;

  int64_t n_entries() const { return ent_k.length(); }
  int64_t n_raw() const { return raw_k.length(); }
  // Absolute position of raw token 0: the raw tokens are the last n_raw() tokens seen.
  int64_t raw_start() const { return n_tokens - n_raw(); }
  torch::Tensor entry_keys() const { return ent_k.view(); }
  torch::Tensor entry_values() const { return ent_v.view(); }
  torch::Tensor raw_keys() const { return raw_k.view(); }
  torch::Tensor raw_values() const { return raw_v.view(); }
  // Drops the raw tokens before absolute position `from` (no copy).
  void drop_raw_before(int64_t from);

  // Bytes in use, by part: what the retention rules say the cache holds.
  int64_t raw_bytes() const {
    return raw_k.used_bytes() + raw_v.used_bytes() + over_sub_caches(&LayerCache::raw_bytes);
  }
  int64_t entry_bytes() const {
    return ent_k.used_bytes() + ent_v.used_bytes() + over_sub_caches(&LayerCache::entry_bytes);
  }
  int64_t pending_bytes() const {
    return pending.used_bytes() + over_sub_caches(&LayerCache::pending_bytes);
  }
  int64_t bytes() const { return raw_bytes() + entry_bytes() + pending_bytes(); }
  // Bytes allocated, by part: the used bytes plus spare capacity (up to 2x with doubling, a few
  // n_win blocks for the sliding raw window), and the decode scratch.
  int64_t raw_reserved_bytes() const {
    return raw_k.reserved_bytes() + raw_v.reserved_bytes() +
           over_sub_caches(&LayerCache::raw_reserved_bytes);
  }
  int64_t entry_reserved_bytes() const {
    return ent_k.reserved_bytes() + ent_v.reserved_bytes() +
           over_sub_caches(&LayerCache::entry_reserved_bytes);
  }
  int64_t pending_reserved_bytes() const {
    return pending.reserved_bytes() + over_sub_caches(&LayerCache::pending_reserved_bytes);
  }
  int64_t scratch_bytes() const { return scratch.bytes() + over_sub_caches(&LayerCache::scratch_bytes); }

 private:
  int64_t over_sub_caches(int64_t (LayerCache::*part)() const) const {
    int64_t total = 0;
    for (const auto& g : groups) total += (g.*part)();
    for (const auto& g : index) total += (g.*part)();
    return total;
  }
};

}  // namespace phasekv
