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

namespace phasekv {

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
          {"rows", rows}};
}

}  // namespace phasekv
