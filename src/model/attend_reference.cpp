#include "model/attend_reference.h"

#include <cmath>
#include <vector>

#include "model/joint_softmax.h"
#include "model/visibility.h"

namespace phasekv {

torch::Tensor attend_reference(const AttentionConfig& a, const torch::Tensor& q,
                               const torch::Tensor& q_pos, const torch::Tensor& ek,
                               const torch::Tensor& ev, const torch::Tensor& rk,
                               const torch::Tensor& rv, const torch::Tensor& r_pos,
                               const torch::Tensor& sink, const torch::Tensor& entry_select,
                               torch::Tensor* entry_mass) {
  TORCH_CHECK(a.kv_head_offsets.empty(), kOneGridOnly);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), hd = q.size(3);
  const bool has_e = ek.defined() && ek.size(2) > 0, has_r = rk.defined() && rk.size(2) > 0;
  const int64_t E = has_e ? ek.size(2) : 0;
  if (entry_mass) *entry_mass = torch::zeros({B, Tq, E}, q.options());
  if (!has_e && !has_r) return torch::zeros_like(q);
  const int64_t Hkv = has_e ? ek.size(1) : rk.size(1), G = H / Hkv;
  // Grouped-query attention without copying K/V: query heads are grouped [B, Hkv, G, Tq, hd].
  auto qg = q.reshape({B, Hkv, G, Tq, hd}) * (1.0 / std::sqrt(static_cast<double>(hd)));
  std::vector<torch::Tensor> scores, masks;
  if (has_e) {
    scores.push_back(torch::matmul(qg, ek.unsqueeze(2).transpose(-1, -2)));
    masks.push_back(entry_visibility(a, q_pos, 0, E));
  }
  if (has_r) {
    scores.push_back(torch::matmul(qg, rk.unsqueeze(2).transpose(-1, -2)));
    masks.push_back(raw_visibility(a, q_pos, r_pos));
  }
  auto s = torch::cat(scores, -1);
  auto visible = torch::cat(masks, -1).to(q.device());  // [Tq, N]
  const int64_t N = s.size(-1);
  // An indexed query that sees an entry has at least one selected (index_topk >= 1), so the
  // selection keeps the set of queries that see something.
  auto sees_any = visible.any(-1, /*keepdim=*/true);
  auto weights = [&](const torch::Tensor& mask) {  // [Tq, N] or [B, 1, 1, Tq, N]
    return joint_softmax(s, mask, sees_any, sink);
  };
  torch::Tensor p;
  if (has_e && entry_select.defined()) {
    auto select = torch::ones({B, Tq, N}, visible.options());
    select.narrow(-1, 0, E).copy_(entry_select);
    p = weights((visible.unsqueeze(0) & select).view({B, 1, 1, Tq, N}));
  } else {
    p = weights(visible);
  }
  if (entry_mass && has_e) {
    torch::NoGradGuard no_grad;
    auto dense = entry_select.defined() ? weights(visible) : p;
    *entry_mass = dense.detach().narrow(-1, 0, E).sum({1, 2});
  }
  torch::Tensor out;
  int64_t off = 0;
  if (has_e) {
    out = torch::matmul(p.narrow(-1, 0, E), ev.unsqueeze(2));
    off = E;
  }
  if (has_r) {
    auto o = torch::matmul(p.narrow(-1, off, rk.size(2)), rv.unsqueeze(2));
    out = out.defined() ? out + o : o;
  }
  return out.reshape({B, H, Tq, hd});
}

}  // namespace phasekv
