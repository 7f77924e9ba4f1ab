// Model FLOPs of the phasekv decoder, for MFU: multiply-adds of the matmuls that the model's
// equations require (docs/ARCHITECTURE.md), counted as 2 FLOPs each. Attention counts only the
// keys a query may see (causal, window, entries), not what an implementation happens to compute,
// so a faster kernel cannot raise its own MFU by doing useless work. Norms, RoPE, softmax and
// gating elementwise work are left out (they are O(T D), not matmuls).
#pragma once
#include <cstdint>

#include "config/model_config.h"

namespace phasekv {

struct ForwardFlops {
  double linear = 0;     // per-token projections: attention, compressor lanes and gates, MLP
  double attention = 0;  // q.k and p.v over the visible keys
  double lm_head = 0;    // logits
  double total() const { return linear + attention + lm_head; }
};

// Keys (entries + raw tokens) a query at position t sees in a layer.
int64_t visible_keys(const AttentionConfig& a, int64_t t);

// Forward FLOPs for B sequences of T tokens at positions 0..T-1, logits at every position.
ForwardFlops forward_flops(const ModelConfig& m, int64_t B, int64_t T);

// One training step: forward + backward, backward = 2x forward (gradients for inputs and weights).
double train_step_flops(const ModelConfig& m, int64_t B, int64_t T);

}  // namespace phasekv
