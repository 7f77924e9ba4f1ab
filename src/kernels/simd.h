// Shared helpers of the kernel files: storage <-> arithmetic conversions, a vectorisable exp,
// parallel grains. Included only by src/kernels/*.cpp, which are all compiled with the same
// (possibly -march=native) flags.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu_kernels.h"

namespace phasekv::kernels::detail {

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
inline constexpr int64_t kGrain = 1 << 15;
inline int64_t row_grain(int64_t dim) {
  return std::max<int64_t>(1, kGrain / std::max<int64_t>(dim, 1));
}

}  // namespace phasekv::kernels::detail
