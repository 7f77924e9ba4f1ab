// Attention core and GEMM throughput on the CPU (2 threads, as in training):
//  - attention forward+backward, reference vs fast, chunked S=4 with a raw window n_win (1, 128),
//    T in {64, 256, 1024, 4096} at a fixed token budget (B*T = 8192), H=4, one KV head, hd=16;
//  - full causal attention, reference vs fast;
//  - a 1024^3 matmul in f32 vs bf16 (GFLOP/s);
//  - the small model's batched entry products, torch::matmul vs batched_matmul (model/fused.h);
//  - one training step (forward+backward) of a tiny 2-layer chunked model, ref/fast x f32/bf16.
// Times are wall clock (both threads); the CPU column is the whole process's CPU time.
// Run: build-fast/phasekv_bench [--benchmark_filter=Attention]
#include <benchmark/benchmark.h>
#include <torch/torch.h>

#include "model/attend_fast.h"
#include "model/attend_reference.h"
#include "model/attention.h"
#include "model/decoder.h"
#include "model/fused.h"
#include "model/precision.h"

namespace phasekv {
namespace {

constexpr int64_t kTokens = 8192, kHeads = 4, kKvHeads = 1, kHeadDim = 16, kStride = 4;

struct AttnInputs {
  AttentionConfig cfg;
  torch::Tensor q, pos, ek, ev, rk, rv, probe;
};

AttnInputs attention_inputs(AttentionKind kind, int64_t T, int n_win) {
  AttnInputs in;
  in.cfg.kind = kind;
  in.cfg.stride = kStride;
  in.cfg.n_win = n_win;
  const int64_t B = std::max<int64_t>(1, kTokens / T);
  torch::manual_seed(0);
  auto opts = torch::TensorOptions().requires_grad(true);
  in.q = torch::randn({B, kHeads, T, kHeadDim}, opts);
  in.pos = torch::arange(T, torch::kInt64);
  in.rk = torch::randn({B, kKvHeads, T, kHeadDim}, opts);
  in.rv = torch::randn({B, kKvHeads, T, kHeadDim}, opts);
  if (kind == AttentionKind::kChunked) {
    in.ek = torch::randn({B, kKvHeads, T / kStride, kHeadDim}, opts);
    in.ev = torch::randn({B, kKvHeads, T / kStride, kHeadDim}, opts);
  }
  in.probe = torch::randn({B, kHeads, T, kHeadDim});
  return in;
}

// state.range: 0 = T, 1 = n_win, 2 = path (0 reference, 1 fast).
void run_attention(benchmark::State& state, AttentionKind kind) {
  auto in = attention_inputs(kind, state.range(0), static_cast<int>(state.range(1)));
  const bool fast = state.range(2) == 1;
  for (auto _ : state) {
    auto out = fast
                   ? attend_fast(in.cfg, in.q, in.pos, in.ek, in.ev, in.rk, in.rv, in.pos, {})
                   : attend_reference(in.cfg, in.q, in.pos, in.ek, in.ev, in.rk, in.rv, in.pos, {});
    (out * in.probe).sum().backward();
    benchmark::DoNotOptimize(in.q.grad().data_ptr());
  }
  state.SetLabel(fast ? "fast" : "reference");
  state.counters["tokens/s"] = benchmark::Counter(static_cast<double>(in.q.size(0) * in.q.size(2)),
                                                  benchmark::Counter::kIsIterationInvariantRate);
}

void BM_AttentionChunked(benchmark::State& state) {
  run_attention(state, AttentionKind::kChunked);
}
void BM_AttentionFull(benchmark::State& state) {
  run_attention(state, AttentionKind::kFull);
}

void chunked_args(benchmark::internal::Benchmark* b) {
  for (int64_t T : {64, 256, 1024, 4096})
    for (int64_t n_win : {1, 128})
      for (int64_t path : {0, 1}) b->Args({T, n_win, path});
  b->ArgNames({"T", "n_win", "fast"})->Unit(benchmark::kMillisecond);
  b->MeasureProcessCPUTime()->UseRealTime();
}

void full_args(benchmark::internal::Benchmark* b) {
  for (int64_t T : {256, 1024, 4096})
    for (int64_t path : {0, 1}) b->Args({T, 0, path});
  b->ArgNames({"T", "n_win", "fast"})->Unit(benchmark::kMillisecond);
  b->MeasureProcessCPUTime()->UseRealTime();
}

BENCHMARK(BM_AttentionChunked)->Apply(chunked_args);
BENCHMARK(BM_AttentionFull)->Apply(full_args);

// state.range(0): 0 = f32, 1 = bf16 operands (oneDNN).
void BM_Gemm1024(benchmark::State& state) {
  constexpr int64_t n = 1024;
  const auto dtype = state.range(0) == 1 ? torch::kBFloat16 : torch::kFloat32;
  torch::manual_seed(0);
  auto a = torch::randn({n, n}).to(dtype), b = torch::randn({n, n}).to(dtype);
  for (auto _ : state) benchmark::DoNotOptimize(torch::mm(a, b).data_ptr());
  state.SetLabel(dtype == torch::kBFloat16 ? "bf16" : "f32");
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * n * n, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_Gemm1024)
    ->Arg(0)
    ->Arg(1)
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// The small model's chunked-layer entry products, batch 128 (sequences) of [128 x 16] x [16 x 8]
// (scores) or [128 x 8] x [8 x 16] (outputs), f32. state.range: 0 = which product (0 scores, 1
// outputs), 1 = 0 torch::matmul (one BLAS call per matrix), 1 batched_matmul (one kernel).
void BM_SmallBatchedMatmul(benchmark::State& state) {
  const bool scores = state.range(0) == 0, fused = state.range(1) == 1;
  const int64_t rows = 128, inner = scores ? 16 : 8, cols = scores ? 8 : 16;
  torch::manual_seed(0);
  auto a = torch::randn({128, rows, inner}), b = torch::randn({128, inner, cols});
  for (auto _ : state)
    benchmark::DoNotOptimize(
        (fused ? batched_matmul(a, b, false) : torch::matmul(a, b)).data_ptr());
  state.SetLabel(std::string(scores ? "scores " : "outputs ") +
                 (fused ? "batched_matmul" : "torch::matmul"));
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * 128 * rows * inner * cols,
                                                benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_SmallBatchedMatmul)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->Unit(benchmark::kMicrosecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

// One forward+backward of the training-size model: d_model 64, 2 chunked layers (S=4, W=8,
// n_win=1), batch 64 x 300 tokens. state.range: 0 = path (0 reference, 1 fast), 1 = bf16.
void BM_TrainStep(benchmark::State& state) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 8;
  a.n_win = 1;
  ModelConfig cfg;
  cfg.layers.assign(2, a);
  torch::manual_seed(0);
  Decoder m(cfg);
  m->init_weights(1);
  auto tokens = torch::randint(cfg.vocab_size, {64, 301}, torch::kInt64);
  auto input = tokens.narrow(1, 0, 300), target = tokens.narrow(1, 1, 300).flatten();
  AttentionPathGuard path(state.range(0) == 1 ? AttentionPath::kFast : AttentionPath::kReference);
  const auto precision = state.range(1) == 1 ? Precision::kBf16 : Precision::kF32;
  for (auto _ : state) {
    torch::Tensor loss;
    {
      PrecisionGuard g(precision);
      auto logits = m->forward(input).to(torch::kFloat32);
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab_size}), target);
    }
    m->zero_grad();
    loss.backward();
    benchmark::DoNotOptimize(loss.item<float>());
  }
  state.SetLabel(std::string(state.range(0) == 1 ? "fast" : "reference") + " " +
                 (resolve_precision(precision) == Precision::kBf16 ? "bf16" : "f32"));
  state.counters["tokens/s"] =
      benchmark::Counter(64.0 * 300, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_TrainStep)
    ->Args({0, 0})
    ->Args({1, 0})
    ->Args({0, 1})
    ->Args({1, 1})
    ->ArgNames({"fast", "bf16"})
    ->Unit(benchmark::kMillisecond)
    ->MeasureProcessCPUTime()
    ->UseRealTime();

}  // namespace
}  // namespace phasekv

int main(int argc, char** argv) {
  at::set_num_threads(2);  // the training machines' budget
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
