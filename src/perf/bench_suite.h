// `phasekv bench`: the sections behind its subcommands. Each section prints a table on stdout and
// returns the same figures as JSON. Every ratio in a table comes from measurements taken in the
// same run, one right after the other, so that a machine shared with other jobs biases both sides
// alike.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "perf/gemm_peak.h"
#include "perf/torch_reference.h"

namespace phasekv {

struct BenchOptions {
  int threads = 2;
  uint64_t seed = 0;
  // Hardware limit.
  std::vector<int> gemm_sizes{512, 1024, 2048};
  int gemm_reps = 5;
  bool recalibrate_gemm = false;  // measure the f32 GEMM path of the square sizes anew
  // Training step: the bundled model (its [model] and [train] batch), one larger size, and the
  // reproduction suite's reference run ("study").
  std::string small_config = "configs/train/kv-chunked.toml";
  int64_t small_seq = 32;
  int large_d_model = 512, large_layers = 4;
  int64_t large_batch = 4, large_seq = 512;
  std::string study_config = "configs/repro/study-base.toml";  // the "study" row's run
  // The DeepSeek-V4 row: this run's V4 model at the study row's batch width ("" = no row).
  std::string v4_config = "configs/train/v4-induction.toml";
  int train_warmup = 2, train_reps = 5;
  std::string profile_dir;  // non-empty: one profiled step per row, traces written there
  bool torch = true;        // also time the PyTorch reference (needs its python and script)
  TorchReference reference;
  // Streaming: contexts for decode and prefill, the prefill chunk, timed decode steps.
  std::vector<int64_t> contexts{4096, 16384, 65536};
  int64_t chunk = 256;
  int decode_tokens = 32;
  int stream_d_model = 256, stream_layers = 2;
  // Non-empty: stream this model config (e.g. configs/v4-tiny.json) instead of the built-in
  // chunked stack, against the same config with every layer full attention.
  std::string stream_config;
  // Sweep throughput: a model directory, examples x phases, sequences per forward.
  std::string eval_model = "models/lookup-chunked";
  int eval_examples = 300, eval_modulus = 24;
  std::vector<int> eval_batches{16, 64, 256};
};

// Smaller sizes for a run under a minute.
void make_quick(BenchOptions& o);

nlohmann::json bench_gemm(const BenchOptions& o, GemmPeak& peak);
nlohmann::json bench_train(const BenchOptions& o, const GemmPeak& peak);
nlohmann::json bench_stream(const BenchOptions& o);
nlohmann::json bench_eval(const BenchOptions& o);

// Writes the reference-check files (perf/train_step.h dump_train_step) for a size ("small",
// "large" or "study") into dir.
nlohmann::json bench_dump(const BenchOptions& o, const std::string& size, const std::string& dir);

}  // namespace phasekv
