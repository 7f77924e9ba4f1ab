#include "kernels/cpu_kernels.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace phasekv::kernels {
namespace {

// Loads and stores between storage and arithmetic types. bf16 -> f32 is a shift; f32 -> bf16
// rounds to nearest even (NaN stays NaN), like c10::BFloat16, written so that loops vectorise.
inline float load(float v) { return v; }
inline double load(double v) { return v; }
inline float load(Bf16 v) {
  uint32_t b = static_cast<uint32_t>(v.bits) << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
template <class T>
inline T store(Acc<T> v);
template <>
inline float store<float>(float v) {
  return v;
}
template <>
inline double store<double>(double v) {
  return v;
}
template <>
inline Bf16 store<Bf16>(float v) {
  uint32_t b;
  std::memcpy(&b, &v, 4);
  const bool nan = (b & 0x7fffffffu) > 0x7f800000u;
  const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
  return Bf16{static_cast<uint16_t>(nan ? 0x7fc0u : rounded)};
}

// exp for f32 arithmetic: 2^(x log2 e) split into an integer power (exponent bits) and a
// degree-6 polynomial on [-0.5, 0.5] (relative error ~2e-7). std::exp does not vectorise here.
inline float exp_fast(float x) {
  x = std::min(std::max(x, -87.0f), 88.0f);
  const float t = x * 1.44269504088896341f;
  // Round to nearest by adding and subtracting 1.5 * 2^23 (std::floor does not vectorise here).
  const float fi = (t + 12582912.0f) - 12582912.0f;
  const float f = t - fi;
  float p = 1.540353039e-4f;
  p = p * f + 1.333355815e-3f;
  p = p * f + 9.618129108e-3f;
  p = p * f + 5.550410866e-2f;
  p = p * f + 2.402265070e-1f;
  p = p * f + 6.931471806e-1f;
  p = p * f + 1.0f;
  const uint32_t bits = static_cast<uint32_t>(static_cast<int32_t>(fi) + 127) << 23;
  float scale;
  std::memcpy(&scale, &bits, 4);
  return p * scale;
}
inline double exp_fast(double x) { return std::exp(x); }

template <class A>
inline A sigmoid(A x) {
  return A(1) / (A(1) + exp_fast(-x));
}

// Elements per parallel task for element-wise loops, rows per task for row-wise ones.
constexpr int64_t kGrain = 1 << 15;
inline int64_t row_grain(int64_t dim) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1));
}

}  // namespace

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

namespace {

// The softmax of one row, in place over the biased scores in pr[0, n). Masked columns (-inf)
// get exactly 0 (exp_fast clamps its argument and would not).
template <class A>
void softmax_row(A* __restrict pr, int64_t n) {
  A m = -INFINITY;
  for (int64_t j = 0; j < n; ++j) m = std::max(m, pr[j]);
  A sum = 0;
#pragma omp simd reduction(+ : sum)
  for (int64_t j = 0; j < n; ++j) {
    const A e = pr[j] == A(-INFINITY) ? A(0) : exp_fast(pr[j] - m);
    pr[j] = e;
    sum += e;
  }
  const A inv = A(1) / sum;
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) pr[j] *= inv;
}

template <class T>
void biased_scores(const T* __restrict s, const float* __restrict bias, Acc<T>* __restrict out,
                   int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = load(s[j]) + static_cast<Acc<T>>(bias[j]);
}

template <class T>
void store_row(const Acc<T>* __restrict p, T* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) out[j] = store<T>(p[j]);
}

// sum_j p_j dp_j over one piece (dp null: zero).
template <class T>
Acc<T> dot_row(const Acc<T>* __restrict p, const T* __restrict dp, int64_t n) {
  Acc<T> d = 0;
  if (dp == nullptr) return d;
#pragma omp simd reduction(+ : d)
  for (int64_t j = 0; j < n; ++j) d += p[j] * load(dp[j]);
  return d;
}

// ds_j = p_j (dp_j - dot).
template <class T>
void softmax_grad_row(const Acc<T>* __restrict p, const T* __restrict dp, Acc<T> dot,
                      T* __restrict ds, int64_t n) {
  if (dp == nullptr) {
#pragma omp simd
    for (int64_t j = 0; j < n; ++j) ds[j] = store<T>(-p[j] * dot);
    return;
  }
#pragma omp simd
  for (int64_t j = 0; j < n; ++j) ds[j] = store<T>(p[j] * (load(dp[j]) - dot));
}

}  // namespace

template <class T>
void banded_softmax_forward(const T* se, const T* sb, const float* bias, const Acc<T>* sink,
                            Acc<T>* p, T* pe, T* pb, int64_t R, int64_t E, int64_t L, int64_t G,
                            int64_t Tp, int64_t Hkv) {
  const int64_t N = E + L + (sink ? 1 : 0);
  at::parallel_for(0, R, row_grain(N), [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t t = (r / G) % Tp;
      Acc<T>* pr = p + r * N;
      const float* br = bias + t * (E + L);
      if (E > 0) biased_scores(se + r * E, br, pr, E);
      if (L > 0) biased_scores(sb + r * L, br + E, pr + E, L);
      if (sink) pr[E + L] = sink[((r / (G * Tp)) % Hkv) * G + r % G];
      softmax_row(pr, N);
      if (E > 0) store_row(pr, pe + r * E, E);
      if (L > 0) store_row(pr + E, pb + r * L, L);
    }
  });
}

template <class T>
void banded_softmax_backward(const Acc<T>* p, const T* dpe, const T* dpb, T* dse, T* dsb,
                             Acc<T>* dsink, int64_t R, int64_t E, int64_t L, int64_t G,
                             int64_t Tp, int64_t Hkv) {
  using A = Acc<T>;
  const int64_t N = E + L + (dsink ? 1 : 0), H = Hkv * G, grain = row_grain(N);
  const int64_t tasks = (R + grain - 1) / grain;
  // The sink's gradient sums over rows: one partial per task, added in task order.
  std::vector<A> partial(dsink ? static_cast<size_t>(std::max<int64_t>(tasks, 1) * H) : 0, A(0));
  at::parallel_for(0, tasks, 1, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      for (int64_t r = k * grain; r < std::min(R, (k + 1) * grain); ++r) {
        const A* pr = p + r * N;
        const T* dpe_r = dpe ? dpe + r * E : nullptr;
        const T* dpb_r = dpb ? dpb + r * L : nullptr;
        const A dot = dot_row(pr, dpe_r, E) + dot_row(pr + E, dpb_r, L);
        if (E > 0) softmax_grad_row(pr, dpe_r, dot, dse + r * E, E);
        if (L > 0) softmax_grad_row(pr + E, dpb_r, dot, dsb + r * L, L);
        // The sink's probability is dropped (dp = 0): its score gets -p_sink * dot.
        if (dsink) partial[static_cast<size_t>(k * H + ((r / (G * Tp)) % Hkv) * G + r % G)] -=
                   pr[E + L] * dot;
      }
    }
  });
  if (dsink)
    for (int64_t k = 0; k < tasks; ++k)
      for (int64_t h = 0; h < H; ++h) dsink[h] += partial[static_cast<size_t>(k * H + h)];
}

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

namespace {

template <class T>
Acc<T> dot(const T* __restrict a, const T* __restrict b, int64_t n) {
  Acc<T> d = 0;
#pragma omp simd reduction(+ : d)
  for (int64_t i = 0; i < n; ++i) d += load(a[i]) * load(b[i]);
  return d;
}

// acc[0, n) += w * x[0, n).
template <class T>
void axpy(Acc<T> w, const T* __restrict x, Acc<T>* __restrict acc, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) acc[i] += w * load(x[i]);
}

template <class T>
void store_all(const Acc<T>* __restrict acc, T* __restrict out, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) out[i] = store<T>(acc[i]);
}

}  // namespace

template <class T>
void band_diag_scores(const T* q, const T* k, T* s, int64_t BH, int64_t T_len, int64_t G,
                      int64_t hd, int64_t L) {
  at::parallel_for(0, BH, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const T* kb = k + b * T_len * hd;
      for (int64_t t = 0; t < T_len; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = (b * T_len + t) * G + g;
          for (int64_t l = 0; l < L; ++l)
            s[row * L + l] =
                store<T>(t - l >= 0 ? dot(q + row * hd, kb + (t - l) * hd, hd) : Acc<T>(0));
        }
    }
  });
}

template <class T>
void band_diag_scores_backward(const T* ds, const T* q, const T* k, T* dq, T* dk, int64_t BH,
                               int64_t T_len, int64_t G, int64_t hd, int64_t L) {
  at::parallel_for(0, BH, 1, [&](int64_t b0, int64_t b1) {
    // Key gradients collect from L query positions: accumulate in f32 per slice.
    std::vector<Acc<T>> dk_acc(static_cast<size_t>(T_len * hd)), dq_acc(static_cast<size_t>(hd));
    for (int64_t b = b0; b < b1; ++b) {
      const T* kb = k + b * T_len * hd;
      std::fill(dk_acc.begin(), dk_acc.end(), Acc<T>(0));
      for (int64_t t = 0; t < T_len; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = (b * T_len + t) * G + g;
          std::fill(dq_acc.begin(), dq_acc.end(), Acc<T>(0));
          for (int64_t l = 0; l < L && t - l >= 0; ++l) {
            const Acc<T> w = load(ds[row * L + l]);
            axpy(w, kb + (t - l) * hd, dq_acc.data(), hd);
            axpy(w, q + row * hd, dk_acc.data() + (t - l) * hd, hd);
          }
          store_all(dq_acc.data(), dq + row * hd, hd);
        }
      store_all(dk_acc.data(), dk + b * T_len * hd, T_len * hd);
    }
  });
}

template <class T>
void band_diag_output(const T* p, const T* v, T* o, int64_t BH, int64_t T_len, int64_t G,
                      int64_t hd, int64_t L) {
  at::parallel_for(0, BH, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Acc<T>> acc(static_cast<size_t>(hd));
    for (int64_t b = b0; b < b1; ++b) {
      const T* vb = v + b * T_len * hd;
      for (int64_t t = 0; t < T_len; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = (b * T_len + t) * G + g;
          std::fill(acc.begin(), acc.end(), Acc<T>(0));
          for (int64_t l = 0; l < L && t - l >= 0; ++l)
            axpy(load(p[row * L + l]), vb + (t - l) * hd, acc.data(), hd);
          store_all(acc.data(), o + row * hd, hd);
        }
    }
  });
}

template <class T>
void band_diag_output_backward(const T* dout, const T* p, const T* v, T* dp, T* dv, int64_t BH,
                               int64_t T_len, int64_t G, int64_t hd, int64_t L) {
  at::parallel_for(0, BH, 1, [&](int64_t b0, int64_t b1) {
    std::vector<Acc<T>> dv_acc(static_cast<size_t>(T_len * hd));
    for (int64_t b = b0; b < b1; ++b) {
      const T* vb = v + b * T_len * hd;
      std::fill(dv_acc.begin(), dv_acc.end(), Acc<T>(0));
      for (int64_t t = 0; t < T_len; ++t)
        for (int64_t g = 0; g < G; ++g) {
          const int64_t row = (b * T_len + t) * G + g;
          for (int64_t l = 0; l < L; ++l) {
            if (t - l < 0) {
              dp[row * L + l] = store<T>(Acc<T>(0));
              continue;
            }
            dp[row * L + l] = store<T>(dot(dout + row * hd, vb + (t - l) * hd, hd));
            axpy(load(p[row * L + l]), dout + row * hd, dv_acc.data() + (t - l) * hd, hd);
          }
        }
      store_all(dv_acc.data(), dv + b * T_len * hd, T_len * hd);
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
                               int64_t, int64_t, int);                                   \
  template void banded_softmax_forward<T>(const T*, const T*, const float*, const Acc<T>*,       \
                                          Acc<T>*, T*, T*, int64_t, int64_t, int64_t, int64_t,   \
                                          int64_t, int64_t);                                     \
  template void banded_softmax_backward<T>(const Acc<T>*, const T*, const T*, T*, T*, Acc<T>*,   \
                                           int64_t, int64_t, int64_t, int64_t, int64_t, int64_t); \
  template void band_diag_scores<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t,  \
                                    int64_t);                                                    \
  template void band_diag_scores_backward<T>(const T*, const T*, const T*, T*, T*, int64_t,      \
                                             int64_t, int64_t, int64_t, int64_t);                \
  template void band_diag_output<T>(const T*, const T*, T*, int64_t, int64_t, int64_t, int64_t,  \
                                    int64_t);                                                    \
  template void band_diag_output_backward<T>(const T*, const T*, const T*, T*, T*, int64_t,      \
                                             int64_t, int64_t, int64_t, int64_t);
PHASEKV_INSTANTIATE(float)
PHASEKV_INSTANTIATE(double)
PHASEKV_INSTANTIATE(Bf16)
#undef PHASEKV_INSTANTIATE

}  // namespace phasekv::kernels
