#include <fmt/format.h>

#include "kernels/gemm_choice.h"
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
  o.eval_examples = 50;
  o.eval_batches = {64};
}

namespace {

// Every shape class this machine has measured (the cache's and this run's), with each path's
// time on the class's measured shape and the path phasekv takes for it.
nlohmann::json print_gemm_choices(const BenchOptions& o) {
  namespace k = kernels;
  auto& chooser = k::gemm_chooser();
  for (int n : o.gemm_sizes) {  // the square sizes are always among the classes shown
    const k::GemmShape s{1, n, n, n, false, false, false};
    o.recalibrate_gemm ? chooser.recalibrate(s) : chooser.choose(s);
  }
  fmt::print("== f32 GEMM path per shape class (policy {}, cache {})\n", chooser.policy(),
             chooser.cache_file().empty() ? "none" : chooser.cache_file());
  fmt::print("{:<34} {:>20} {:>10} {:>10} {:>10}  {}\n", "class", "measured shape", "onednn us",
             "openblas us", "small us", "chosen");
  nlohmann::json out = nlohmann::json::array();
  auto us = [](const std::map<std::string, double>& t, const char* name) {
    auto it = t.find(name);
    return it == t.end() ? std::string("-") : fmt::format("{:.1f}", it->second * 1e6);
  };
  for (const auto& [key, e] : chooser.entries()) {
    fmt::print("{:<34} {:>20} {:>10} {:>10} {:>10}  {}\n", key, e.shape, us(e.seconds, "onednn"),
               us(e.seconds, "openblas"), us(e.seconds, "small"), k::gemm_path_name(e.chosen));
    out.push_back({{"class", key},
                   {"shape", e.shape},
                   {"seconds", e.seconds},
                   {"chosen", k::gemm_path_name(e.chosen)}});
  }
  fmt::print("\n");
  return out;
}

}  // namespace

nlohmann::json bench_gemm(const BenchOptions& o, GemmPeak& peak) {
  peak = measure_gemm_peak(o.gemm_sizes, o.gemm_reps);
  fmt::print("== GEMM peak (n x n, {} threads, load average {:.1f})\n", o.threads, load_average());
  fmt::print(
      "  f32   {:8.1f} GFLOP/s  (n = {}; torch::mm {:.1f} at n = {}, phasekv linear "
      "(chosen path) {:.1f} at n = {})\n",
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
          {"load_average", load_average()},
          {"paths", print_gemm_choices(o)}};
}

}  // namespace phasekv
