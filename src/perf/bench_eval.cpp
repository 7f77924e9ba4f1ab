// `phasekv bench eval`: evaluation throughput of the sweep engine (eval/sweep.h) on a model
// directory, by default the bundled study-geometry model: examples x phases scored per second,
// at each batch size asked for (sequences per forward).
#include <fmt/format.h>

#include <chrono>
#include <filesystem>

#include <unistd.h>

#include "backend/local_backend.h"
#include "eval/sweep.h"
#include "perf/bench_suite.h"
#include "perf/timing.h"
#include "task/task_file.h"
#include "task/tasks.h"

namespace phasekv {

namespace {

// What scoring only the last position saves: the sweep's forward (DecoderImpl::hidden_last, the
// last layer for the last query alone) against the whole-sequence forward it replaced, on the
// same batches of the sweep's contexts (phase 0, prefix padding), alternated.
nlohmann::json bench_last_position(const BenchOptions& o) {
  const int batch = o.eval_batches.empty() ? 16 : o.eval_batches.front();
  LocalBackend backend = LocalBackend::from_dir(o.eval_model, o.threads, batch);
  Decoder model = backend.model();
  const TaskConfig task = load_task_config(o.eval_model);
  std::vector<TaskExample> examples;
  for (int b = 0; b < batch; ++b)
    examples.push_back(materialize(make_logical_example(task, o.seed, static_cast<uint64_t>(b)),
                                   o.eval_modulus, 0, PaddingMode::kPrefix, false));
  const auto T = static_cast<int64_t>(examples.front().tokens.size());
  auto tokens = torch::empty({batch, T}, torch::kInt64);
  auto acc = tokens.accessor<int64_t, 2>();
  for (int b = 0; b < batch; ++b) {
    const auto& ids = examples[static_cast<size_t>(b)].tokens;  // the task's length at M: one T
    for (int64_t t = 0; t < T; ++t) acc[b][t] = ids.at(static_cast<size_t>(t));
  }
  torch::NoGradGuard no_grad;
  double whole = 0, last = 0, diff = 0;
  const int reps = 20;
  for (int i = 0; i < reps; ++i) {
    auto t0 = std::chrono::steady_clock::now();
    auto a = model->hidden(tokens).select(1, T - 1);
    auto t1 = std::chrono::steady_clock::now();
    auto c = model->hidden_last(tokens);
    auto t2 = std::chrono::steady_clock::now();
    whole += std::chrono::duration<double>(t1 - t0).count();
    last += std::chrono::duration<double>(t2 - t1).count();
    diff = std::max(diff, (a - c).abs().max().item<double>());
  }
  fmt::print("forward of {} contexts of {} tokens ({} reps, alternated): whole sequence {:.2f} ms, "
             "last position {:.2f} ms ({:.2f}x), max |difference| {:.1e}\n\n",
             batch, T, reps, 1e3 * whole / reps, 1e3 * last / reps, whole / last, diff);
  return {{"batch", batch},          {"tokens", T},
          {"whole_ms", 1e3 * whole / reps}, {"last_ms", 1e3 * last / reps},
          {"speedup", whole / last}, {"max_abs_diff", diff}};
}

}  // namespace

nlohmann::json bench_eval(const BenchOptions& o) {
  namespace fs = std::filesystem;
  fmt::print("== Sweep throughput: {} ({} examples x {} phases), {} threads, load {:.1f}\n",
             o.eval_model, o.eval_examples, o.eval_modulus, o.threads, load_average());
  fmt::print("{:>6} {:>10} {:>12}\n", "batch", "seconds", "examples/s");
  nlohmann::json rows = nlohmann::json::array();
  for (int batch : o.eval_batches) {
    LocalBackend backend = LocalBackend::from_dir(o.eval_model, o.threads, batch);
    SweepOptions s;
    s.task = load_task_config(o.eval_model);
    s.examples = o.eval_examples;
    s.modulus = o.eval_modulus;
    s.batch = batch;
    s.seed = o.seed;
    s.stats.bootstrap_reps = 0;  // scoring only: the statistics are not what is timed
    s.stats.permutations = 0;
    const auto dir = fs::temp_directory_path() / fmt::format("phasekv-bench-eval-{}", ::getpid());
    fs::remove_all(dir);
    s.out_dir = dir.string();
    const auto t0 = std::chrono::steady_clock::now();
    const auto r = run_sweep(backend, s);
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    fs::remove_all(dir);
    const double eps = double(r.scored) / sec;
    fmt::print("{:>6} {:>10.2f} {:>12.0f}\n", batch, sec, eps);
    rows.push_back({{"batch", batch}, {"seconds", sec}, {"scored", r.scored}, {"examples_per_s", eps}});
  }
  fmt::print("each (example, phase) pair is one scored context; seconds include writing "
             "results.jsonl\n\n");
  return {{"model", o.eval_model},
          {"examples", o.eval_examples},
          {"modulus", o.eval_modulus},
          {"threads", o.threads},
          {"rows", rows},
          {"last_position", bench_last_position(o)}};
}

}  // namespace phasekv
