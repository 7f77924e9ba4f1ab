// The hardware limit measured in-process: the best square-GEMM throughput libtorch reaches on
// this machine with the current thread count, in f32 and bf16. MFU is quoted against these
// measured peaks, not against a datasheet, so it answers "how much of what this library can do
// on this CPU does the model step use".
#pragma once
#include <vector>

namespace phasekv {

struct GemmPeak {
  double f32_flops = 0, bf16_flops = 0;  // FLOP/s, best over the sizes tried
  int f32_n = 0, bf16_n = 0;             // the size that reached it
  bool bf16_native = false;              // AVX512-BF16 / AMX present (else bf16 is emulated)
};

// Times torch::mm on n x n operands for each n in sizes (fastest of reps after a warm-up).
GemmPeak measure_gemm_peak(const std::vector<int>& sizes, int reps);

}  // namespace phasekv
