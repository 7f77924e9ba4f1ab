// Hand-written CPU loops for the element-wise and row-wise parts of a decoder layer: RMSNorm,
// the SwiGLU activation and rotary embedding, forward and backward.
//
// Why: composed from libtorch ops, each of these is 5 to 15 separate passes over memory in the
// forward and as many autograd nodes in the backward; libtorch 1.13's bf16 silu and silu_backward
// are also scalar (measured 3-12 ms per call on [2048, 1536] in the large training step). One
// fused pass each removes most of a training step's non-GEMM time and many per-op costs from a
// decode step. The file is compiled for the build machine's vector ISA (CMake option
// PHASEKV_NATIVE) and includes no libtorch tensor headers, so those flags stay local to it.
//
// Storage types: float, double (gradient checks) and Bf16 (raw bf16 bits). Arithmetic is done in
// Acc<T>: double for double, float otherwise. All buffers are contiguous, row-major.
#pragma once
#include <cstdint>

namespace phasekv::kernels {

struct Bf16 {
  uint16_t bits;
};

template <class T>
struct AccOf {
  using type = float;
};
template <>
struct AccOf<double> {
  using type = double;
};
template <class T>
using Acc = typename AccOf<T>::type;

// y[r, :] = x[r, :] * rstd[r] * w, rstd[r] = 1 / sqrt(mean(x[r, :]^2) + eps). rstd is kept for
// the backward. The output may be stored in another type O (f32 x, bf16 y under autocast).
template <class T, class O = T>
void rms_norm_forward(const T* x, const Acc<T>* w, O* y, Acc<T>* rstd, int64_t rows, int64_t dim,
                      double eps);
// dx (same shape as x) and dw += sum over rows of gy * x * rstd (dw: [dim], accumulated).
template <class T, class O = T>
void rms_norm_backward(const O* gy, const T* x, const Acc<T>* w, const Acc<T>* rstd, T* dx,
                       Acc<T>* dw, int64_t rows, int64_t dim);

// h = silu(g) * u, element-wise over n values.
template <class T>
void swiglu_forward(const T* g, const T* u, T* h, int64_t n);
template <class T>
void swiglu_backward(const T* gh, const T* g, const T* u, T* dg, T* du, int64_t n);

// NeoX rotary embedding of the first 2 * half channels of each row of x ([rows, dim], row r at
// position index r % T); channels from 2 * half on are copied. cos/sin: [T, half]. sign = +1
// rotates forward, -1 applies the inverse rotation (the backward of the forward).
template <class T>
void rope_rotate(const T* x, const Acc<T>* cos, const Acc<T>* sin, T* y, int64_t rows,
                 int64_t dim, int64_t T_len, int64_t half, int sign);

// One softmax per score row over [E entry columns | L band columns | sink], each score plus an
// additive visibility bias (0 or -inf) that depends on the row's position. Rows are ordered
// (b, kv head, position, group): row r sits at position (r / G) % Tp and belongs to query head
// ((r / (G * Tp)) % Hkv) * G + r % G. se: [R, E], sb: [R, L] (either may be null when its count
// is 0), bias: [Tp, E + L], sink: [Hkv * G] or null. Writes the probabilities in f32 to
// p ([R, N], N = E + L + (sink ? 1 : 0), kept for the backward) and in T to pe and pb.
template <class T>
void banded_softmax_forward(const T* se, const T* sb, const float* bias, const Acc<T>* sink,
                            Acc<T>* p, T* pe, T* pb, int64_t R, int64_t E, int64_t L, int64_t G,
                            int64_t Tp, int64_t Hkv);
// Gradients of the scores (dse, dsb: like se, sb) and, when dsink is not null, the sink's
// (accumulated into dsink[Hkv * G]) from those of the probabilities (dpe, dpb; null: zero).
template <class T>
void banded_softmax_backward(const Acc<T>* p, const T* dpe, const T* dpb, T* dse, T* dsb,
                             Acc<T>* dsink, int64_t R, int64_t E, int64_t L, int64_t G,
                             int64_t Tp, int64_t Hkv);

// A narrow attention band as L diagonals, for BH independent (batch, kv head) slices of T
// positions, G query heads per kv head and head size hd. Query rows q: [BH, T, G, hd]; keys and
// values k, v: [BH, T, hd]; scores and probabilities s, p: [BH, T, G, L], column l being the key
// l positions back (zero before position 0).
//   scores: s[t, g, l] = q[t, g] . k[t - l]        output: o[t, g] = sum_l p[t, g, l] v[t - l]
template <class T>
void band_diag_scores(const T* q, const T* k, T* s, int64_t BH, int64_t T_len, int64_t G,
                      int64_t hd, int64_t L);
template <class T>
void band_diag_scores_backward(const T* ds, const T* q, const T* k, T* dq, T* dk, int64_t BH,
                               int64_t T_len, int64_t G, int64_t hd, int64_t L);
template <class T>
void band_diag_output(const T* p, const T* v, T* o, int64_t BH, int64_t T_len, int64_t G,
                      int64_t hd, int64_t L);
template <class T>
void band_diag_output_backward(const T* dout, const T* p, const T* v, T* dp, T* dv, int64_t BH,
                               int64_t T_len, int64_t G, int64_t hd, int64_t L);

// C [M, N] = op(A) op(B) + beta C, row-major with leading dimensions lda, ldb, ldc (op: the
// matrix, or its transpose when trans_*), through oneDNN's sgemm or OpenBLAS, whichever
// gemm_choice.h measured faster for this shape class, on the calling thread's libtorch thread
// count (at::set_num_threads). Throws std::runtime_error on failure.
void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// batch independent products C = op(A) op(B), C: [M, N], op(A): [M, K] (A stored [K, M] when
// trans_a), op(B): [K, N] (B stored [N, K] when trans_b); consecutive matrices of each operand
// are contiguous. For many small matrices, where a BLAS call per matrix costs more than its
// arithmetic. float and double only (bf16 batched products go through oneDNN in libtorch).
template <class T>
void small_batched_gemm(const T* a, const T* b, T* c, int64_t batch, int64_t M, int64_t N,
                        int64_t K, bool trans_a, bool trans_b);

// One AdamW update of n f32 parameters in a single pass, with libtorch's AdamW arithmetic:
// p *= 1 - lr * wd; m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
// p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + eps).
struct AdamWStep {
  double lr, weight_decay, beta1, beta2, eps, bias_correction1, bias_correction2;
};
void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s);

}  // namespace phasekv::kernels
