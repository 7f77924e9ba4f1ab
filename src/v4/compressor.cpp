#include "v4/compressor.h"

#include <limits>

#include "v4/hyper.h"

namespace phasekv::v4 {

namespace {

// The slot values and gates of every block: [n, slots, width] each.
std::pair<torch::Tensor, torch::Tensor> block_slots(const torch::Tensor& kv,
                                                    const torch::Tensor& gate, int64_t n,
                                                    int64_t ratio, bool overlap) {
  const int64_t lanes_width = kv.size(1);
  auto k = kv.narrow(0, 0, n * ratio).view({n, ratio, lanes_width});
  auto g = gate.narrow(0, 0, n * ratio).view({n, ratio, lanes_width});
  if (!overlap) return {k, g};
  const int64_t width = lanes_width / 2;
  // Lane 0 (channels [0, width)) is read by the next block, lane 1 by the block itself.
  auto prev_k = torch::cat(
      {torch::zeros({1, ratio, width}, kv.options()), k.narrow(0, 0, n - 1).narrow(2, 0, width)});
  auto prev_g = torch::cat(
      {torch::full({1, ratio, width}, -std::numeric_limits<double>::infinity(), gate.options()),
       g.narrow(0, 0, n - 1).narrow(2, 0, width)});
  return {torch::cat({prev_k, k.narrow(2, width, width)}, 1),
          torch::cat({prev_g, g.narrow(2, width, width)}, 1)};
}

}  // namespace

torch::Tensor compress_entries(const torch::Tensor& y, const CompressorWeights& w, int64_t ratio,
                               bool overlap, const RopeParams& rope, double norm_eps) {
  const int64_t T = y.size(0), n = T / ratio;
  const int64_t width = w.norm.size(0);
  if (n == 0) return torch::zeros({0, width}, y.options());
  auto kv = torch::matmul(y, w.wkv.t());
  auto slot = torch::arange(T, torch::kInt64).remainder(ratio);
  auto gate = torch::matmul(y, w.wgate.t()) + w.ape.index_select(0, slot);
  auto [values, gates] = block_slots(kv, gate, n, ratio, overlap);
  auto pooled = (torch::softmax(gates, 1) * values).sum(1);
  auto entries = rms_norm(pooled, norm_eps, w.norm);
  std::vector<int64_t> starts(n);
  for (int64_t b = 0; b < n; ++b) starts[b] = b * ratio;
  return rope_apply(entries, rope_table(rope, starts, y.scalar_type()));
}

torch::Tensor entry_visible(int64_t T, int64_t n, int64_t ratio) {
  auto visible_count = torch::div(torch::arange(1, T + 1, torch::kInt64), ratio, "floor");
  return torch::arange(n, torch::kInt64).unsqueeze(0) < visible_count.unsqueeze(1);
}

}  // namespace phasekv::v4
