#include <fmt/format.h>

#include "perf/bench_suite.h"
#include "perf/timing.h"

namespace phasekv {

void make_quick(BenchOptions& o) {
  o.gemm_sizes = {512, 1024};
  o.gemm_reps = 3;
  o.large_d_model = 256;
  o.large_layers = 2;
  o.large_seq = 256;
  o.large_batch = 2;
  o.train_warmup = 1;
  o.train_reps = 3;
  o.contexts = {1024, 2048, 4096};
  o.decode_tokens = 8;
}

nlohmann::json bench_gemm(const BenchOptions& o, GemmPeak& peak) {
  peak = measure_gemm_peak(o.gemm_sizes, o.gemm_reps);
  fmt::print("== GEMM peak (n x n, {} threads, load average {:.1f})\n", o.threads, load_average());
  fmt::print(
      "  f32   {:8.1f} GFLOP/s  (n = {}; torch::mm {:.1f} at n = {}, phasekv linear "
      "(oneDNN) {:.1f} at n = {})\n",
      peak.f32_flops / 1e9, peak.f32_n, peak.f32_torch_flops / 1e9, peak.f32_torch_n,
      peak.f32_own_flops / 1e9, peak.f32_own_n);
  fmt::print("  bf16  {:8.1f} GFLOP/s  (n = {}, torch::mm, native bf16: {})\n",
             peak.bf16_flops / 1e9, peak.bf16_n, peak.bf16_native ? "yes" : "no");
  fmt::print("  bf16 / f32 = {:.2f}\n\n", peak.bf16_flops / peak.f32_flops);
  return {{"threads", o.threads},
          {"f32_gflops", peak.f32_flops / 1e9},
          {"f32_n", peak.f32_n},
          {"f32_torch_gflops", peak.f32_torch_flops / 1e9},
          {"f32_phasekv_gflops", peak.f32_own_flops / 1e9},
          {"bf16_gflops", peak.bf16_flops / 1e9},
          {"bf16_n", peak.bf16_n},
          {"bf16_native", peak.bf16_native},
          {"load_average", load_average()}};
}

}  // namespace phasekv
