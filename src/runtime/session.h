// A streaming inference session: prefill a prompt in chunks of any size, then decode token by
// token, holding one LayerCache per layer. Its logits equal the full-sequence forward.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "model/decoder.h"

namespace phasekv {

struct LayerBytes {
  int64_t raw = 0, entries = 0, pending = 0;
  int64_t scratch = 0;  // reserved bytes only: the decode step's reusable scores
  int64_t total() const { return raw + entries + pending + scratch; }
};

class Session {
 public:
  explicit Session(Decoder model);

  // Appends tokens (a chunk of any length, aligned to S or not); returns their logits [Tn, V].
  torch::Tensor feed(const std::vector<int64_t>& tokens);
  // One token; returns its logits [V].
  torch::Tensor decode(int64_t token);
  int64_t position() const { return caches_.empty() ? 0 : caches_[0].n_tokens; }
  // Bytes the caches use: what cache_bytes_theory predicts.
  std::vector<LayerBytes> cache_bytes() const;
  // Bytes the caches have allocated: the used bytes, spare capacity and the decode scratch.
  std::vector<LayerBytes> reserved_bytes() const;
  // Capacity for n_tokens tokens in total, allocated up front: a caller that knows the final
  // length gets no regrowth and no doubling slack (reserved close to used).
  void reserve(int64_t n_tokens);
  const std::vector<LayerCache>& caches() const { return caches_; }
  void reset();

 private:
  Decoder model_;
  std::vector<LayerCache> caches_;
};

// Bytes a layer's streaming cache holds after T tokens, from the retention rules alone
// (what `phasekv info` prints; the session's measured bytes must agree). elem: bytes per value.
LayerBytes cache_bytes_theory(const ModelConfig& m, const AttentionConfig& a, int64_t T,
                              int64_t elem);

}  // namespace phasekv
