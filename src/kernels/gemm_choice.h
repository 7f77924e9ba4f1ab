// Which f32 GEMM path runs a product on this machine, chosen by measurement.
//
// Why not a fixed rule: Debian's OpenBLAS 0.3.21 does not know AMD Zen 5 and runs its Haswell
// kernels there, at half of oneDNN's sgemm; on a Zen 1 (AVX2 only) OpenBLAS is the faster one by
// about 1.9x; and for many small matrices phasekv's own register-blocked kernel beats both, by a
// margin that depends on the vector width. So the first product of each shape class times every
// path that applies and keeps the fastest. Choices are stored per CPU model in a small JSON cache
// (gemm_cache_file()), shared by every process of this machine under a file lock: the first
// process to measure a class decides it for all, so two runs of one config (a training and its
// resume) take the same paths and stay bit-identical.
//
// PHASEKV_GEMM = auto (default) | onednn | openblas fixes the path of every non-small product
// instead; PHASEKV_CACHE_DIR moves the cache (default $XDG_CACHE_HOME/phasekv or ~/.cache/phasekv).
#pragma once
#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace phasekv::kernels {

enum class GemmPath { kOneDnn, kOpenBlas, kSmall };
const char* gemm_path_name(GemmPath p);

// One call's geometry. packed: contiguous operands and beta = 0, the only form the small-matrix
// kernel takes (batched_matmul's products); sgemm's strided products with beta are not packed.
struct GemmShape {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false, packed = false;
};

// The paths a shape may take: oneDNN and OpenBLAS always, the small kernel for packed products of
// at most kMaxSmallKernelProduct multiply-adds per matrix (beyond it, without cache blocking, it
// cannot compete and timing it would only slow the calibration).
constexpr int64_t kMaxSmallKernelProduct = int64_t{1} << 22;
std::vector<GemmPath> gemm_candidates(const GemmShape& s);

// The class a measurement stands for: each of batch, M, N, K rounded up to a power of two, the
// transposes, packed or not, and the thread count (the best path at 2 threads can differ).
std::string gemm_class_key(const GemmShape& s, int threads);

struct GemmTiming {
  GemmPath path;
  double seconds;  // fastest repetition of one call of the shape
};
// Times each candidate on random operands of exactly this shape (two interleaved rounds of a
// warm-up and then at least 3 repetitions and about 2 ms per path; the fastest repetition), on
// the calling thread's libtorch thread count.
std::vector<GemmTiming> time_gemm_paths(const GemmShape& s);

// Runs one product on a given path: C = op(A) op(B) + beta C for each of `batch` matrices (the
// small kernel: packed only, beta 0). Strides as in cpu_kernels.h sgemm; batch > 1 needs packed.
void gemm_on(GemmPath path, const GemmShape& s, const float* a, int64_t lda, const float* b,
             int64_t ldb, float beta, float* c, int64_t ldc);

// The measured choices of one machine (one cache file). Thread-safe.
class GemmChooser {
 public:
  // cache_file empty: choices live in memory only. policy: "auto", "onednn" or "openblas".
  GemmChooser(std::string cache_file, std::string policy);

  GemmPath choose(const GemmShape& s);
  // Measures the class of s anew, replacing the stored choice (bench gemm --recalibrate).
  GemmPath recalibrate(const GemmShape& s);

  struct Entry {
    GemmPath chosen;
    std::map<std::string, double> seconds;  // per path name, of the shape that was measured
    std::string shape;                      // "batch x M x N x K", the measured representative
  };
  // Every class known to this chooser (its cache file's and its own), by key.
  std::map<std::string, Entry> entries();
  int measurements() const { return measurements_; }  // classes this object timed itself
  const std::string& cache_file() const { return cache_file_; }
  const std::string& policy() const { return policy_; }

 private:
  GemmPath measure_locked(const GemmShape& s, const std::string& key, bool replace);
  void load_file_locked();

  std::string cache_file_, policy_;
  std::mutex mu_;
  std::map<std::string, Entry> entries_;
  bool loaded_ = false, warned_ = false;
  int measurements_ = 0;
};

// The process's chooser: the cache file of this CPU model and PHASEKV_GEMM's policy (read once;
// an unknown value throws naming the variable and the allowed values).
GemmChooser& gemm_chooser();

// $PHASEKV_CACHE_DIR, else $XDG_CACHE_HOME/phasekv, else $HOME/.cache/phasekv, then
// gemm-<hash of the CPU model and the libraries>.json; empty when no directory is known.
std::string gemm_cache_file();

}  // namespace phasekv::kernels
