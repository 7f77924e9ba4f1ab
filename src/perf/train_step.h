// The benchmark training step, defined once so that phasekv and the PyTorch reference
// (bench/torch_reference.py) time and check exactly the same work: fixed random tokens
// [B, T+1], next-token cross-entropy at every position, backward, global gradient-norm clipping
// at 1.0, one AdamW step (lr 1e-3, betas 0.9/0.95, weight decay 0.1 on every parameter).
// Forward and loss run under PrecisionGuard, so bf16 means CPU autocast over f32 master weights,
// as in `phasekv train` with precision = "bf16".
#pragma once
#include <torch/torch.h>

#include <string>

#include "config/model_config.h"
#include "model/precision.h"
#include "perf/op_profile.h"
#include "train/train_config.h"

namespace phasekv {

struct TrainStepSpec {
  std::string name;  // "small", "large": how tables label it
  ModelConfig model;
  int64_t batch = 1, seq = 1;
};

struct TrainStepResult {
  Precision precision = Precision::kF32;  // what ran (bf16 falls back to f32 without native bf16)
  // The machine may be shared: the fastest of the timed steps is the figure least disturbed by
  // other jobs, so rates use it; the median is kept for reference.
  double step_s = 0, median_step_s = 0;
  double tokens_per_s = 0;
  double flops_per_step = 0;  // model FLOPs (perf/flops.h)
  double flops_per_s = 0;     // achieved model FLOP/s
  double loss = 0;            // loss of the last timed step
  ComponentProfile components;  // with `components`: one more step, by component
};

// Times `reps` steps after `warmup` untimed ones, from weights initialised with `seed`. With a
// profile path, one more step runs under libtorch's profiler and its trace (chrome://tracing
// JSON) is written there, and another under the op profiler (perf/op_profile.h): path + ".ops.tsv".
// With components, one more step runs under profile_components (perf/op_profile.h).
TrainStepResult time_train_step(const TrainStepSpec& spec, Precision precision, int warmup,
                                int reps, uint64_t seed, const std::string& profile = "",
                                bool components = false);

// The same step (random tokens [batch, seq + 1], loss at every position, clip 1.0, the same
// AdamW) on the DeepSeek-V4 model of a training config ([model] naming a V4 config), in f32:
// V4 trains in f32 only. No FLOP count: perf/flops.h counts phasekv's Decoder. A profile path
// writes the trace and the op table as time_train_step does.
TrainStepResult time_v4_train_step(const TrainConfig& cfg, int64_t batch, int64_t seq, int warmup,
                                   int reps, uint64_t seed, const std::string& profile = "");

// One forward + backward in f32 on the seeded model and batch, written for the reference to
// check: DIR/config.json + model.safetensors (the model directory), DIR/batch.safetensors
// (tokens [B, T+1] int64), DIR/grads.safetensors (every parameter's gradient, f32) and
// DIR/step.json (loss, gradient norms, B, T). Returns the loss.
double dump_train_step(const TrainStepSpec& spec, const std::string& dir, uint64_t seed);

// The batch both sides use: tokens [B, T+1], seeded.
torch::Tensor train_step_tokens(const TrainStepSpec& spec, uint64_t seed);

}  // namespace phasekv
