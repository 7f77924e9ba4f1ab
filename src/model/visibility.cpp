#include "model/visibility.h"

namespace phasekv {

torch::Tensor entry_visibility(const AttentionConfig& a, const torch::Tensor& q_pos, int64_t j0,
                               int64_t n_entries) {
  auto j = torch::arange(j0, j0 + n_entries, q_pos.options());
  auto limit = (q_pos + 1 + a.grid_offset).div(a.stride, "floor");
  return j.unsqueeze(0) < limit.unsqueeze(1);
}

torch::Tensor raw_visibility(const AttentionConfig& a, const torch::Tensor& q_pos,
                             const torch::Tensor& r_pos) {
  auto t = q_pos.unsqueeze(1);
  auto p = r_pos.unsqueeze(0);
  auto causal = p <= t;
  if (a.kind == AttentionKind::kFull) return causal;
  auto in_window = causal & (p > t - a.n_win);
  if (a.kind == AttentionKind::kWindow || !a.uncompressed_tail) return in_window;
  auto tail_start = (t + 1 + a.grid_offset).div(a.stride, "floor") * a.stride - a.grid_offset;
  return in_window | (causal & (p >= tail_start));
}

int64_t raw_keep_from(const AttentionConfig& a, int64_t t_next) {
  if (a.kind == AttentionKind::kFull) return 0;
  int64_t from = t_next - a.n_win + 1;
  if (a.kind == AttentionKind::kChunked && a.uncompressed_tail)
    from = std::min(from, visible_entries(a, t_next) * a.stride - a.grid_offset);
  return std::max<int64_t>(from, 0);
}

}  // namespace phasekv
