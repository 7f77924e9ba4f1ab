#include "model/attend_fast.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <vector>

#include "model/attend_reference.h"
#include "model/fused.h"
#include "model/visibility.h"

namespace phasekv {
namespace {

std::atomic<AttentionPath> g_path{AttentionPath::kFast};

// Causal attention longer than this is computed in query blocks of this many rows: block b only
// multiplies against keys [0, end of b), which halves the work and the saved probabilities.
constexpr int64_t kCausalBlock = 512;

// Query heads are grouped [Hkv, G]: query head h reads KV head h / G (GQA without copying K/V).
struct Dims {
  int64_t B, H, Hkv, G, T, hd;
  double scale;  // 1/sqrt(hd), applied to the queries as in the reference
};

// Raw visibility of a training forward as a band: raw token t - d is visible to query t iff
// 0 <= d < span, t - d >= 0 and (d < n_win or d < (t + 1 + tail_offset) mod tail_stride).
// ("span", not "width": W is the compressor's slots per entry.)
struct Band {
  int64_t span = 0;
  int64_t n_win = 0;        // the sliding window (full attention: the whole sequence)
  int64_t tail_stride = 0;  // > 0: the uncompressed tail of chunked layers is visible too
  int64_t tail_offset = 0;  // the layer's grid_offset
};

// How the raw band is laid out. Queries are cut into nblk blocks of Bq rows (the sequence padded
// to Tp = nblk * Bq); each row has `cols` band columns.
//  - diagonal (narrow bands): one block, column l is the key at offset d = l behind the row. The
//    scores are `span` elementwise q.k products: no GEMM, no wasted columns.
//  - blocked: column l of block b is position b*Bq - front + l, i.e. offset d = m + front - l
//    behind row m; cols = Bq + front keys cover every row's band with one GEMM per block, at the cost
//    of Bq - 1 masked columns per row.
struct Layout {
  int64_t T, Bq, nblk, Tp, cols;
  bool diagonal = false;
  int64_t front = 0;  // blocked: zero keys padded before position 0
};

bool is_arange(const torch::Tensor& pos, int64_t n) {
  if (!pos.defined() || pos.dim() != 1 || pos.size(0) != n || pos.scalar_type() != torch::kInt64)
    return false;
  return torch::equal(pos.cpu(), torch::arange(n, torch::kInt64));
}

// Softmax in at least f32: bf16 scores (autocast, bf16 models) lose too much in the
// normalisation. f64 (gradient checks) stays f64.
torch::ScalarType softmax_dtype(const torch::Tensor& q) {
  return q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

Band raw_band(const AttentionConfig& a, int64_t T) {
  Band b;
  switch (a.kind) {
    case AttentionKind::kFull:
      b.n_win = T;
      break;
    case AttentionKind::kWindow:
      b.n_win = a.n_win;
      break;
    case AttentionKind::kChunked:
      b.n_win = a.n_win;
      // The tail of query t is [S*floor((t+1+o)/S) - o, t]: at most S-1 tokens, all ending at t,
      // so window and tail together are still one band ending at t (no token counted twice).
      if (a.uncompressed_tail) b.tail_stride = a.stride, b.tail_offset = a.grid_offset;
      break;
  }
  b.n_win = std::min<int64_t>(b.n_win, T);
  b.span = std::min<int64_t>(T, std::max<int64_t>(b.n_win, b.tail_stride - 1));
  return b;
}

// Bands up to this span are computed diagonally: a few elementwise products beat small batched
// GEMMs, which libtorch's CPU bmm runs one BLAS call per matrix.
constexpr int64_t kMaxDiagonalSpan = 2;

// Blocked bands: larger blocks mean fewer, bigger GEMMs but more wasted (masked) columns.
int64_t block_rows(int64_t span) {
  return std::clamp<int64_t>(span, 16, 64);
}

Layout make_layout(int64_t T, int64_t span) {
  Layout l;
  l.T = T;
  l.diagonal = span > 0 && span <= kMaxDiagonalSpan;
  // No band, a diagonal one, or blocks that would cover most of the sequence: a single block.
  l.Bq = span == 0 || l.diagonal ? T : block_rows(span);
  if (2 * l.Bq >= T) l.Bq = T;
  l.nblk = (T + l.Bq - 1) / l.Bq;
  l.Tp = l.nblk * l.Bq;
  l.front = l.diagonal || l.nblk == 1 ? 0 : span - 1;  // one block starts at position 0
  l.cols = span == 0 ? 0 : (l.diagonal ? span : l.Bq + l.front);
  return l;
}

// [nblk, Bq, N] bool: which [entries, band] columns each (padded) query row may see.
torch::Tensor visible_columns(const AttentionConfig& a, const Band& band, const Layout& lay,
                              int64_t E, torch::Device device) {
  auto i64 = torch::TensorOptions().dtype(torch::kInt64).device(device);
  auto t = torch::arange(lay.Tp, i64).view({lay.nblk, lay.Bq, 1});
  std::vector<torch::Tensor> parts;
  if (E > 0)
    parts.push_back(torch::arange(E, i64) < (t + 1 + a.grid_offset).div(a.stride, "floor"));
  if (lay.cols > 0) {
    // The offset d behind the row of every band column (see Layout). Keys before position 0 are
    // zero padding (t - d < 0).
    auto l = torch::arange(lay.cols, i64);
    auto d = lay.diagonal ? l.view({1, 1, lay.cols})
                          : torch::arange(lay.Bq, i64).view({1, lay.Bq, 1}) + lay.front - l;
    auto rule = d < band.n_win;
    if (band.tail_stride > 0)
      rule = rule | (d < (t + 1 + band.tail_offset).remainder(band.tail_stride));
    parts.push_back((d >= 0) & (d < band.span) & (t - d >= 0) & rule);
  }
  return parts.size() == 1 ? parts[0] : torch::cat(parts, -1);
}

// Additive mask [nblk, Bq, N]: 0 where visible, -inf elsewhere. Added, not masked_fill'ed,
// because the add's backward is free. A row that sees nothing (chunked, n_win = 0, t < S - 1; or
// block padding) would softmax to NaN: like the reference, it "sees" everything and its output is
// zeroed afterwards (sees[t] false).
std::pair<torch::Tensor, torch::Tensor> column_bias(const torch::Tensor& visible,
                                                    torch::ScalarType dtype) {
  auto sees = visible.any(-1, /*keepdim=*/true);
  auto bias = torch::zeros(visible.sizes(), visible.options().dtype(dtype))
                  .masked_fill_(~(visible | ~sees), -INFINITY);
  return {bias, sees.flatten()};
}

// [B, H, T, hd] -> [B, Hkv, nblk, Bq*G, hd], scaled: the rows of one KV head ordered by (query,
// group), so a query block is one matrix and MQA (Hkv = 1) needs no transpose on the way out.
torch::Tensor blocked_queries(const torch::Tensor& q, const Dims& d, const Layout& lay) {
  auto qg = q.reshape({d.B, d.Hkv, d.G, d.T, d.hd}).permute({0, 1, 3, 2, 4}) * d.scale;
  if (lay.Tp > d.T) qg = torch::constant_pad_nd(qg, {0, 0, 0, 0, 0, lay.Tp - d.T});
  return qg.reshape({d.B, d.Hkv, lay.nblk, lay.Bq * d.G, d.hd}).contiguous();
}

// Blocked band: [B, Hkv, T, hd] -> overlapping blocks [B, Hkv, nblk, cols, hd]: block b holds
// positions b*Bq - front .. b*Bq + Bq - 1, zeros outside [0, T).
torch::Tensor raw_blocks(const torch::Tensor& x, const Layout& lay) {
  if (fused_kernels_apply(x)) return sliding_blocks(x, -lay.front, lay.Bq, lay.nblk, lay.cols);
  auto padded = torch::constant_pad_nd(x, {0, 0, lay.front, lay.Tp - lay.T});
  return padded.unfold(2, lay.cols, lay.Bq).transpose(-1, -2);
}

// Diagonal band: [B, Hkv, T, hd] -> the key at offset d behind each position, [B, Hkv, T, 1, hd]
// (zeros before position 0), ready to broadcast over the query group.
torch::Tensor shifted(const torch::Tensor& x, int64_t d) {
  const int64_t T = x.size(2);
  auto s = d == 0 ? x : torch::constant_pad_nd(x.narrow(2, 0, T - d), {0, 0, d, 0});
  return s.unsqueeze(3);
}

// Band scores [B, Hkv, nblk, Bq, G, cols]; qb is blocked_queries().
torch::Tensor band_scores(const Dims& d, const Layout& lay, const torch::Tensor& qb,
                          const torch::Tensor& rk) {
  if (!lay.diagonal) {
    auto s = batched_matmul(qb, raw_blocks(rk, lay), true);
    return s.view({d.B, d.Hkv, lay.nblk, lay.Bq, d.G, lay.cols});
  }
  auto qv = qb.view({d.B, d.Hkv, d.T, d.G, d.hd});
  if (fused_kernels_apply(qv))
    return band_diag_scores(qv, rk, lay.cols).view({d.B, d.Hkv, 1, d.T, d.G, lay.cols});
  std::vector<torch::Tensor> cols;
  for (int64_t off = 0; off < lay.cols; ++off) cols.push_back((qv * shifted(rk, off)).sum(-1));
  return torch::stack(cols, -1).view({d.B, d.Hkv, 1, d.T, d.G, lay.cols});
}

// Band output [B, Hkv, nblk, Bq*G, hd] from the band's probabilities pb [B, Hkv, nblk, Bq, G, cols].
torch::Tensor band_output(const Dims& d, const Layout& lay, const torch::Tensor& pb,
                          const torch::Tensor& rv) {
  if (!lay.diagonal) {
    auto p = pb.reshape({d.B, d.Hkv, lay.nblk, lay.Bq * d.G, lay.cols});
    return batched_matmul(p, raw_blocks(rv, lay), false);
  }
  if (fused_kernels_apply(rv)) {
    auto p = pb.reshape({d.B, d.Hkv, d.T, d.G, lay.cols});
    return band_diag_output(p, rv, lay.cols).view({d.B, d.Hkv, 1, d.T * d.G, d.hd});
  }
  // unbind, not select: its backward is one stack instead of a zero-filled tensor per column.
  auto cols = pb.view({d.B, d.Hkv, d.T, d.G, lay.cols}).unbind(-1);
  torch::Tensor o;
  for (int64_t off = 0; off < lay.cols; ++off) {
    auto term = cols[static_cast<size_t>(off)].unsqueeze(-1) * shifted(rv, off);
    o = o.defined() ? o.add_(term) : term;
  }
  return o.view({d.B, d.Hkv, 1, d.T * d.G, d.hd});
}

// Entries and the raw band in one softmax (chunked and window layers).
torch::Tensor attend_banded(const AttentionConfig& a, const Dims& d, const Band& band,
                            const torch::Tensor& q, const torch::Tensor& ek,
                            const torch::Tensor& ev, const torch::Tensor& rk,
                            const torch::Tensor& rv, const torch::Tensor& sink) {
  const int64_t E = ek.defined() ? ek.size(2) : 0;
  const int64_t span = rk.defined() ? band.span : 0;
  if (E == 0 && span == 0) return torch::zeros_like(q);
  const Layout lay = make_layout(d.T, span);
  const auto dtype = softmax_dtype(q);
  auto [bias, sees] = column_bias(visible_columns(a, band, lay, E, q.device()), dtype);

  auto qb = blocked_queries(q, d, lay);
  torch::Tensor se, sb;  // scores: [B, Hkv, Tp*G, E] and [B, Hkv, nblk, Bq, G, cols]
  if (E > 0) se = batched_matmul(qb.view({d.B, d.Hkv, lay.Tp * d.G, d.hd}), ek, true);
  if (span > 0) sb = band_scores(d, lay, qb, rk);
  const int64_t R = d.B * d.Hkv * lay.Tp * d.G;
  torch::Tensor pe, pb;  // probabilities: [R, E] and [R, cols]
  if (fused_kernels_apply(q)) {
    // One pass per row in f32 whatever the scores' dtype (model/fused.h): no f32 copies of the
    // scores, no concatenation, no split.
    std::tie(pe, pb) = banded_softmax(E > 0 ? se.reshape({R, E}) : torch::Tensor(),
                                      span > 0 ? sb.reshape({R, lay.cols}) : torch::Tensor(),
                                      bias.view({lay.Tp, -1}), sink, d.G, lay.Tp, d.Hkv);
  } else {
    // The same softmax composed from libtorch ops, for other dtypes and devices.
    std::vector<torch::Tensor> parts;
    if (E > 0) parts.push_back(se.reshape({R, E}).to(dtype));
    if (span > 0) parts.push_back(sb.reshape({R, lay.cols}).to(dtype));
    auto rows_bias = bias.view({1, 1, lay.Tp, 1, -1})
                         .expand({d.B, d.Hkv, lay.Tp, d.G, bias.size(-1)})
                         .reshape({R, -1});
    auto s = (parts.size() == 1 ? parts[0] : torch::cat(parts, -1)) + rows_bias;
    if (sink.defined()) {
      auto col = sink.to(dtype).view({1, d.Hkv, 1, d.G}).expand({d.B, d.Hkv, lay.Tp, d.G});
      s = torch::cat({s, col.reshape({R, 1})}, -1);
    }
    // split, not two narrows: split's backward is one cat, each narrow's a zero-filled tensor.
    std::vector<int64_t> sizes{E, lay.cols};
    if (sink.defined()) sizes.push_back(1);
    auto pieces = torch::softmax(s, -1).split_with_sizes(sizes, -1);
    pe = pieces[0];
    pb = pieces[1];
  }

  const auto vtype = (E > 0 ? ev : rv).scalar_type();
  torch::Tensor out;  // [B, Hkv, nblk, Bq*G, hd]
  if (E > 0) {
    auto p = pe.to(vtype).view({d.B, d.Hkv, lay.Tp * d.G, E});
    out = batched_matmul(p, ev, false).view({d.B, d.Hkv, lay.nblk, lay.Bq * d.G, d.hd});
  }
  if (span > 0) {
    auto p = pb.to(vtype).view({d.B, d.Hkv, lay.nblk, lay.Bq, d.G, lay.cols});
    auto o = band_output(d, lay, p, rv);
    out = out.defined() ? out.add_(o) : o;
  }
  // -> [B, Tp, H, hd] (a view when Hkv = 1), drop the padding, back to [B, H, T, hd].
  out = out.view({d.B, d.Hkv, lay.nblk, lay.Bq, d.G, d.hd})
            .permute({0, 2, 3, 1, 4, 5})
            .reshape({d.B, lay.Tp, d.H, d.hd})
            .narrow(1, 0, d.T);
  auto sees_real = sees.narrow(0, 0, d.T);
  if (!sees_real.all().item<bool>())
    out = out * sees_real.to(out.scalar_type()).view({1, -1, 1, 1});
  return out.transpose(1, 2);
}

// One query block [t0, t0 + n) of causal attention over keys [0, t0 + n).
torch::Tensor causal_block(const Dims& d, const torch::Tensor& qg, const torch::Tensor& k,
                           const torch::Tensor& v, const torch::Tensor& sink, int64_t t0,
                           int64_t n) {
  const int64_t t1 = t0 + n;
  const auto dtype = softmax_dtype(qg);
  auto qs = qg.narrow(3, t0, n).reshape({d.B, d.Hkv, d.G * n, d.hd});
  auto s = batched_matmul(qs, k.narrow(2, 0, t1), true);
  s = s.view({d.B, d.Hkv, d.G, n, t1}).to(dtype);
  // Row i (position t0 + i) sees keys p <= t0 + i: mask the strict upper triangle.
  auto opts = torch::TensorOptions().device(qg.device());
  auto future = torch::ones({n, t1}, opts.dtype(torch::kBool)).triu(t0 + 1);
  s.add_(torch::zeros({n, t1}, opts.dtype(dtype)).masked_fill_(future, -INFINITY));
  torch::Tensor p;
  if (sink.defined()) {
    auto col = sink.to(dtype).view({1, d.Hkv, d.G, 1, 1}).expand({d.B, d.Hkv, d.G, n, 1});
    p = torch::softmax(torch::cat({s, col}, -1), -1).split_with_sizes({t1, 1}, -1)[0];
  } else {
    p = torch::softmax(s, -1);
  }
  p = p.to(v.scalar_type());
  auto o = batched_matmul(p.reshape({d.B, d.Hkv, d.G * n, t1}), v.narrow(2, 0, t1), false);
  return o.view({d.B, d.Hkv, d.G, n, d.hd});
}

// Full causal attention (every query sees itself, so no row is empty).
torch::Tensor attend_causal(const Dims& d, const torch::Tensor& q, const torch::Tensor& rk,
                            const torch::Tensor& rv, const torch::Tensor& sink) {
  auto qg = q.reshape({d.B, d.Hkv, d.G, d.T, d.hd}) * d.scale;
  std::vector<torch::Tensor> blocks;
  for (int64_t t0 = 0; t0 < d.T; t0 += kCausalBlock)
    blocks.push_back(causal_block(d, qg, rk, rv, sink, t0, std::min(kCausalBlock, d.T - t0)));
  auto out = blocks.size() == 1 ? blocks[0] : torch::cat(blocks, 3);
  return out.reshape({d.B, d.H, d.T, d.hd});
}

}  // namespace

void set_attention_path(AttentionPath p) {
  g_path.store(p);
}
AttentionPath attention_path() {
  return g_path.load();
}

torch::Tensor attend_fast(const AttentionConfig& a, const torch::Tensor& q,
                          const torch::Tensor& q_pos, const torch::Tensor& ek,
                          const torch::Tensor& ev, const torch::Tensor& rk, const torch::Tensor& rv,
                          const torch::Tensor& r_pos, const torch::Tensor& sink) {
  TORCH_CHECK(a.kv_head_offsets.empty(), kOneGridOnly);
  const bool has_e = ek.defined() && ek.size(2) > 0, has_r = rk.defined() && rk.size(2) > 0;
  if (!has_e && !has_r) return torch::zeros_like(q);
  const int64_t T = q.size(2);
  // Only the training layout (queries and raw keys both at 0..T-1) has the band structure.
  const bool training =
      is_arange(q_pos, T) && (!has_r || r_pos.is_same(q_pos) || is_arange(r_pos, T));
  if (!training) return attend_reference(a, q, q_pos, ek, ev, rk, rv, r_pos, sink);

  Dims d;
  d.B = q.size(0);
  d.H = q.size(1);
  d.T = T;
  d.hd = q.size(3);
  d.Hkv = has_e ? ek.size(1) : rk.size(1);
  d.G = d.H / d.Hkv;
  d.scale = 1.0 / std::sqrt(static_cast<double>(d.hd));
  const Band band = raw_band(a, T);
  if (!has_e && band.n_win >= T) return attend_causal(d, q, rk, rv, sink);
  return attend_banded(a, d, band, q, has_e ? ek : torch::Tensor(), ev,
                       has_r ? rk : torch::Tensor(), rv, sink);
}

torch::Tensor attend(const AttentionConfig& a, const torch::Tensor& q, const torch::Tensor& q_pos,
                     const torch::Tensor& ek, const torch::Tensor& ev, const torch::Tensor& rk,
                     const torch::Tensor& rv, const torch::Tensor& r_pos,
                     const torch::Tensor& sink) {
  if (attention_path() == AttentionPath::kFast)
    return attend_fast(a, q, q_pos, ek, ev, rk, rv, r_pos, sink);
  return attend_reference(a, q, q_pos, ek, ev, rk, rv, r_pos, sink);
}

}  // namespace phasekv
