// A DeepSeek-V4 model: its config and its tensors under the official names, and the full-sequence
// forward (autograd-capable: every float tensor may require grad).
//   X_0 = embed(token) copied into hc_mult streams
//   per layer: X = hc(X, attention(RMSNorm(hc_pre X))); X = hc(X, MoE(RMSNorm(hc_pre X)))
//   logits = head(RMSNorm(hc_head X))
// Multi-token-prediction (MTP) layers are not part of the model: a checkpoint's mtp.* tensors
// are skipped on load and not written.
#pragma once
#include <torch/torch.h>

#include <vector>

#include "v4/attention.h"
#include "v4/config.h"
#include "v4/weights.h"

namespace phasekv::v4 {

// What the model keeps between calls: every layer's attention cache (attention.h).
struct V4Cache {
  int64_t n_tokens = 0;
  std::vector<AttentionCache> layers;
  std::vector<torch::Tensor> expert_load;  // per layer [E] int64: assignments so far
};

class V4Model {
 public:
  // Every tensor of tensor_specs(cfg), zero (init_random fills them).
  explicit V4Model(V4Config cfg);

  // Seeded random weights (the same seed gives the same tensors on every machine).
  void init_random(uint64_t seed);
  // tokens [T] int64 in [0, vocab) -> logits [T, vocab]: the full forward (one call on an empty
  // cache).
  torch::Tensor forward(const torch::Tensor& tokens) const;
  // The next tokens after the cache's n_tokens; appends to the cache. Calls with any split of a
  // sequence give the full forward's logits.
  torch::Tensor forward(const torch::Tensor& tokens, V4Cache& cache) const;
  // tokens [B, T] -> logits [B, T, vocab]: the full forward of B sequences at once. The token-wise
  // parts (embedding, hyper-connections, norms, MoE, head) run on all B x T tokens together, the
  // attention as batched ops over the B sequences (attention_forward_batch); equal to B calls of
  // forward(tokens[b]) up to the rounding of larger matmuls. loads (optional): per layer [E]
  // int64, the expert assignments of all rows.
  torch::Tensor forward_batch(const torch::Tensor& tokens,
                              std::vector<torch::Tensor>* loads = nullptr) const;
  // The floating tensors (the hash tables are not parameters).
  std::vector<torch::Tensor> parameters() const;
  // Casts the floating tensors (f32 for runs and parity, f64 for gradient checks).
  void to(torch::ScalarType dtype);

  V4Config cfg;
  TensorMap tensors;

 private:
  // Throws Error unless tokens is an int64 tensor of `dims` dimensions with ids in the vocabulary.
  void check_tokens(const torch::Tensor& tokens, int64_t dims) const;
};

}  // namespace phasekv::v4
