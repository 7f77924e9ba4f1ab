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

}  // namespace phasekv
