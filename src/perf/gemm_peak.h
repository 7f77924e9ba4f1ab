// The hardware limit measured in-process: the best square-GEMM throughput reached on this machine
// with the current thread count, in f32 and bf16. MFU is quoted against these measured peaks, not
// against a datasheet, so it answers "how much of what the GEMM libraries can do on this CPU does
// the model step use". f32 is the better of libtorch's torch::mm (Debian: OpenBLAS) and
// phasekv's own f32 product (model/fused.h linear, on the path kernels/gemm_choice.h measured
// fastest for the shape), which can differ 2x by CPU.
#pragma once
#include <vector>

namespace phasekv {

struct GemmPeak {
  double f32_flops = 0, bf16_flops = 0;  // FLOP/s, best over the sizes tried (and f32 paths)
  int f32_n = 0, bf16_n = 0;             // the size that reached it
  double f32_torch_flops = 0, f32_own_flops = 0;  // f32: torch::mm, phasekv's linear
  int f32_torch_n = 0, f32_own_n = 0;
  bool bf16_native = false;  // AVX512-BF16 / AMX present (else bf16 is emulated)
};

// Times torch::mm (f32, bf16) and phasekv's f32 linear on n x n operands for each n in sizes
// (fastest of reps after a warm-up).
GemmPeak measure_gemm_peak(const std::vector<int>& sizes, int reps);

}  // namespace phasekv
