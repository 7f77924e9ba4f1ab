// RMSNorm, SwiGLU activation and rotary embedding as single autograd nodes over the fused CPU
// loops of kernels/cpu_kernels.h, with the composed libtorch versions they replace.
//
// The fused versions run on CPU tensors of f32, f64 and bf16 when attention_path() is kFast (the
// default); the reference versions run otherwise (AttentionPath::kReference, other dtypes or
// devices), so the masked reference path stays an independent check of the whole layer.
#pragma once
#include <torch/torch.h>

namespace phasekv {

// x * rsqrt(mean(x^2, -1) + eps) * weight, computed in f32 (f64 for f64 x), returned in x's dtype.
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rms_norm_reference(const torch::Tensor& x, const torch::Tensor& weight, double eps);

// silu(g) * u.
torch::Tensor swiglu(const torch::Tensor& g, const torch::Tensor& u);
torch::Tensor swiglu_reference(const torch::Tensor& g, const torch::Tensor& u);

// NeoX rotary embedding of the first 2 * cos.size(1) channels of x: [..., T, dim], cos/sin
// [T, half] (f64; cast to the arithmetic type here).
torch::Tensor rope_rotate(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
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

// Whether the fused kernels run for x: the fast path is selected and x is a CPU f32/f64/bf16
// tensor.
bool fused_kernels_apply(const torch::Tensor& x);

}  // namespace phasekv
