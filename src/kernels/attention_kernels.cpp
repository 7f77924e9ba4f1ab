// The banded attention's joint softmax and its narrow (diagonal) band (cpu_kernels.h).
#include "kernels/simd.h"

namespace phasekv::kernels {

using namespace detail;

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

#define PHASEKV_INSTANTIATE(T)                                                                   \
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
