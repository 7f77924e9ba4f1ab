// RMSNorm, SwiGLU activation and rotary embedding as single autograd nodes over the fused CPU
// loops of kernels/cpu_kernels.h, with the composed libtorch versions they replace.
//
// The fused versions run on CPU tensors of f32, f64 and bf16 when attention_path() is kFast (the
// default); the reference versions run otherwise (AttentionPath::kReference, other dtypes or
// devices), so the masked reference path stays an independent check of the whole layer.
#pragma once
#include <torch/torch.h>

namespace phasekv {

// x * rsqrt(mean(x^2, -1) + eps) * weight, computed in f32 (f64 for f64 x), returned in x's dtype;
// under bf16 CPU autocast an f32 x is returned in bf16 (its consumers are autocast matmuls).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(g) * u.
torch::Tensor swiglu(const torch::Tensor& g, const torch::Tensor& u);
torch::Tensor swiglu_reference(const torch::Tensor& g, const torch::Tensor& u);

// NeoX rotary embedding of the first 2 * cos.size(1) channels of x: [..., T, dim], cos/sin
// [T, half] (f64; cast to the arithmetic type here).
torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos,
                          const torch::Tensor& sin);
torch::Tensor rope_rotate_reference(const torch::Tensor& x, const torch::Tensor& cos,
                                    const torch::Tensor& sin);

// The joint softmax of attend_fast's banded layout (see kernels::banded_softmax_forward): rows of
// entry scores se [R, E] and band scores sb [R, L] (either undefined when empty) plus bias
// [Tp, E + L] (f32: 0 or -inf) and an optional sink [Hkv * G], computed in f32 (f64 for f64).
// Returns the probabilities of the entries [R, E] and of the band [R, L] in the scores' dtype;
// the sink's is dropped. Only for scores where fused_kernels_apply() holds.
std::pair<torch::Tensor, torch::Tensor> banded_softmax(const torch::Tensor& se,
                                                       const torch::Tensor& sb,
                                                       const torch::Tensor& bias,
                                                       const torch::Tensor& sink, int64_t G,
                                                       int64_t Tp, int64_t Hkv);

// Overlapping blocks of a sequence: x [B, H, T, hd] -> [B, H, count, length, hd], block i holding
// positions first + i * step + [0, length), zeros outside [0, T). A contiguous copy whose backward
// adds each block back in place (libtorch's unfold_backward took ~3 ms per call on the large
// training step's [4, 2, 8, 64, 191] band).
torch::Tensor sliding_blocks(const torch::Tensor& x, int64_t first, int64_t step, int64_t count,
                             int64_t length);

// The narrow (diagonal) band of attend_fast: L diagonals, key l positions back, zero before 0.
// q: [B, Hkv, T, G, hd], k: [B, Hkv, T, hd] -> scores [B, Hkv, T, G, L].
torch::Tensor band_diag_scores(const torch::Tensor& q, const torch::Tensor& k, int64_t L);
// p: [B, Hkv, T, G, L], v: [B, Hkv, T, hd] -> sum_l p[..., l] v[t - l]: [B, Hkv, T, G, hd], in
// v's dtype.
torch::Tensor band_diag_output(const torch::Tensor& p, const torch::Tensor& v, int64_t L);

// a @ b (trans_b false) or a @ b^T over equal leading (batch) dims: a [..., M, K], b [..., K, N]
// or [..., N, K]. CPU f32 runs as one node over kernels::small_batched_gemm (small matrices; also
// f64) or oneDNN's sgemm per matrix (larger ones); anything else, and everything under CPU
// autocast, is torch::matmul.
torch::Tensor batched_matmul(const torch::Tensor& a, const torch::Tensor& b, bool trans_b);

// out [n, M, N] = a [n, M, K] op(b) (+ out when accumulate), b [n, K, N] or [n, N, K] when
// trans_b, with no autograd: for decode, on views of the cache. CPU f32 with contiguous rows
// (last stride 1) runs oneDNN's sgemm on the views' own strides, no copies; else libtorch's bmm.
void bmm_into(const torch::Tensor& out, const torch::Tensor& a, const torch::Tensor& b,
              bool trans_b, bool accumulate);

// x @ weight^T + bias (bias may be undefined), as torch::nn::functional::linear. CPU f32 outside
// autocast runs as one node over oneDNN's sgemm (kernels::sgemm); anything else is libtorch's.
torch::Tensor linear(const torch::Tensor& x, const torch::Tensor& weight,
                     const torch::Tensor& bias);
torch::Tensor linear(const torch::Tensor& x, const torch::nn::Linear& m);

// Whether the fused kernels run for x: the fast path is selected and x is a CPU f32/f64/bf16
// tensor.
bool fused_kernels_apply(const torch::Tensor& x);

}  // namespace phasekv
