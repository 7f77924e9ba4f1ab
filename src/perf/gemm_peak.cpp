#include "perf/gemm_peak.h"

#include <torch/torch.h>

#include "model/fused.h"
#include "model/precision.h"
#include "perf/timing.h"

namespace phasekv {

namespace {

// FLOP/s of the fastest of reps runs of an n x n x n product.
template <class F>
double gemm_flops(int n, int reps, F&& run) {
  auto t = time_runs(run, 2, reps);
  return 2.0 * n * n * double(n) / t.min_s;
}

void keep_best(double flops, int n, double& best, int& best_n) {
  if (flops > best) best = flops, best_n = n;
}

}  // namespace

GemmPeak measure_gemm_peak(const std::vector<int>& sizes, int reps) {
  torch::NoGradGuard no_grad;
  GemmPeak p;
  p.bf16_native = bf16_native();
  torch::manual_seed(0);
  for (int n : sizes) {
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
      auto c = torch::empty({n, n}, dtype);
      const double flops = gemm_flops(n, reps, [&] { torch::mm_out(c, a, b); });
      if (dtype == torch::kBFloat16) {
        keep_best(flops, n, p.bf16_flops, p.bf16_n);
        continue;
      }
      keep_best(flops, n, p.f32_torch_flops, p.f32_torch_n);
      const double own = gemm_flops(n, reps, [&] { linear(a, b, torch::Tensor()); });
      keep_best(own, n, p.f32_own_flops, p.f32_own_n);
    }
  }
  p.f32_flops = std::max(p.f32_torch_flops, p.f32_own_flops);
  p.f32_n = p.f32_own_flops >= p.f32_torch_flops ? p.f32_own_n : p.f32_torch_n;
  return p;
}

}  // namespace phasekv
