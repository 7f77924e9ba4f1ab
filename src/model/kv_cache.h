// The streaming cache of one attention layer: raw keys/values of the tokens still visible raw,
// the compressed entries emitted so far, and the compressor's partial window (projected tokens
// not yet pooled into every entry they belong to; with W > S a token feeds ceil(W/S) entries).
#pragma once
#include <torch/torch.h>

#include "model/compressor.h"

namespace phasekv {

struct LayerCache {
  torch::Tensor raw_k, raw_v;  // [B, Hkv, R, hd], RoPE applied (raw_k)
  torch::Tensor raw_pos;       // [R] int64 absolute positions
  torch::Tensor ent_k, ent_v;  // [B, Hkv, E, hd]: entries 0 .. E-1, finished
  CompressorTokens pending;    // projected tokens from absolute position pending_start on
  int64_t pending_start = 0;
  int64_t n_tokens = 0;  // tokens seen so far (= next absolute position)

  int64_t n_entries() const { return ent_k.defined() ? ent_k.size(2) : 0; }
  int64_t n_raw() const { return raw_k.defined() ? raw_k.size(2) : 0; }
  // Bytes held, by part.
  int64_t raw_bytes() const;
  int64_t entry_bytes() const;
  int64_t pending_bytes() const { return pending.bytes(); }
  int64_t bytes() const { return raw_bytes() + entry_bytes() + pending_bytes(); }
};

}  // namespace phasekv
