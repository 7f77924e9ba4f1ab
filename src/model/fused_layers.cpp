// RMSNorm, SwiGLU and rotary embedding as single autograd nodes (fused.h).
#include <ATen/autocast_mode.h>

#include "model/attend_fast.h"
#include "model/fused.h"
#include "model/fused_dispatch.h"

namespace phasekv {

bool fused_kernels_apply(const torch::Tensor& x) {
  const auto t = x.scalar_type();
  return attention_path() == AttentionPath::kFast && x.device().is_cpu() &&
         (t == torch::kFloat32 || t == torch::kFloat64 || t == torch::kBFloat16);
}

namespace {

using namespace fused_detail;

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

}  // namespace

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
  if (!fused_kernels_apply(x) || x.numel() == 0) return rms_norm_reference(x, weight, eps);
  return RMSNormFn::apply(x, weight, eps, static_cast<int64_t>(rms_norm_out_dtype(x)));
}

torch::Tensor swiglu_reference(const torch::Tensor& g, const torch::Tensor& u) {
  return torch::silu(g) * u;
}

torch::Tensor swiglu(const torch::Tensor& g, const torch::Tensor& u) {
  if (!fused_kernels_apply(g) || g.scalar_type() != u.scalar_type() || g.sizes() != u.sizes())
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
  if (!fused_kernels_apply(x) || x.numel() == 0) return rope_rotate_reference(x, cos, sin);
  return RopeFn::apply(x, cos, sin);
}

}  // namespace phasekv
