// linear and batched_matmul (fused.h): f32 products on the GEMM path measured fastest for their
// shape class (kernels/gemm_choice.h: oneDNN's sgemm, OpenBLAS, or batches of small matrices
// through kernels::small_batched_gemm), f64 ones on the small kernel, as autograd nodes whose
// backward uses the same kernels.
#include <ATen/autocast_mode.h>

#include "model/fused.h"
#include "model/fused_dispatch.h"

namespace phasekv {
namespace {

using namespace fused_detail;

// Whether the f32/f64 nodes replace libtorch's matmul for these operands: the fast path, CPU,
// the same dtype, and not under CPU autocast (libtorch's matmul then runs in bf16 through
// oneDNN's own bf16 kernels).
bool own_matmul_applies(const torch::Tensor& a, const torch::Tensor& b) {
  const auto t = a.scalar_type();
  return fused_kernels_apply(a) && (t == torch::kFloat32 || t == torch::kFloat64) &&
         b.scalar_type() == t && b.device().is_cpu() && !at::autocast::is_cpu_enabled();
}

// Sizes of one batched call: the leading dims flattened into one batch.
struct Sizes {
  int64_t batch, M, N, K;
};

// Matrices in a [..., M, K]: the product of the leading dims (numel / (M K) fails for empty ones).
int64_t batch_of(const torch::Tensor& a) {
  return c10::multiply_integers(a.sizes().begin(), a.sizes().end() - 2);
}

// C = op(A) op(B) on contiguous operands, allocated in its final shape (batch dims, M, N): a
// view of it would be a view made inside a custom Function, which autograd forbids modifying in
// place. f64: the small kernel; f32: the path chosen for the shape class.
torch::Tensor gemm(const torch::Tensor& a, const torch::Tensor& b, const Sizes& s, bool trans_a,
                   bool trans_b, c10::IntArrayRef shape) {
  auto c = torch::empty(shape, a.options());
  if (a.scalar_type() == torch::kFloat64) {
    k::small_batched_gemm<double>(ptr<double>(a), ptr<double>(b), ptr<double>(c), s.batch, s.M, s.N,
                                  s.K, trans_a, trans_b);
  } else if (s.batch > 0 && s.M > 0 && s.N > 0) {
    const k::GemmShape shape{s.batch, s.M, s.N, s.K, trans_a, trans_b, true};
    k::gemm_on(s.K == 0 ? k::GemmPath::kSmall : k::gemm_chooser().choose(shape), shape,
               ptr<float>(a), trans_a ? s.M : s.K, ptr<float>(b), trans_b ? s.K : s.N, 0.0f,
               ptr<float>(c), s.N);
  }
  return c;
}

// a @ op(b) on contiguous a [..., M, K] and b, the shape a's with N columns.
torch::Tensor batched_forward(const torch::Tensor& a, const torch::Tensor& b, bool trans_b) {
  const int64_t M = a.size(-2), K = a.size(-1), N = trans_b ? b.size(-2) : b.size(-1);
  auto shape = a.sizes().vec();
  shape.back() = N;
  return gemm(a, b, {batch_of(a), M, N, K}, false, trans_b, shape);
}

struct BatchedMatmulFn : torch::autograd::Function<BatchedMatmulFn> {
  // a: [..., M, K]; b: [..., K, N], or [..., N, K] when trans_b; same leading dims.
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& a_in,
                               const torch::Tensor& b_in, bool trans_b) {
    auto a = a_in.contiguous(), b = b_in.contiguous();
    ctx->save_for_backward({a, b});
    ctx->saved_data["trans_b"] = trans_b;
    return batched_forward(a, b, trans_b);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &a = saved[0], &b = saved[1];
    const bool trans_b = ctx->saved_data["trans_b"].toBool();
    const int64_t M = a.size(-2), K = a.size(-1);
    const int64_t N = trans_b ? b.size(-2) : b.size(-1);
    const int64_t batch = batch_of(a);
    auto dc = grads[0].contiguous();
    // dA [M, K] = dC op(B)^T; op(B)^T is b itself when trans_b, b transposed otherwise.
    auto da = gemm(dc, b, {batch, M, K, N}, false, !trans_b, a.sizes());
    // dB as stored: [N, K] = dC^T A when trans_b, [K, N] = A^T dC otherwise.
    auto db = trans_b ? gemm(dc, a, {batch, N, K, M}, true, false, b.sizes())
                      : gemm(a, dc, {batch, K, N, M}, true, false, b.sizes());
    return {da, db, torch::Tensor()};
  }
};

bool batched_kernel_applies(const torch::Tensor& a, const torch::Tensor& b, bool trans_b) {
  if (!own_matmul_applies(a, b) || a.dim() < 3 || a.dim() != b.dim()) return false;
  for (int64_t i = 0; i + 2 < a.dim(); ++i)
    if (a.size(i) != b.size(i)) return false;  // no broadcasting
  const int64_t K = a.size(-1), N = trans_b ? b.size(-2) : b.size(-1);
  if ((trans_b ? b.size(-1) : b.size(-2)) != K) return false;
  // f64 (gradient checks) only where the small kernel is quick; libtorch otherwise.
  constexpr int64_t kMaxF64Product = int64_t{1} << 18;
  return a.scalar_type() == torch::kFloat32 || a.size(-2) * N * K <= kMaxF64Product;
}

// Rows of x [..., in]: every dim but the last (x.numel() / in fails for in = 0).
int64_t rows_of(const torch::Tensor& x) {
  return c10::multiply_integers(x.sizes().begin(), x.sizes().end() - 1);
}

// y = x w^T + bias on contiguous f32 x [..., in], w [out, in], bias [out] (empty or undefined:
// none): one sgemm, the bias preloaded into y (beta = 1).
torch::Tensor linear_forward(const torch::Tensor& x, const torch::Tensor& w,
                             const torch::Tensor& bias) {
  const int64_t in = w.size(1), out = w.size(0), rows = rows_of(x);
  auto shape = x.sizes().vec();
  shape.back() = out;
  auto y = torch::empty(shape, x.options());
  const bool has_bias = bias.defined() && bias.numel() > 0;
  if (has_bias) y.view({rows, out}).copy_(bias.view({1, out}).expand({rows, out}));
  k::sgemm(false, true, rows, out, in, ptr<float>(x), in, ptr<float>(w), in, has_bias ? 1.0f : 0.0f,
           ptr<float>(y), out);
  return y;
}

// linear_forward as an autograd node: both gradients are one sgemm each (bias: a column sum),
// with no transposed copies of x, w or the gradient.
struct LinearFn : torch::autograd::Function<LinearFn> {
  // bias: [out] or empty (libtorch 1.13's Function takes no undefined inputs).
  static torch::Tensor forward(AutogradContext* ctx, const torch::Tensor& x_in,
                               const torch::Tensor& w_in, const torch::Tensor& bias) {
    auto x = x_in.contiguous(), w = w_in.contiguous();
    ctx->save_for_backward({x, w});
    ctx->saved_data["has_bias"] = bias.numel() > 0;
    return linear_forward(x, w, bias);
  }
  static tensor_list backward(AutogradContext* ctx, tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const int64_t in = w.size(1), out = w.size(0), rows = rows_of(x);
    auto gy = grads[0].contiguous();
    torch::Tensor dx, dw, db;
    if (ctx->needs_input_grad(0)) {  // dx [rows, in] = gy [rows, out] w [out, in]
      dx = torch::empty_like(x);
      k::sgemm(false, false, rows, in, out, ptr<float>(gy), out, ptr<float>(w), in, 0.0f,
               ptr<float>(dx), in);
    }
    if (ctx->needs_input_grad(1)) {  // dw [out, in] = gy^T x
      dw = torch::empty_like(w);
      k::sgemm(true, false, out, in, rows, ptr<float>(gy), out, ptr<float>(x), in, 0.0f,
               ptr<float>(dw), in);
    }
    if (ctx->saved_data["has_bias"].toBool() && ctx->needs_input_grad(2))
      db = gy.view({rows, out}).sum(0);
    return {dx, dw, db};
  }
};

// Whether a call records a graph: otherwise (decode, evaluation) the kernels run without an
// autograd node, whose creation would cost allocations on every step.
bool records_graph(std::initializer_list<const torch::Tensor*> inputs) {
  if (!torch::GradMode::is_enabled()) return false;
  for (const auto* t : inputs)
    if (t->defined() && t->requires_grad()) return true;
  return false;
}

}  // namespace

torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, bool trans_b) {
  if (!batched_kernel_applies(a, b, trans_b))
    return torch::matmul(a, trans_b ? b.transpose(-1, -2) : b);
  if (records_graph({&a, &b})) return BatchedMatmulFn::apply(a, b, trans_b);
  return batched_forward(a.contiguous(), b.contiguous(), trans_b);
}

// One product per matrix of a batch whose matrices sit batch_stride_* apart (rows ld* apart), all
// on the path chosen for one of them.
static void sgemm_batch(int64_t batch, bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K,
                 const float* a, int64_t batch_stride_a, int64_t lda, const float* b,
                 int64_t batch_stride_b, int64_t ldb, float beta, float* c, int64_t batch_stride_c,
                 int64_t ldc) {
  if (batch == 0 || M == 0 || N == 0) return;
  const k::GemmShape one{1, M, N, K, trans_a, trans_b, false};
  const auto path = K == 0 ? k::GemmPath::kOneDnn : k::gemm_chooser().choose(one);
  for (int64_t i = 0; i < batch; ++i)
    k::gemm_on(path, one, a + i * batch_stride_a, lda, b + i * batch_stride_b, ldb, beta,
               c + i * batch_stride_c, ldc);
}

void bmm_into(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
              bool trans_b, bool accumulate) {
  // sgemm needs unit column strides and rows that do not overlap; a single row's stride is
  // arbitrary in libtorch, so the leading dimension is at least the row length.
  auto rows_contiguous = [](const torch::Tensor& t) {
    return t.dim() == 3 && t.stride(2) == 1 && (t.size(1) <= 1 || t.stride(1) >= t.size(2));
  };
  auto ld = [](const torch::Tensor& t) { return std::max(t.stride(1), t.size(2)); };
  const bool own = a.scalar_type() == torch::kFloat32 && own_matmul_applies(a, b) &&
                   out.scalar_type() == torch::kFloat32 && rows_contiguous(out) &&
                   rows_contiguous(a) && rows_contiguous(b);
  if (!own) {
    auto bt = trans_b ? b.transpose(1, 2) : b;
    if (accumulate)
      out.baddbmm_(a, bt);
    else
      at::bmm_out(const_cast<torch::Tensor&>(out), a, bt);
    return;
  }
  const int64_t n = a.size(0), M = a.size(1), K = a.size(2), N = out.size(2);
  TORCH_CHECK(b.size(0) == n && out.size(0) == n && out.size(1) == M &&
                  (trans_b ? b.size(2) : b.size(1)) == K && (trans_b ? b.size(1) : b.size(2)) == N,
              "bmm_into: ", a.sizes(), " x ", b.sizes(), (trans_b ? "^T" : ""), " into ",
              out.sizes());
  sgemm_batch(n, false, trans_b, M, N, K, ptr<float>(a), a.stride(0), ld(a), ptr<float>(b),
              b.stride(0), ld(b), accumulate ? 1.0f : 0.0f, ptr<float>(out), out.stride(0),
              ld(out));
}

torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias) {
  const bool f32 = x.scalar_type() == torch::kFloat32;
  if (!f32 || !own_matmul_applies(x, weight) || x.dim() < 1 || weight.dim() != 2 ||
      x.size(-1) != weight.size(1) || (bias.defined() && bias.scalar_type() != torch::kFloat32))
    return torch::nn::functional::linear(x, weight, bias);
  if (!records_graph({&x, &weight, &bias}))
    return linear_forward(x.contiguous(), weight.contiguous(), bias);
  auto no_bias = torch::empty({0}, x.options());
  return LinearFn::apply(x, weight, bias.defined() ? bias : no_bias);
}

torch::Tensor linear(const torch::Tensor& x, const torch::nn::Linear& m) {
  return linear(x, m->weight, m->bias);
}

}  // namespace phasekv
