// The banded attention's fused pieces as autograd nodes (fused.h): the joint softmax, the band's
// sliding key/value blocks and the narrow (diagonal) band.
#include "model/fused.h"
#include "model/fused_dispatch.h"

namespace phasekv {
namespace {

using namespace fused_detail;

struct BandedSoftmaxFn : torch::autograd::Function<BandedSoftmaxFn> {
  // se, sb: [R, E], [R, L] (E or L may be 0); sink: [H] or empty (libtorch 1.13's Function
  // does not take undefined inputs).
  static tensor_list forward(AutogradContext* ctx, const torch::Tensor& se_in,
                             const torch::Tensor& sb_in, const torch::Tensor& bias_in,
                             const torch::Tensor& sink_in, int64_t G, int64_t Tp, int64_t Hkv) {
    auto se = se_in.contiguous(), sb = sb_in.to(se.scalar_type()).contiguous();
    auto bias = bias_in.to(torch::kFloat32).contiguous();
    const int64_t R = se.size(0), E = se.size(1), L = sb.size(1);
    TORCH_CHECK(sb.size(0) == R && bias.size(0) == Tp && bias.size(1) == E + L,
                "banded_softmax: scores [", R, ", ", E, "] and [", sb.size(0), ", ", L,
                "], bias ", bias.sizes(), " for Tp = ", Tp);
    const auto acc = acc_dtype(se.scalar_type());
    const bool has_sink = sink_in.numel() > 0;
    auto sink = has_sink ? sink_in.to(acc).contiguous() : torch::Tensor();
    auto p = torch::empty({R, E + L + (has_sink ? 1 : 0)}, se.options().dtype(acc));
    auto pe = torch::empty({R, E}, se.options()), pb = torch::empty({R, L}, se.options());
    dispatch(se, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::banded_softmax_forward<T>(ptr_or_null<T>(se), ptr_or_null<T>(sb), ptr<float>(bias),
                                   ptr_or_null<k::Acc<T>>(sink), ptr<k::Acc<T>>(p),
                                   ptr_or_null<T>(pe),
                                   ptr_or_null<T>(pb), R, E, L, G, Tp, Hkv);
    });
    ctx->save_for_backward({p});
    ctx->saved_data["shape"] = std::vector<int64_t>{E, L, G, Tp, Hkv};
    ctx->saved_data["sink_dtype"] =
        static_cast<int64_t>(has_sink ? sink_in.scalar_type() : torch::kFloat32);
    ctx->saved_data["has_sink"] = has_sink;
    ctx->saved_data["dtype"] = static_cast<int64_t>(se.scalar_type());
    return {pe, pb};
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto p = ctx->get_saved_variables()[0];
    auto shape = ctx->saved_data["shape"].toIntVector();
    const int64_t E = shape[0], L = shape[1], G = shape[2], Tp = shape[3], Hkv = shape[4];
    const int64_t R = p.size(0);
    const bool has_sink = ctx->saved_data["has_sink"].toBool();
    const auto dtype = static_cast<torch::ScalarType>(ctx->saved_data["dtype"].toInt());
    auto as_input = [&](const torch::Tensor& g) {
      return g.defined() ? g.to(dtype).contiguous() : torch::Tensor();
    };
    auto dpe = as_input(grads[0]), dpb = as_input(grads[1]);
    auto opts = p.options().dtype(dtype);
    auto dse = torch::empty({R, E}, opts), dsb = torch::empty({R, L}, opts);
    auto dsink = has_sink ? torch::zeros({Hkv * G}, p.options()) : torch::Tensor();
    dispatch(dse, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::banded_softmax_backward<T>(ptr<k::Acc<T>>(p), ptr_or_null<T>(dpe), ptr_or_null<T>(dpb),
                                    ptr_or_null<T>(dse), ptr_or_null<T>(dsb),
                                    ptr_or_null<k::Acc<T>>(dsink), R, E, L, G, Tp, Hkv);
    });
    if (has_sink)
      dsink = dsink.to(static_cast<torch::ScalarType>(ctx->saved_data["sink_dtype"].toInt()));
    return {dse, dsb, torch::Tensor(), dsink, torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// The part of block i of sliding_blocks inside [0, T): positions [lo, hi), at row lo - start.
struct BlockSpan {
  int64_t start, lo, hi;
};
BlockSpan block_span(int64_t i, int64_t first, int64_t step, int64_t length, int64_t T) {
  const int64_t start = first + i * step;
  return {start, std::max<int64_t>(start, 0), std::min(start + length, T)};
}

struct SlidingBlocksFn : torch::autograd::Function<SlidingBlocksFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x, int64_t first,
                               int64_t step, int64_t count, int64_t length) {
    const int64_t T = x.size(2);
    auto out = torch::zeros({x.size(0), x.size(1), count, length, x.size(3)}, x.options());
    for (int64_t i = 0; i < count; ++i) {
      auto [start, lo, hi] = block_span(i, first, step, length, T);
      if (hi > lo) out.select(2, i).narrow(2, lo - start, hi - lo).copy_(x.narrow(2, lo, hi - lo));
    }
    ctx->saved_data["args"] = std::vector<int64_t>{first, step, count, length, T};
    return out;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto a = ctx->saved_data["args"].toIntVector();
    const int64_t first = a[0], step = a[1], count = a[2], length = a[3], T = a[4];
    const auto& g = grads[0];
    auto dx = torch::zeros({g.size(0), g.size(1), T, g.size(4)}, g.options());
    for (int64_t i = 0; i < count; ++i) {
      auto [start, lo, hi] = block_span(i, first, step, length, T);
      if (hi > lo) dx.narrow(2, lo, hi - lo).add_(g.select(2, i).narrow(2, lo - start, hi - lo));
    }
    return {dx, torch::Tensor(), torch::Tensor(), torch::Tensor(), torch::Tensor()};
  }
};

// Sizes of a diagonal band call: q-like [B, Hkv, T, G, hd or L], kv [B, Hkv, T, hd].
struct DiagDims {
  int64_t BH, T, G, hd;
};
DiagDims diag_dims(const torch::Tensor& rows, const torch::Tensor& kv) {
  TORCH_CHECK(rows.dim() == 5 && kv.dim() == 4 && rows.size(0) == kv.size(0) &&
                  rows.size(1) == kv.size(1) && rows.size(2) == kv.size(2),
              "band_diag: rows ", rows.sizes(), " and keys/values ", kv.sizes(), " do not match");
  return {kv.size(0) * kv.size(1), kv.size(2), rows.size(3), kv.size(3)};
}

struct BandDiagScoresFn : torch::autograd::Function<BandDiagScoresFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& q_in,
                               const torch::Tensor& k_in, int64_t L) {
    auto q = q_in.contiguous(), k = k_in.to(q.scalar_type()).contiguous();
    const auto d = diag_dims(q, k);
    auto s = torch::empty({q.size(0), q.size(1), d.T, d.G, L}, q.options());
    dispatch(q, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::band_diag_scores<T>(ptr<T>(q), ptr<T>(k), ptr<T>(s), d.BH, d.T, d.G, d.hd, L);
    });
    ctx->save_for_backward({q, k});
    ctx->saved_data["L"] = L;
    return s;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1];
    const int64_t L = ctx->saved_data["L"].toInt();
    const auto d = diag_dims(q, k);
    auto ds = grads[0].to(q.scalar_type()).contiguous();
    auto dq = torch::empty_like(q), dk = torch::empty_like(k);
    dispatch(q, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::band_diag_scores_backward<T>(ptr<T>(ds), ptr<T>(q), ptr<T>(k), ptr<T>(dq), ptr<T>(dk),
                                      d.BH, d.T, d.G, d.hd, L);
    });
    return {dq, dk, torch::Tensor()};
  }
};

struct BandDiagOutputFn : torch::autograd::Function<BandDiagOutputFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& p_in,
                               const torch::Tensor& v_in, int64_t L) {
    auto v = v_in.contiguous(), p = p_in.to(v.scalar_type()).contiguous();
    const auto d = diag_dims(p, v);
    auto o = torch::empty({v.size(0), v.size(1), d.T, d.G, d.hd}, v.options());
    dispatch(v, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::band_diag_output<T>(ptr<T>(p), ptr<T>(v), ptr<T>(o), d.BH, d.T, d.G, d.hd, L);
    });
    ctx->save_for_backward({p, v});
    ctx->saved_data["L"] = L;
    ctx->saved_data["p_dtype"] = static_cast<int64_t>(p_in.scalar_type());
    return o;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &p = saved[0], &v = saved[1];
    const int64_t L = ctx->saved_data["L"].toInt();
    const auto d = diag_dims(p, v);
    auto dout = grads[0].to(v.scalar_type()).contiguous();
    auto dp = torch::empty_like(p), dv = torch::empty_like(v);
    dispatch(v, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::band_diag_output_backward<T>(ptr<T>(dout), ptr<T>(p), ptr<T>(v), ptr<T>(dp), ptr<T>(dv),
                                      d.BH, d.T, d.G, d.hd, L);
    });
    const auto p_dtype = static_cast<torch::ScalarType>(ctx->saved_data["p_dtype"].toInt());
    return {dp.to(p_dtype), dv, torch::Tensor()};
  }
};

}  // namespace

torch::Tensor band_diag_scores(const torch::Tensor& q, const torch::Tensor& k, int64_t L) {
  return BandDiagScoresFn::apply(q, k, L);
}

torch::Tensor band_diag_output(const torch::Tensor& p, const torch::Tensor& v, int64_t L) {
  return BandDiagOutputFn::apply(p, v, L);
}

torch::Tensor sliding_blocks(const torch::Tensor& x, int64_t first, int64_t step, int64_t count,
                             int64_t length) {
  TORCH_CHECK(x.dim() == 4, "sliding_blocks: x must be [B, H, T, hd], got ", x.sizes());
  return SlidingBlocksFn::apply(x, first, step, count, length);
}

std::pair<torch::Tensor, torch::Tensor> banded_softmax(const torch::Tensor& se,
                                                       const torch::Tensor& sb,
                                                       const torch::Tensor& bias,
                                                       const torch::Tensor& sink, int64_t G,
                                                       int64_t Tp, int64_t Hkv) {
  TORCH_CHECK(se.defined() || sb.defined(), "banded_softmax: no scores");
  const auto& any = se.defined() ? se : sb;
  TORCH_CHECK(fused_kernels_apply(any), "banded_softmax: needs CPU f32/f64/bf16 scores");
  auto empty = [&](const torch::Tensor& t) {
    return t.defined() ? t : torch::empty({any.size(0), 0}, any.options());
  };
  auto no_sink = torch::empty({0}, any.options().dtype(torch::kFloat32));
  auto out = BandedSoftmaxFn::apply(empty(se), empty(sb), bias, sink.defined() ? sink : no_sink, G,
                                    Tp, Hkv);
  return {out[0], out[1]};
}

// Under CPU autocast an f32 input is normalised in f32 and stored in the autocast dtype: every
// consumer of a norm is a matmul that autocast would cast anyway (once per consumer: 7 casts of

}  // namespace phasekv
