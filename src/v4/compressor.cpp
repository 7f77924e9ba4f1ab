#include "v4/compressor.h"

#include <limits>

#include "v4/hyper.h"

namespace phasekv::v4 {

namespace {

// Rows [from, from + count) of the cache as [count / ratio, ratio, lanes * width].
torch::Tensor blocks_of(const torch::Tensor& rows, int64_t start, int64_t from, int64_t count,
                        int64_t ratio) {
  return rows.narrow(0, from - start, count).view({count / ratio, ratio, rows.size(1)});
}

// The slot values and gates of blocks [b0, b0 + nb): [nb, slots, width] each.
std::pair<torch::Tensor, torch::Tensor> block_slots(const CompressorCache& c, int64_t b0,
                                                    int64_t nb, int64_t ratio, bool overlap) {
  auto k = blocks_of(c.kv, c.start, b0 * ratio, nb * ratio, ratio);
  auto g = blocks_of(c.gate, c.start, b0 * ratio, nb * ratio, ratio);
  if (!overlap) return {k, g};
  const int64_t width = c.kv.size(1) / 2;
  // Lane 0 (channels [0, width)) is read by the next block, lane 1 by the block itself.
  torch::Tensor prev_k, prev_g;
  if (b0 == 0) {  // block 0: an empty previous half
    prev_k =
        torch::cat({torch::zeros({1, ratio, 2 * width}, c.kv.options()), k.narrow(0, 0, nb - 1)});
    prev_g = torch::cat({torch::full({1, ratio, 2 * width},
                                     -std::numeric_limits<double>::infinity(), c.gate.options()),
                         g.narrow(0, 0, nb - 1)});
  } else {
    prev_k = blocks_of(c.kv, c.start, (b0 - 1) * ratio, nb * ratio, ratio);
    prev_g = blocks_of(c.gate, c.start, (b0 - 1) * ratio, nb * ratio, ratio);
  }
  return {torch::cat({prev_k.narrow(2, 0, width), k.narrow(2, width, width)}, 1),
          torch::cat({prev_g.narrow(2, 0, width), g.narrow(2, width, width)}, 1)};
}

torch::Tensor append_rows(const torch::Tensor& old, const torch::Tensor& rows) {
  return old.defined() ? torch::cat({old, rows}) : rows;
}

}  // namespace

void compress_append(CompressorCache& c, const torch::Tensor& y, int64_t p0,
                     const CompressorWeights& w, int64_t ratio, bool overlap,
                     const RopeParams& rope, double norm_eps) {
  const int64_t n = y.size(0), width = w.norm.size(0);
  if (!c.entries.defined()) c.entries = torch::zeros({0, width}, y.options());
  auto slot = torch::arange(p0, p0 + n, torch::kInt64).remainder(ratio);
  c.kv = append_rows(c.kv, torch::matmul(y, w.wkv.t()));
  c.gate = append_rows(c.gate, torch::matmul(y, w.wgate.t()) + w.ape.index_select(0, slot));
  const int64_t b0 = c.n_entries(), nb = (p0 + n) / ratio - b0;
  if (nb > 0) {
    auto [values, gates] = block_slots(c, b0, nb, ratio, overlap);
    auto pooled = rms_norm((torch::softmax(gates, 1) * values).sum(1), norm_eps, w.norm);
    std::vector<int64_t> starts(nb);
    for (int64_t b = 0; b < nb; ++b) starts[b] = (b0 + b) * ratio;
    c.entries =
        torch::cat({c.entries, rope_apply(pooled, rope_table(rope, starts, y.scalar_type()))});
  }
  // Keep the block in progress, and with overlap the last complete one (the next entry's lane 0).
  const int64_t keep = std::max<int64_t>(0, c.n_entries() * ratio - (overlap ? ratio : 0));
  if (keep > c.start) {
    c.kv = c.kv.narrow(0, keep - c.start, c.kv.size(0) - (keep - c.start));
    c.gate = c.gate.narrow(0, keep - c.start, c.gate.size(0) - (keep - c.start));
    c.start = keep;
  }
}

torch::Tensor compress_entries(const torch::Tensor& y, const CompressorWeights& w, int64_t ratio,
                               bool overlap, const RopeParams& rope, double norm_eps) {
  return compress_entries_batch(y.unsqueeze(0), w, ratio, overlap, rope, norm_eps).squeeze(0);
}

torch::Tensor compress_entries_batch(const torch::Tensor& y, const CompressorWeights& w,
                                     int64_t ratio, bool overlap, const RopeParams& rope,
                                     double norm_eps) {
  const int64_t B = y.size(0), nb = y.size(1) / ratio, width = w.norm.size(0);
  const int64_t lanes = w.wkv.size(0);
  if (nb == 0) return torch::zeros({B, 0, width}, y.options());
  auto head = y.narrow(1, 0, nb * ratio);
  auto slot = torch::arange(ratio, torch::kInt64).repeat({nb});
  auto kv = torch::matmul(head, w.wkv.t()).view({B, nb, ratio, lanes});
  auto gate =
      (torch::matmul(head, w.wgate.t()) + w.ape.index_select(0, slot)).view({B, nb, ratio, lanes});
  if (overlap) {  // block_slots: lane 0 of the previous block (empty for block 0), lane 1 its own
    auto previous = [&](const torch::Tensor& t, double empty) {
      return torch::cat(
                 {torch::full({B, 1, ratio, lanes}, empty, t.options()), t.narrow(1, 0, nb - 1)}, 1)
          .narrow(3, 0, width);
    };
    kv = torch::cat({previous(kv, 0.0), kv.narrow(3, width, width)}, 2);
    gate = torch::cat(
        {previous(gate, -std::numeric_limits<double>::infinity()), gate.narrow(3, width, width)},
        2);
  }
  auto pooled = rms_norm((torch::softmax(gate, 2) * kv).sum(2), norm_eps, w.norm);
  std::vector<int64_t> starts(nb);
  for (int64_t b = 0; b < nb; ++b) starts[b] = b * ratio;
  return rope_apply(pooled, rope_table(rope, starts, y.scalar_type()), false, /*pos_dim=*/1);
}

torch::Tensor entry_visible(int64_t p0, int64_t n_tokens, int64_t n, int64_t ratio) {
  auto visible_count =
      torch::div(torch::arange(p0 + 1, p0 + n_tokens + 1, torch::kInt64), ratio, "floor");
  return torch::arange(n, torch::kInt64).unsqueeze(0) < visible_count.unsqueeze(1);
}

}  // namespace phasekv::v4
