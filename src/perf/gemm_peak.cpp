#include "perf/gemm_peak.h"

#include <torch/torch.h>

#include "model/precision.h"
#include "perf/timing.h"

namespace phasekv {

GemmPeak measure_gemm_peak(const std::vector<int>& sizes, int reps) {
  torch::NoGradGuard no_grad;
  GemmPeak p;
  p.bf16_native = bf16_native();
  torch::manual_seed(0);
  for (int n : sizes) {
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
      auto c = torch::empty({n, n}, dtype);
      auto t = time_runs([&] { torch::mm_out(c, a, b); }, 2, reps);
      const double flops = 2.0 * n * n * double(n) / t.min_s;  // the peak: the fastest run
      double& best = dtype == torch::kFloat32 ? p.f32_flops : p.bf16_flops;
      int& best_n = dtype == torch::kFloat32 ? p.f32_n : p.bf16_n;
      if (flops > best) best = flops, best_n = n;
    }
  }
  return p;
}

}  // namespace phasekv
