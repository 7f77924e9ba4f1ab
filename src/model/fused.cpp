#include "model/fused.h"

#include <ATen/autocast_mode.h>

#include "kernels/cpu_kernels.h"
#include "model/attend_fast.h"

namespace phasekv {

bool fused_kernels_apply(const torch::Tensor& x) {
  const auto t = x.scalar_type();
  return attention_path() == AttentionPath::kFast && x.device().is_cpu() &&
         (t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kBFloat16);
}

namespace {

bool fusable(const torch::Tensor& x) { return fused_kernels_apply(x); }

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
namespace k = kernels;

// The arithmetic dtype of the kernels for storage dtype t.
torch::ScalarType acc_dtype(torch::ScalarType t) {
  return t == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// Calls f with the kernels' storage type for x's dtype (a null pointer of that type).
template <class F>
void dispatch(const torch::Tensor& x, F&& f) {
  switch (x.scalar_type()) {
    case torch::kFloat32:
      return f(static_cast<float*>(nullptr));
    case torch::kFloat64:
      return f(static_cast<double*>(nullptr));
    case torch::kBFloat16:
      return f(static_cast<k::Bf16*>(nullptr));
    default:
      TORCH_CHECK(false, "fused kernels: unsupported dtype ", x.scalar_type());
  }
}

template <class T>
T* ptr(const torch::Tensor& t) {
  return reinterpret_cast<T*>(t.data_ptr());
}

// Calls f with the kernels' (input, output) storage types of an RMSNorm: the same type, or f32
// in and bf16 out.
template <class F>
void dispatch_norm(const torch::Tensor& x, torch::ScalarType out, F&& f) {
  if (out == x.scalar_type()) return dispatch(x, [&](auto* tag) { f(tag, tag); });
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && out == torch::kBFloat16,
              "rms_norm: no kernel from ", x.scalar_type(), " to ", out);
  f(static_cast<float*>(nullptr), static_cast<k::Bf16*>(nullptr));
}

struct RMSNormFn : torch::autograd::Function<RMSNormFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, double eps, int64_t out_dtype) {
    auto x = x_in.contiguous();
    auto w = w_in.to(acc_dtype(x.scalar_type())).contiguous();
    const auto out = static_cast<torch::ScalarType>(out_dtype);
    const int64_t dim = x.size(-1), rows = x.numel() / std::max<int64_t>(dim, 1);
    auto y = torch::empty_like(x, x.options().dtype(out));
    auto rstd = torch::empty({rows}, w.options());
    dispatch_norm(x, out, [&](auto* in_tag, auto* out_tag) {
      using T = std::remove_pointer_t<decltype(in_tag)>;
      using O = std::remove_pointer_t<decltype(out_tag)>;
      k::rms_norm_forward<T, O>(ptr<T>(x), ptr<k::Acc<T>>(w), ptr<O>(y), ptr<k::Acc<T>>(rstd),
                                rows, dim, eps);
    });
    ctx->save_for_backward({x, w, rstd});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w_in.scalar_type());
    ctx->saved_data["out_dtype"] = out_dtype;
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &rstd = saved[2];
    const auto out = static_cast<torch::ScalarType>(ctx->saved_data["out_dtype"].toInt());
    auto gy = grads[0].to(out).contiguous();
    const int64_t dim = x.size(-1), rows = rstd.size(0);
    auto dx = torch::empty_like(x);
    auto dw = torch::zeros({dim}, w.options());
    dispatch_norm(x, out, [&](auto* in_tag, auto* out_tag) {
      using T = std::remove_pointer_t<decltype(in_tag)>;
      using O = std::remove_pointer_t<decltype(out_tag)>;
      k::rms_norm_backward<T, O>(ptr<O>(gy), ptr<T>(x), ptr<k::Acc<T>>(w), ptr<k::Acc<T>>(rstd),
                                 ptr<T>(dx), ptr<k::Acc<T>>(dw), rows, dim);
    });
    const auto w_dtype = static_cast<torch::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    return {dx, dw.to(w_dtype), torch::Tensor(), torch::Tensor()};
  }
};

struct SwiGLUFn : torch::autograd::Function<SwiGLUFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& g_in,
                               const torch::Tensor& u_in) {
    auto g = g_in.contiguous(), u = u_in.to(g.scalar_type()).contiguous();
    TORCH_CHECK(g.sizes() == u.sizes(), "swiglu: gate ", g.sizes(), " and up ", u.sizes(),
                " differ");
    auto h = torch::empty_like(g);
    dispatch(g, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::swiglu_forward<T>(ptr<T>(g), ptr<T>(u), ptr<T>(h), g.numel());
    });
    ctx->save_for_backward({g, u});
    return h;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &g = saved[0], &u = saved[1];
    auto gh = grads[0].to(g.scalar_type()).contiguous();
    auto dg = torch::empty_like(g), du = torch::empty_like(u);
    dispatch(g, [&](auto* tag) {
      using T = std::remove_pointer_t<decltype(tag)>;
      k::swiglu_backward<T>(ptr<T>(gh), ptr<T>(g), ptr<T>(u), ptr<T>(dg), ptr<T>(du), g.numel());
    });
    return {dg, du};
  }
};

void rope_run(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
              const torch::Tensor& y, int sign) {
  const int64_t dim = x.size(-1), T_len = x.size(-2), rows = x.numel() / std::max<int64_t>(dim, 1);
  dispatch(x, [&](auto* tag) {
    using T = std::remove_pointer_t<decltype(tag)>;
    k::rope_rotate<T>(ptr<T>(x), ptr<k::Acc<T>>(cos), ptr<k::Acc<T>>(sin), ptr<T>(y), rows, dim,
                      T_len, cos.size(1), sign);
  });
}

struct RopeFn : torch::autograd::Function<RopeFn> {
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& cos_in, const torch::Tensor& sin_in) {
    auto x = x_in.contiguous();
    const auto acc = acc_dtype(x.scalar_type());
    auto cos = cos_in.to(acc).contiguous(), sin = sin_in.to(acc).contiguous();
    auto y = torch::empty_like(x);
    rope_run(x, cos, sin, y, +1);
    ctx->save_for_backward({cos, sin});
    return y;
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    auto g = grads[0].contiguous();
    auto dx = torch::empty_like(g);
    rope_run(g, saved[0], saved[1], dx, -1);  // the inverse rotation
    return {dx, torch::Tensor(), torch::Tensor()};
  }
};

// Pointer to t's data, or null for an undefined or empty tensor.
template <class T>
T* ptr_or_null(const torch::Tensor& t) {
  return t.defined() && t.numel() > 0 ? ptr<T>(t) : nullptr;
}

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
// the residual stream per attention layer, and as many f32 gradient sums in the backward).
static torch::ScalarType rms_norm_out_dtype(const torch::Tensor& x) {
  if (x.scalar_type() == torch::kFloat32 && at::autocast::is_cpu_enabled() &&
      at::autocast::get_autocast_cpu_dtype() == torch::kBFloat16)
    return torch::kBFloat16;
  return x.scalar_type();
}

torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  // Normalise in at least f32 when x is bf16: the mean of squares loses too much precision
  // otherwise. f64 (gradient checks) stays f64.
  auto compute = acc_dtype(x.scalar_type());
  auto xf = x.to(compute);
  auto y = xf * torch::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return (y * weight.to(compute)).to(rms_norm_out_dtype(x));
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  if (!fusable(x) || x.numel() == 0) return rms_norm_reference(x, weight, eps);
  return RMSNormFn::apply(x, weight, eps, static_cast<int64_t>(rms_norm_out_dtype(x)));
}

torch::Tensor swiglu_reference(const torch::Tensor& g, const torch::Tensor& u) {
  return torch::silu(g) * u;
}

torch::Tensor swiglu(const torch::Tensor& g, const torch::Tensor& u) {
  if (!fusable(g) || g.scalar_type() != u.scalar_type() || g.sizes() != u.sizes())
    return swiglu_reference(g, u);
  return SwiGLUFn::apply(g, u);
}

torch::Tensor rope_rotate_reference(const torch::Tensor& x, const torch::Tensor& cos_in,
                                    const torch::Tensor& sin_in) {
  const int64_t half = cos_in.size(1), dim = x.size(-1);
  auto cos = cos_in.to(x.scalar_type()), sin = sin_in.to(x.scalar_type());
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = torch::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1);
  if (2 * half == dim) return rotated;
  return torch::cat({rotated, x.narrow(-1, 2 * half, dim - 2 * half)}, -1);
}

torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin) {
  if (!fusable(x) || x.numel() == 0) return rope_rotate_reference(x, cos, sin);
  return RopeFn::apply(x, cos, sin);
}

}  // namespace phasekv
