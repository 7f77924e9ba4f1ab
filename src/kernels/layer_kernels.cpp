// RMSNorm, SwiGLU and rotary embedding: forward and backward loops (cpu_kernels.h).
#include "kernels/simd.h"

namespace phasekv::kernels {

using namespace detail;

template <class T, class O>
void rms_norm_forward(const T* x, const Acc<T>* w, O* y, Acc<T>* rstd, int64_t rows, int64_t dim,
                      double eps) {
  using A = Acc<T>;
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * dim;
      O* yr = y + r * dim;
      A ss = 0;
#pragma omp simd reduction(+ : ss)
      for (int64_t i = 0; i < dim; ++i) ss += load(xr[i]) * load(xr[i]);
      const A rs = A(1) / std::sqrt(ss / A(dim) + A(eps));
      rstd[r] = rs;
#pragma omp simd
      for (int64_t i = 0; i < dim; ++i) yr[i] = store<O>(load(xr[i]) * rs * w[i]);
    }
  });
}

template <class T, class O>
void rms_norm_backward(const O* gy, const T* x, const Acc<T>* w, const Acc<T>* rstd, T* dx,
                       Acc<T>* dw, int64_t rows, int64_t dim) {
  using A = Acc<T>;
  // dw is a sum over rows: one partial sum per task, added in task order (deterministic for a
  // given thread count's split, which depends only on rows and the grain).
  const int64_t grain = row_grain(dim), tasks = (rows + grain - 1) / grain;
  std::vector<A> partial(static_cast<size_t>(std::max<int64_t>(tasks, 1) * dim), A(0));
  at::parallel_for(0, tasks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      A* dwk = partial.data() + k * dim;
      for (int64_t r = k * grain; r < std::min(rows, (k + 1) * grain); ++r) {
        const T* xr = x + r * dim;
        const O* gr = gy + r * dim;
        T* dxr = dx + r * dim;
        const A rs = rstd[r];
        // xhat = x * rs; dy = gy * w; dx = rs * (dy - xhat * mean(dy * xhat)).
        A dot = 0;
#pragma omp simd reduction(+ : dot)
        for (int64_t i = 0; i < dim; ++i) dot += load(gr[i]) * w[i] * load(xr[i]);
        const A c = dot * rs * rs / A(dim);
#pragma omp simd
        for (int64_t i = 0; i < dim; ++i) {
          const A xi = load(xr[i]), gi = load(gr[i]);
          dxr[i] = store<T>(rs * (gi * w[i] - xi * c));
          dwk[i] += gi * xi * rs;
        }
      }
    }
  });
  for (int64_t k = 0; k < tasks; ++k)
    for (int64_t i = 0; i < dim; ++i) dw[i] += partial[static_cast<size_t>(k * dim + i)];
}

// The loops live in functions of their own, over restrict pointers: inside the parallel_for
// lambda the compiler cannot prove that stores leave the captured pointers unchanged, and does
// not vectorise.
template <class T>
void swiglu_forward_range(const T* __restrict g, const T* __restrict u, T* __restrict h,
                          int64_t n) {
  using A = Acc<T>;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A gi = load(g[i]);
    h[i] = store<T>(gi * sigmoid(gi) * load(u[i]));
  }
}

template <class T>
void swiglu_backward_range(const T* __restrict gh, const T* __restrict g, const T* __restrict u,
                           T* __restrict dg, T* __restrict du, int64_t n) {
  using A = Acc<T>;
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const A gi = load(g[i]), ui = load(u[i]), go = load(gh[i]);
    const A s = sigmoid(gi);
    // d silu(g) / dg = s (1 + g (1 - s)).
    dg[i] = store<T>(go * ui * s * (A(1) + gi * (A(1) - s)));
    du[i] = store<T>(go * gi * s);
  }
}

template <class T>
void swiglu_forward(const T* g, const T* u, T* h, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
    swiglu_forward_range(g + i0, u + i0, h + i0, i1 - i0);
  });
}

template <class T>
void swiglu_backward(const T* gh, const T* g, const T* u, T* dg, T* du, int64_t n) {
  at::parallel_for(0, n, kGrain, [&](int64_t i0, int64_t i1) {
    swiglu_backward_range(gh + i0, g + i0, u + i0, dg + i0, du + i0, i1 - i0);
  });
}

template <class T>
void rope_rotate(const T* x, const Acc<T>* cos, const Acc<T>* sin, T* y, int64_t rows,
                 int64_t dim, int64_t T_len, int64_t half, int sign) {
  using A = Acc<T>;
  const A sg = static_cast<A>(sign);
  at::parallel_for(0, rows, row_grain(dim), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * dim;
      T* yr = y + r * dim;
      const A* c = cos + (r % T_len) * half;
      const A* s = sin + (r % T_len) * half;
#pragma omp simd
      for (int64_t i = 0; i < half; ++i) {
        const A x1 = load(xr[i]), x2 = load(xr[i + half]), si = sg * s[i];
        yr[i] = store<T>(x1 * c[i] - x2 * si);
        yr[i + half] = store<T>(x2 * c[i] + x1 * si);
      }
      for (int64_t i = 2 * half; i < dim; ++i) yr[i] = xr[i];
    }
  });
}

#define PHASEKV_INSTANTIATE_NORM(T, O)                                                           \
  template void rms_norm_forward<T, O>(const T*, const Acc<T>*, O*, Acc<T>*, int64_t, int64_t,   \
                                       double);                                                  \
  template void rms_norm_backward<T, O>(const O*, const T*, const Acc<T>*, const Acc<T>*, T*,    \
                                        Acc<T>*, int64_t, int64_t);
PHASEKV_INSTANTIATE_NORM(float, float)
PHASEKV_INSTANTIATE_NORM(double, double)
PHASEKV_INSTANTIATE_NORM(Bf16, Bf16)
PHASEKV_INSTANTIATE_NORM(float, Bf16)
#undef PHASEKV_INSTANTIATE_NORM

#define PHASEKV_INSTANTIATE(T)                                                                   \
  template void swiglu_forward<T>(const T*, const T*, T*, int64_t);                              \
  template void swiglu_backward<T>(const T*, const T*, const T*, T*, T*, int64_t);               \
  template void rope_rotate<T>(const T*, const Acc<T>*, const Acc<T>*, T*, int64_t, int64_t,     \
                               int64_t, int64_t, int);
PHASEKV_INSTANTIATE(float)
PHASEKV_INSTANTIATE(double)
PHASEKV_INSTANTIATE(Bf16)
#undef PHASEKV_INSTANTIATE

}  // namespace phasekv::kernels
