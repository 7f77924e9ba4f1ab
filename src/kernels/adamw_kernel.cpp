// The one-pass AdamW update (cpu_kernels.h).
#include "kernels/simd.h"

namespace phasekv::kernels {

using namespace detail;

namespace {

void adamw_range(float* __restrict p, const float* __restrict g, float* __restrict m,
                 float* __restrict v, int64_t n, const AdamWStep& s) {
  // The scalars as libtorch's float ops see them (each Scalar is cast to float).
  const float decay = static_cast<float>(1 - s.lr * s.weight_decay);
  const float b1 = static_cast<float>(s.beta1), one_b1 = static_cast<float>(1 - s.beta1);
  const float b2 = static_cast<float>(s.beta2), one_b2 = static_cast<float>(1 - s.beta2);
  const float sqrt_bc2 = static_cast<float>(std::sqrt(s.bias_correction2));
  const float eps = static_cast<float>(s.eps);
  const float neg_step = static_cast<float>(-(s.lr / s.bias_correction1));
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = m[i] * b1 + gi * one_b1;
    const float vi = v[i] * b2 + gi * gi * one_b2;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay + neg_step * (mi / (std::sqrt(vi) / sqrt_bc2 + eps));
  }
}

}  // namespace

void adamw_update(float* p, const float* g, float* m, float* v, int64_t n, const AdamWStep& s) {
  at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
    adamw_range(p + i0, g + i0, m + i0, v + i0, i1 - i0, s);
  });
}

}  // namespace phasekv::kernels
