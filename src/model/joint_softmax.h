// The joint softmax the masked attention cores end with (attend_reference in
// model/attend_reference.h, attend_gathered in model/attend_indexed.h): one softmax over every key
// a query may use, plus the sink as an extra key of logit sink[h] and value 0.
#pragma once
#include <torch/torch.h>

#include <cmath>

namespace phasekv {

// s: scores [B, Hkv, G, Tq, N]; allowed: bool, broadcastable to s ([Tq, N] or [B, 1, 1, Tq, N]);
// sees_any: bool [..., Tq, 1], false for a query that sees no key at all (chunked, n_win = 0,
// t < S-1): it must output 0, not NaN, so it "sees" everything to keep the softmax finite and its
// weights are zeroed. sink: [Hkv * G] or undefined. Returns the weights [B, Hkv, G, Tq, N].
inline torch::Tensor joint_softmax(const torch::Tensor& s, const torch::Tensor& allowed,
                                   const torch::Tensor& sees_any, const torch::Tensor& sink) {
  const int64_t N = s.size(-1);
  auto m = s.masked_fill(~(allowed | ~sees_any), -INFINITY);
  if (sink.defined()) {
    std::vector<int64_t> col(s.sizes().begin(), s.sizes().end());
    col.back() = 1;
    m = torch::cat({m, sink.to(s.scalar_type()).view({1, s.size(1), s.size(2), 1, 1}).expand(col)},
                   -1);
  }
  return torch::softmax(m, -1).narrow(-1, 0, N) * sees_any.to(s.scalar_type());
}

}  // namespace phasekv
