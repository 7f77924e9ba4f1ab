#include "model/attend_indexed.h"

#include <cmath>

#include "model/joint_softmax.h"
#include "model/visibility.h"

namespace phasekv {

TopEntries top_entries(const AttentionConfig& a, const torch::Tensor& scores,
                       const torch::Tensor& q_pos) {
  const int64_t E = scores.size(-1), K = std::min<int64_t>(a.index_topk, E);
  auto vis = entry_visibility(a, q_pos, 0, E).to(scores.device());  // [Tq, E]
  if (K == 0) {
    auto shape = scores.sizes().vec();
    shape.back() = 0;
    return {torch::empty(shape, scores.options().dtype(torch::kInt64)),
            torch::empty(shape, vis.options())};
  }
  // The K-th highest score is the threshold: every entry above it is in, and of the entries at
  // it the lowest indices fill the rest, so ties go to the lower index. (topk alone leaves the
  // order of ties unspecified; a full sort costs O(E log E) per query.) Invisible entries score
  // -inf: when fewer than K are visible, the threshold is -inf and the lowest invisible entries
  // fill slots that are marked invalid.
  auto masked = scores.detach().masked_fill(~vis, -INFINITY);
  auto thr = std::get<0>(masked.topk(K, -1, /*largest=*/true, /*sorted=*/false)).amin(-1, true);
  auto above = masked > thr;
  auto ties = masked == thr;
  auto room = K - above.sum(-1, /*keepdim=*/true);
  auto in = above | (ties & (ties.cumsum(-1) <= room));  // exactly K per row
  // Their indices in entry order: entry j goes to slot (number of selected entries before j);
  // the unselected all go to a spare slot K that is cut off.
  auto slot = (in.cumsum(-1) - 1).masked_fill(~in, K);
  auto shape = scores.sizes().vec();
  shape.back() = K + 1;
  auto index = torch::zeros(shape, slot.options())
                   .scatter_(-1, slot, torch::arange(E, slot.options()).expand_as(slot))
                   .narrow(-1, 0, K)
                   .contiguous();
  auto valid = vis.unsqueeze(0).expand(scores.sizes()).gather(-1, index);
  return {index, valid};
}

torch::Tensor attend_gathered(const AttentionConfig& a, const torch::Tensor& q,
                              const torch::Tensor& q_pos, const torch::Tensor& ek,
                              const torch::Tensor& ev, const torch::Tensor& rk,
                              const torch::Tensor& rv, const torch::Tensor& r_pos,
                              const torch::Tensor& sink, const TopEntries& selected) {
  TORCH_CHECK(a.kv_head_offsets.empty(), kOneGridOnly);
  const int64_t B = q.size(0), H = q.size(1), Tq = q.size(2), hd = q.size(3);
  const int64_t K = selected.index.size(-1);
  const bool has_e = ek.defined() && K > 0, has_r = rk.defined() && rk.size(2) > 0;
  if (!has_e && !has_r) return torch::zeros_like(q);
  const int64_t Hkv = has_e ? ek.size(1) : rk.size(1), G = H / Hkv;
  auto qg = q.reshape({B, Hkv, G, Tq, hd}) * (1.0 / std::sqrt(static_cast<double>(hd)));
  std::vector<torch::Tensor> scores, masks;
  torch::Tensor gv;
  if (has_e) {
    // Each query's K entries side by side: [B, Hkv, Tq, K, hd]. The G query heads of a KV head
    // share them, so they are the matrix side of one product per query (no copy per head).
    auto flat = selected.index.reshape({B, 1, Tq * K, 1}).expand({B, Hkv, Tq * K, hd});
    auto gk = ek.gather(2, flat).view({B, Hkv, Tq, K, hd});
    // Tied K/V (the value is the key) passes the same entries twice: gather them once.
    const bool same = ev.data_ptr() == ek.data_ptr() && ev.sizes() == ek.sizes() &&
                      ev.strides() == ek.strides();
    gv = same ? gk : ev.gather(2, flat).view({B, Hkv, Tq, K, hd});
    // [B, Hkv, Tq, K, hd] x [B, Hkv, Tq, hd, G] -> [B, Hkv, Tq, K, G] -> [B, Hkv, G, Tq, K]
    scores.push_back(torch::matmul(gk, qg.permute({0, 1, 3, 4, 2})).permute({0, 1, 4, 2, 3}));
    masks.push_back(selected.valid.view({B, 1, 1, Tq, K}));
  }
  if (has_r) {
    scores.push_back(torch::matmul(qg, rk.unsqueeze(2).transpose(-1, -2)));  // [.., Tq, R]
    auto raw = raw_visibility(a, q_pos, r_pos).to(q.device());
    masks.push_back(raw.view({1, 1, 1, Tq, raw.size(1)}).expand({B, 1, 1, Tq, raw.size(1)}));
  }
  auto mask = torch::cat(masks, -1);  // [B, 1, 1, Tq, K + R]
  auto p = joint_softmax(torch::cat(scores, -1), mask, mask.any(-1, /*keepdim=*/true), sink);
  torch::Tensor out;
  int64_t off = 0;
  if (has_e) {  // [B, Hkv, Tq, G, K] x [B, Hkv, Tq, K, hd] -> [B, Hkv, G, Tq, hd]
    out = torch::matmul(p.narrow(-1, 0, K).transpose(2, 3), gv).transpose(2, 3);
    off = K;
  }
  if (has_r) {
    auto o = torch::matmul(p.narrow(-1, off, rk.size(2)), rv.unsqueeze(2));
    out = out.defined() ? out + o : o;
  }
  return out.reshape({B, H, Tq, hd});
}

}  // namespace phasekv
