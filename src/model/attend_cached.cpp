#include "model/attend_cached.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/attend_reference.h"
#include "model/fused.h"
#include "model/visibility.h"

namespace phasekv {
namespace {

// A prefill block's scores take about this much memory (more when kMinBlockRows rows need more:
// 16 MB for full attention at 64K): below glibc's 32 MiB mmap threshold (src/util/allocator.cpp),
// so that the blocks reuse heap memory instead of page-faulting a fresh mapping each (a whole
// 256-row chunk at 64K would be 256 rows x 64K keys x 4 heads = 256 MB).
constexpr int64_t kBlockScoreBytes = 8 << 20;
// Fewer rows make the score GEMMs inefficient; more only add masked work.
constexpr int64_t kMinBlockRows = 16, kMaxBlockRows = 256;

struct Dims {
  int64_t B, H, Hkv, G, Tq, hd;
  int64_t E, R;  // cached entries and raw tokens
  double scale;  // 1/sqrt(hd), applied to the queries as in attend_reference
};

int64_t len(const torch::Tensor& x) {
  return x.defined() ? x.size(2) : 0;
}

Dims dims_of(const torch::Tensor& q, const CachedKeys& keys) {
  Dims d;
  d.B = q.size(0);
  d.H = q.size(1);
  d.Tq = q.size(2);
  d.hd = q.size(3);
  d.E = len(keys.ek);
  d.R = len(keys.rk);
  d.Hkv = d.E > 0 ? keys.ek.size(1) : d.R > 0 ? keys.rk.size(1) : d.H;
  d.G = d.H / d.Hkv;
  d.scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  return d;
}

// [B, Hkv, n, hd] -> [B*Hkv, n, hd]; a view for the cache's buffers (narrowed along n only).
torch::Tensor batched(const torch::Tensor& x) {
  return x.reshape({-1, x.size(2), x.size(3)});
}

// Softmax over the last dim without a second full-size tensor.
void softmax_in_place(torch::Tensor& s) {
  s.sub_(s.amax(-1, /*keepdim=*/true)).exp_();
  s.div_(s.sum(-1, /*keepdim=*/true));
}

// True when the query at t sees every cached key: then no mask is needed. The session's cache
// holds exactly that after each step (it drops raw tokens before raw_keep_from and pools entries
// up to (t+1+o)/S), so this holds for every decode step; anything else takes the general path.
bool sees_all_cached(const AttentionConfig& a, int64_t t, const Dims& d, const CachedKeys& keys) {
  const int64_t entries = a.kind == AttentionKind::kChunked ? visible_entries(a, t) : 0;
  if (d.E + d.R == 0 || d.E != entries) return false;
  return d.R == 0 || (keys.r0 >= raw_keep_from(a, t) && keys.r0 + d.R == t + 1);
}

// Decode: one query, every key visible. Scores [B*Hkv, G, E + R (+ sink)] in the scratch.
torch::Tensor attend_one(const Dims& d, const torch::Tensor& q, const CachedKeys& keys,
                         const torch::Tensor& sink, Scratch& scratch) {
  const int64_t BK = d.B * d.Hkv, N = d.E + d.R + (sink.defined() ? 1 : 0);
  auto qg = q.reshape({BK, d.G, d.hd}) * d.scale;
  auto s = scratch.take({BK, d.G, N}, q.options());
  if (d.E > 0) bmm_into(s.narrow(2, 0, d.E), qg, batched(keys.ek), true, false);
  if (d.R > 0) bmm_into(s.narrow(2, d.E, d.R), qg, batched(keys.rk), true, false);
  if (sink.defined())
    s.view({d.B, d.Hkv, d.G, N}).narrow(3, N - 1, 1).copy_(sink.view({1, d.Hkv, d.G, 1}));
  softmax_in_place(s);
  auto out = torch::empty({BK, d.G, d.hd}, q.options());
  if (d.E > 0) bmm_into(out, s.narrow(2, 0, d.E), batched(keys.ev), false, false);
  if (d.R > 0) bmm_into(out, s.narrow(2, d.E, d.R), batched(keys.rv), false, d.E > 0);
  return out.view({d.B, d.H, 1, d.hd});
}

// The keys some row of the query block [u0, u1) can see. Visibility is an interval per row with
// non-decreasing ends, so the first row bounds the start and the last row the end.
struct BlockKeys {
  int64_t e_all = 0, e_end = 0;    // entries [0, e_all) seen by every row, [e_all, e_end) by some
  int64_t p_first = 0, p_end = 0;  // raw positions some row sees
};

BlockKeys block_keys(const AttentionConfig& a, const Dims& d, const CachedKeys& keys, int64_t u0,
                     int64_t u1) {
  BlockKeys b;
  b.e_end = std::min(d.E, visible_entries(a, u1 - 1));
  b.e_all = std::min(b.e_end, visible_entries(a, u0));
  if (d.R > 0) {
    b.p_first = std::max(keys.r0, raw_keep_from(a, u0));
    b.p_end = std::max(b.p_first, u1);
  }
  return b;
}

bool every_row_sees_a_key(const AttentionConfig& a, const Dims& d, int64_t u0, int64_t u1) {
  for (int64_t u = u0; u < u1; ++u) {
    const bool entry = std::min(d.E, visible_entries(a, u)) > 0;
    const bool raw = d.R > 0 && raw_keep_from(a, u) <= u;
    if (!entry && !raw) return false;
  }
  return true;
}

// Masks, in s5 = [B, Hkv, G, rows, columns] laid out as [entries 0..e_end, raw p_first..p_end,
// sink], only the columns that some rows of [u0, u1) see and others do not.
void mask_ragged(const AttentionConfig& a, torch::Tensor s5, const BlockKeys& b, int64_t u0,
                 int64_t u1) {
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(s5.device());
  auto u = torch::arange(u0, u1, i64).unsqueeze(1);  // [rows, 1]
  if (b.e_end > b.e_all) {  // entries completed by a later row of the block
    auto j = torch::arange(b.e_all, b.e_end, i64);
    s5.narrow(-1, b.e_all, b.e_end - b.e_all)
        .masked_fill_(j >= (u + 1 + a.grid_offset).div(a.stride, "floor"), -INFINITY);
  }
  const int64_t col0 = b.e_end;  // column of raw position p: col0 + p - p_first
  // Raw tokens that slid out of the window of some rows: p < raw_keep_from(a, u).
  const int64_t old_end = std::min(raw_keep_from(a, u1 - 1), b.p_end);
  if (old_end > b.p_first) {
    std::vector<int64_t> lo;
    for (int64_t t = u0; t < u1; ++t) lo.push_back(raw_keep_from(a, t));
    auto first = torch::tensor(lo, i64).unsqueeze(1);
    auto p = torch::arange(b.p_first, old_end, i64);
    s5.narrow(-1, col0, old_end - b.p_first).masked_fill_(p < first, -INFINITY);
  }
  // Raw tokens in the future of some rows: p > u.
  const int64_t new_begin = std::max(u0 + 1, b.p_first);
  if (b.p_end > new_begin) {
    auto p = torch::arange(new_begin, b.p_end, i64);
    s5.narrow(-1, col0 + new_begin - b.p_first, b.p_end - new_begin).masked_fill_(p > u, -INFINITY);
  }
}

// One block of query rows qb [B, Hkv, G, rows, hd] (scaled) at positions u0.. -> same shape.
torch::Tensor attend_block(const AttentionConfig& a, const Dims& d, const torch::Tensor& qb,
                           const CachedKeys& keys, const torch::Tensor& sink, int64_t u0) {
  const int64_t rows = qb.size(3), u1 = u0 + rows;
  const BlockKeys b = block_keys(a, d, keys, u0, u1);
  const int64_t ne = b.e_end, nr = b.p_end - b.p_first;
  // Grouped-query attention as one GEMM per KV head: the G query heads' rows stacked. Scores
  // [B*Hkv, G*rows, entries | raw | sink] are written in place, column range by column range, from
  // the cache's own buffers (bmm_into: no copies of the keys).
  const int64_t BK = d.B * d.Hkv, R = d.G * rows, N = ne + nr + (sink.defined() ? 1 : 0);
  auto q_rows = qb.reshape({BK, R, d.hd});
  auto s = torch::empty({BK, R, N}, qb.options());
  torch::Tensor rv;
  if (ne > 0) bmm_into(s.narrow(2, 0, ne), q_rows, batched(keys.ek.narrow(2, 0, ne)), true, false);
  if (nr > 0) {
    rv = batched(keys.rv.narrow(2, b.p_first - keys.r0, nr));
    bmm_into(s.narrow(2, ne, nr), q_rows, batched(keys.rk.narrow(2, b.p_first - keys.r0, nr)), true,
             false);
  }
  if (sink.defined()) {
    s.view({d.B, d.Hkv, d.G, rows, N})
        .narrow(4, N - 1, 1)
        .copy_(sink.to(qb.scalar_type()).view({1, d.Hkv, d.G, 1, 1}));
  }
  mask_ragged(a, s.view({d.B, d.Hkv, d.G, rows, N}), b, u0, u1);
  softmax_in_place(s);
  auto out = torch::empty({BK, R, d.hd}, qb.options());
  if (ne > 0) bmm_into(out, s.narrow(2, 0, ne), batched(keys.ev.narrow(2, 0, ne)), false, false);
  if (nr > 0) bmm_into(out, s.narrow(2, ne, nr), rv, false, ne > 0);
  return out.view({d.B, d.Hkv, d.G, rows, d.hd});
}

// attend_reference for a block containing a query that sees no key (chunked, n_win = 0, t < S-1):
// its masks give such a row 0 instead of a softmax over nothing.
torch::Tensor reference_block(const AttentionConfig& a, const Dims& d, const torch::Tensor& q,
                              int64_t t0, int64_t b0, int64_t rows, const CachedKeys& keys,
                              const torch::Tensor& sink) {
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(q.device());
  auto q_pos = torch::arange(t0 + b0, t0 + b0 + rows, i64);
  auto r_pos = torch::arange(keys.r0, keys.r0 + d.R, i64);
  auto out = attend_reference(a, q.narrow(2, b0, rows), q_pos, keys.ek, keys.ev, keys.rk, keys.rv,
                              r_pos, sink);
  return out.reshape({d.B, d.Hkv, d.G, rows, d.hd});
}

int64_t block_rows(const Dims& d, int64_t elem) {
  const int64_t bytes_per_row = d.B * d.H * (d.E + d.R + 1) * elem;
  return std::clamp<int64_t>(kBlockScoreBytes / bytes_per_row, kMinBlockRows, kMaxBlockRows);
}

// Several queries: blocks of rows, each against the keys its rows can see.
torch::Tensor attend_blocks(const AttentionConfig& a, const Dims& d, const torch::Tensor& q,
                            int64_t t0, const CachedKeys& keys, const torch::Tensor& sink) {
  auto qg = q.reshape({d.B, d.Hkv, d.G, d.Tq, d.hd}) * d.scale;
  auto out = torch::empty({d.B, d.Hkv, d.G, d.Tq, d.hd}, q.options());
  const int64_t step = block_rows(d, q.element_size());
  for (int64_t b0 = 0; b0 < d.Tq; b0 += step) {
    const int64_t rows = std::min(step, d.Tq - b0), u0 = t0 + b0;
    auto dst = out.narrow(3, b0, rows);
    if (every_row_sees_a_key(a, d, u0, u0 + rows))
      dst.copy_(attend_block(a, d, qg.narrow(3, b0, rows), keys, sink, u0));
    else
      dst.copy_(reference_block(a, d, q, t0, b0, rows, keys, sink));
  }
  return out.view({d.B, d.H, d.Tq, d.hd});
}

}  // namespace

torch::Tensor attend_cached(const AttentionConfig& a, const torch::Tensor& q, int64_t t0,
                            const CachedKeys& keys, const torch::Tensor& sink, Scratch& scratch) {
  TORCH_CHECK(a.kv_head_offsets.empty(), kOneGridOnly);
  const Dims d = dims_of(q, keys);
  if (d.Tq == 1 && sees_all_cached(a, t0, d, keys)) return attend_one(d, q, keys, sink, scratch);
  return attend_blocks(a, d, q, t0, keys, sink);
}

}  // namespace phasekv
