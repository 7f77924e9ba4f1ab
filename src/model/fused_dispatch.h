// Internal to src/model/fused_*.cpp: from tensors to the kernels of kernels/cpu_kernels.h.
#pragma once
#include <torch/torch.h>

#include "kernels/cpu_kernels.h"
#include "kernels/gemm_choice.h"

namespace phasekv::fused_detail {

using torch::autograd::AutogradContext;
using torch::autograd::tensor_list;
namespace k = kernels;

// The arithmetic dtype of the kernels for storage dtype t.
inline torch::ScalarType acc_dtype(torch::ScalarType t) {
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

// Pointer to t's data, or null for an undefined or empty tensor.
template <class T>
T* ptr_or_null(const torch::Tensor& t) {
  return t.defined() && t.numel() > 0 ? ptr<T>(t) : nullptr;
}

}  // namespace phasekv::fused_detail
