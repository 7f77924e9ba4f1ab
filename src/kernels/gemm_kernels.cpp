// Matrix products (cpu_kernels.h, gemm_choice.h): the three f32 GEMM paths (oneDNN's sgemm,
// OpenBLAS through libtorch, and phasekv's batches of small matrices), chosen per shape class by
// measurement (gemm_choice.cpp says why no fixed rule is right on every CPU).
//
// Why our own small-matrix kernel: libtorch 1.13's CPU bmm in f32 runs one BLAS call per matrix
// after a select of each operand (its batched oneDNN path is bf16 only), which for the chunked
// layers' entry attention of the small model, [128 x 16] x [16 x 8] per sequence, is mostly
// per-call overhead (~180 us per bmm of 128 such products, against ~60-80 us here).
#include <ATen/ATen.h>
#include <dlfcn.h>
#include <oneapi/dnnl/dnnl.h>

#include <stdexcept>
#include <string>

#include "kernels/compute_threads.h"
#include "kernels/gemm_choice.h"
#include "kernels/simd.h"

namespace phasekv::kernels {

using namespace detail;

namespace {

// Rows per register block: R accumulators of W columns each, reused across K. W is one AVX-512
// register of floats (two AVX ones), or half of that for narrow products (N <= 8).
constexpr int64_t kRows = 8;

// c[r, 0..n) = sum_k a[r, k] b[k, 0..W) for R rows of a (row stride lda) against a packed b
// ([K, ldb], zero-padded to whole chunks); n <= W columns are stored (the tail chunk).
template <class A, int64_t R, int64_t W>
inline void block_product(const A* __restrict a, int64_t lda, const A* __restrict b, int64_t ldb,
                          A* __restrict c, int64_t ldc, int64_t K, int64_t n) {
  A acc[R][W] = {};
  for (int64_t k = 0; k < K; ++k) {
    const A* bk = b + k * ldb;
    for (int64_t r = 0; r < R; ++r) {
      const A av = a[r * lda + k];
#pragma omp simd
      for (int64_t w = 0; w < W; ++w) acc[r][w] += av * bk[w];
    }
  }
  for (int64_t r = 0; r < R; ++r)
    for (int64_t w = 0; w < n; ++w) c[r * ldc + w] = acc[r][w];
}

// One product C [M, N] = op(A) [M, K] x op(B) [K, N] using the scratch buffers of one task.
template <class A, int64_t W>
void one_product(const A* a, const A* b, A* c, int64_t M, int64_t N, int64_t K, bool trans_a,
                 bool trans_b, std::vector<A>& a_pack, std::vector<A>& b_pack) {
  const int64_t Np = (N + W - 1) / W * W;
  // op(B) as [K, Np] rows, zero-padded: every chunk is a whole vector.
  b_pack.assign(static_cast<size_t>(K * Np), A(0));
  for (int64_t k = 0; k < K; ++k)
    for (int64_t j = 0; j < N; ++j) b_pack[k * Np + j] = trans_b ? b[j * K + k] : b[k * N + j];
  // op(A) row-major: a transposed A is packed, a plain one read in place.
  const A* ap = a;
  if (trans_a) {
    a_pack.resize(static_cast<size_t>(M * K));
    for (int64_t i = 0; i < M; ++i)
      for (int64_t k = 0; k < K; ++k) a_pack[i * K + k] = a[k * M + i];
    ap = a_pack.data();
  }
  for (int64_t j = 0; j < Np; j += W) {
    const int64_t n = std::min(W, N - j);
    int64_t i = 0;
    for (; i + kRows <= M; i += kRows)
      block_product<A, kRows, W>(ap + i * K, K, b_pack.data() + j, Np, c + i * N + j, N, K, n);
    for (; i < M; ++i)
      block_product<A, 1, W>(ap + i * K, K, b_pack.data() + j, Np, c + i * N + j, N, K, n);
  }
}

}  // namespace

namespace {

void onednn_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* a,
                  int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  // oneDNN sizes its OpenMP team from this thread's nthreads ICV, which libtorch sets per thread
  // on first use: without this, a thread that has not yet run a parallel libtorch op (an HTTP
  // worker, say) would run oneDNN on every core instead of at::set_num_threads' count.
  at::internal::lazy_init_num_threads();
  const auto status = dnnl_sgemm(trans_a ? 'T' : 'N', trans_b ? 'T' : 'N', M, N, K, 1.0f, a, lda, b,
                                 ldb, beta, c, ldc);
  if (status != dnnl_success)
    throw std::runtime_error("oneDNN sgemm failed (status " + std::to_string(status) + ") for " +
                             std::to_string(M) + " x " + std::to_string(N) + " x " +
                             std::to_string(K));
}

// libtorch's f32 mm on views of the caller's buffers: Debian's libtorch hands it to the system
// BLAS (OpenBLAS), with the strides as leading dimensions and no copy.
void openblas_sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* a,
                    int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  at::AutoDispatchBelowAutograd no_autograd;
  const auto f32 = at::TensorOptions().dtype(at::kFloat);
  auto view = [&](const float* p, int64_t rows, int64_t cols, int64_t ld, bool trans) {
    auto* q = const_cast<float*>(p);  // read only: mm does not write its inputs
    return trans ? at::from_blob(q, {cols, rows}, {ld, 1}, f32).t()
                 : at::from_blob(q, {rows, cols}, {ld, 1}, f32);
  };
  auto C = at::from_blob(c, {M, N}, {ldc, 1}, f32);
  if (beta == 0.0f)
    at::mm_out(C, view(a, M, K, lda, trans_a), view(b, K, N, ldb, trans_b));
  else
    C.addmm_(view(a, M, K, lda, trans_a), view(b, K, N, ldb, trans_b), beta, 1.0f);
}

}  // namespace

void gemm_on(GemmPath path, const GemmShape& s, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc) {
  if (s.M == 0 || s.N == 0 || s.batch == 0) return;
  if (s.K == 0) {  // an empty sum; oneDNN rejects the zero leading dimensions that come with it
    for (int64_t m = 0; m < s.batch * s.M; ++m)
      for (int64_t j = 0; j < s.N; ++j)
        c[m * ldc + j] = beta == 0.0f ? 0.0f : beta * c[m * ldc + j];
    return;
  }
  if (path == GemmPath::kSmall) {
    if (!s.packed || beta != 0.0f)
      throw std::logic_error("gemm_on: the small kernel takes packed products with beta 0 only");
    small_batched_gemm<float>(a, b, c, s.batch, s.M, s.N, s.K, s.trans_a, s.trans_b);
    return;
  }
  if (s.batch > 1 && !s.packed)
    throw std::logic_error("gemm_on: a batch of products must be packed");
  auto* one = path == GemmPath::kOneDnn ? onednn_sgemm : openblas_sgemm;
  for (int64_t i = 0; i < s.batch; ++i)
    one(s.trans_a, s.trans_b, s.M, s.N, s.K, a + i * s.M * s.K, lda, b + i * s.K * s.N, ldb, beta,
        c + i * s.M * s.N, ldc);
}

void sgemm(bool trans_a, bool trans_b, int64_t M, int64_t N, int64_t K, const float* a, int64_t lda,
           const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (M == 0 || N == 0) return;
  const GemmShape s{1, M, N, K, trans_a, trans_b, false};
  gemm_on(K == 0 ? GemmPath::kOneDnn : gemm_chooser().choose(s), s, a, lda, b, ldb, beta, c, ldc);
}

template <class T>
void small_batched_gemm(const T* a, const T* b, T* c, int64_t batch, int64_t M, int64_t N,
                        int64_t K, bool trans_a, bool trans_b) {
  if (K == 0) {
    std::fill(c, c + batch * M * N, T(0));
    return;
  }
  const int64_t grain = std::max<int64_t>(1, kGrain / std::max<int64_t>(M * N * K, 1));
  at::parallel_for(0, batch, grain, [&](int64_t b0, int64_t b1) {
    std::vector<T> a_pack, b_pack;
    constexpr int64_t kWide = 64 / sizeof(T);
    for (int64_t i = b0; i < b1; ++i) {
      const T* ai = a + i * M * K;
      const T* bi = b + i * K * N;
      T* ci = c + i * M * N;
      if (N > kWide / 2)
        one_product<T, kWide>(ai, bi, ci, M, N, K, trans_a, trans_b, a_pack, b_pack);
      else
        one_product<T, kWide / 2>(ai, bi, ci, M, N, K, trans_a, trans_b, a_pack, b_pack);
    }
  });
}

template void small_batched_gemm<float>(const float*, const float*, float*, int64_t, int64_t,
                                        int64_t, int64_t, bool, bool);
template void small_batched_gemm<double>(const double*, const double*, double*, int64_t, int64_t,
                                         int64_t, int64_t, bool, bool);

void set_compute_threads(int n) {
  at::set_num_threads(n);
  // Looked up at run time: phasekv does not link OpenBLAS itself, libtorch's BLAS may be another.
  using SetThreads = void (*)(int);
  static const auto openblas =
      reinterpret_cast<SetThreads>(dlsym(RTLD_DEFAULT, "openblas_set_num_threads"));
  if (openblas) openblas(n);
}

}  // namespace phasekv::kernels
