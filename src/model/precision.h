// Mixed precision on CPU: bf16 matmuls over f32 master weights, through libtorch's CPU autocast.
//
// Inside a PrecisionGuard(Precision::kBf16) scope, linear/matmul/bmm (and so their backward)
// run in bf16: oneDNN uses AVX512-BF16 or AMX there, several times the f32 GEMM throughput.
// Parameters, optimiser state and gradients stay f32 (autocast casts the weights per forward and
// the cast's backward returns f32 gradients). Everything autocast does not cast keeps its
// precision: RMSNorm normalises in f32, attend_fast runs its softmax in f32, the residual stream
// stays f32 (f32 + bf16 promotes to f32). Logits come out bf16: cast them to f32 before a loss.
//
// Without native bf16 GEMMs (no AVX512-BF16/AMX) bf16 is emulated and slower than f32, so a kBf16
// request falls back to f32 unless forced (tests force it to check correctness anywhere).
#pragma once
#include <ATen/autocast_mode.h>
#include <torch/torch.h>

namespace phasekv {

enum class Precision { kF32, kBf16 };

// Flushes denormals to zero (FTZ/DAZ) on the calling thread; call it before any worker thread
// exists, so that they inherit it. Why: once a model fits its data, its gradients and Adam's
// second moments underflow into denormals, which x86 processes about 100x slower (a lookup run fell
// from 123K to 7K tokens/s right after its induction warm-up). Nothing phasekv computes needs them.
inline void flush_denormals() { at::globalContext().setFlushDenormal(true); }

// Whether this CPU runs bf16 dot products natively (AVX512-BF16 or AMX-BF16).
inline bool bf16_native() {
#if defined(__x86_64__) && defined(__GNUC__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") || __builtin_cpu_supports("amx-bf16");
#else
  return false;
#endif
}

// The precision a request gets on this machine.
inline Precision resolve_precision(Precision requested, bool force = false) {
  if (requested == Precision::kBf16 && !force && !bf16_native()) return Precision::kF32;
  return requested;
}

// Enables (kBf16) or disables (kF32) CPU autocast for its scope and restores the previous state on
// exit, so guards nest. Thread-local, like autocast itself: guard each thread that runs a forward.
class PrecisionGuard {
 public:
  explicit PrecisionGuard(Precision requested, bool force = false)
      : active_(resolve_precision(requested, force)),
        prev_enabled_(at::autocast::is_cpu_enabled()),
        prev_dtype_(at::autocast::get_autocast_cpu_dtype()) {
    at::autocast::set_cpu_enabled(active_ == Precision::kBf16);
    at::autocast::set_autocast_cpu_dtype(at::kBFloat16);
    at::autocast::increment_nesting();
  }
  ~PrecisionGuard() {
    // The weight-cast cache lives as long as the outermost autocast scope: weights change after an
    // optimiser step, so the next forward must cast them again.
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_cpu_enabled(prev_enabled_);
    at::autocast::set_autocast_cpu_dtype(prev_dtype_);
  }
  PrecisionGuard(const PrecisionGuard&) = delete;
  PrecisionGuard& operator=(const PrecisionGuard&) = delete;

  Precision active() const { return active_; }

 private:
  Precision active_;
  bool prev_enabled_;
  at::ScalarType prev_dtype_;
};

}  // namespace phasekv
