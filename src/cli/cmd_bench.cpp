// phasekv bench: hardware peak, training step vs PyTorch, long-context streaming. The figures in
// docs/PERFORMANCE.md come from here (bench/run.sh runs it all).
#include <torch/torch.h>

#include <functional>
#include <iostream>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "eval/sweep.h"
#include "perf/bench_suite.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

// Options a user set explicitly override --quick, whatever their order on the command line.
struct BenchFlags {
  BenchOptions user;
  bool quick = false, no_torch = false, recalibrate = false;
  std::string json;
  std::vector<std::pair<CLI::Option*, std::function<void(BenchOptions&, const BenchOptions&)>>>
      overrides;

  BenchOptions resolve() const {
    BenchOptions o;
    if (quick) make_quick(o);
    for (const auto& [opt, apply] : overrides)
      if (opt->count() > 0) apply(o, user);
    return o;
  }
};

#define PHASEKV_BENCH_OPTION(cmd, flags, name, field, help)                                     \
  flags->overrides.emplace_back(cmd->add_option(name, flags->user.field, help)->delimiter(','), \
                                [](BenchOptions& o, const BenchOptions& u) { o.field = u.field; })

void add_common(CLI::App* cmd, const std::shared_ptr<BenchFlags>& f) {
  cmd->add_flag("--quick", f->quick, "small sizes: the whole suite in about a minute");
  cmd->add_option("--json", f->json, "also write the figures to this JSON file");
  PHASEKV_BENCH_OPTION(cmd, f, "--threads", threads, "libtorch threads");
  f->overrides.back().first->check(compute_threads());
  PHASEKV_BENCH_OPTION(cmd, f, "--seed", seed, "weights and data seed");
  f->overrides.back().first->check(non_negative());
  PHASEKV_BENCH_OPTION(cmd, f, "--gemm-sizes", gemm_sizes, "square GEMM sizes for the peak");
  f->overrides.emplace_back(
      cmd->add_flag("--recalibrate", f->recalibrate,
                    "measure the f32 GEMM path of each square size anew (other shape classes: "
                    "delete the cache file bench gemm names)"),
      [](BenchOptions& o, const BenchOptions&) { o.recalibrate_gemm = true; });
}

void add_train(CLI::App* cmd, const std::shared_ptr<BenchFlags>& f) {
  PHASEKV_BENCH_OPTION(cmd, f, "--small-config", small_config, "TOML of the bundled model");
  PHASEKV_BENCH_OPTION(cmd, f, "--small-seq", small_seq, "sequence length for the small model");
  PHASEKV_BENCH_OPTION(cmd, f, "--study-config", study_config,
                       "TOML of the study row (the suite's reference run)");
  PHASEKV_BENCH_OPTION(cmd, f, "--v4-config", v4_config,
                       "TOML of the DeepSeek-V4 row (timed at the study row's batch; \"\" = none)");
  PHASEKV_BENCH_OPTION(cmd, f, "--large-d-model", large_d_model, "larger size: d_model");
  PHASEKV_BENCH_OPTION(cmd, f, "--large-layers", large_layers, "larger size: layers");
  PHASEKV_BENCH_OPTION(cmd, f, "--large-batch", large_batch, "larger size: batch");
  PHASEKV_BENCH_OPTION(cmd, f, "--large-seq", large_seq, "larger size: sequence length");
  PHASEKV_BENCH_OPTION(cmd, f, "--reps", train_reps, "timed training steps (median)");
  PHASEKV_BENCH_OPTION(cmd, f, "--profile", profile_dir, "write one profiled step per row here");
  PHASEKV_BENCH_OPTION(cmd, f, "--python", reference.python, "python with torch");
  PHASEKV_BENCH_OPTION(cmd, f, "--reference", reference.script, "the PyTorch reference script");
  f->overrides.emplace_back(cmd->add_flag("--no-torch", f->no_torch, "skip the PyTorch side"),
                            [](BenchOptions& o, const BenchOptions&) { o.torch = false; });
}

void add_stream(CLI::App* cmd, const std::shared_ptr<BenchFlags>& f) {
  PHASEKV_BENCH_OPTION(cmd, f, "--contexts", contexts, "context lengths T");
  PHASEKV_BENCH_OPTION(cmd, f, "--chunk", chunk, "prefill chunk (tokens per feed)");
  f->overrides.back().first->check(at_least_one());  // 0 would never advance
  PHASEKV_BENCH_OPTION(cmd, f, "--decode-tokens", decode_tokens, "timed decode steps");
  PHASEKV_BENCH_OPTION(cmd, f, "--d-model", stream_d_model, "streaming model: d_model");
  PHASEKV_BENCH_OPTION(cmd, f, "--layers", stream_layers, "streaming model: layers");
  PHASEKV_BENCH_OPTION(cmd, f, "--config", stream_config,
                       "stream this model config (JSON) against itself with full attention in "
                       "every layer, instead of the built-in chunked stack (--d-model, --layers)");
}

void add_eval(CLI::App* cmd, const std::shared_ptr<BenchFlags>& f) {
  PHASEKV_BENCH_OPTION(cmd, f, "--eval-model", eval_model, "model directory of the sweep");
  PHASEKV_BENCH_OPTION(cmd, f, "--eval-examples", eval_examples, "logical examples");
  f->overrides.back().first->check(CLI::Range(1, kMaxExamples));
  PHASEKV_BENCH_OPTION(cmd, f, "--eval-modulus", eval_modulus, "phases per example");
  f->overrides.back().first->check(CLI::Range(1, kMaxModulus));
  PHASEKV_BENCH_OPTION(cmd, f, "--eval-batches", eval_batches, "sequences per forward (list)");
  f->overrides.back().first->check(CLI::Range(1, 4096));
}

void finish(const BenchFlags& f, const nlohmann::json& result) {
  if (!f.json.empty()) write_file_atomic(f.json, result.dump(2) + "\n");
}

}  // namespace

void register_bench(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "measure GEMM peak, training speed, streaming");
  bench->require_subcommand(1);

  auto gemm = std::make_shared<BenchFlags>();
  auto* g = bench->add_subcommand("gemm", "f32 and bf16 GEMM peak of this machine");
  add_common(g, gemm);
  g->callback([gemm] {
    auto o = gemm->resolve();
    set_threads(o.threads);
    GemmPeak peak;
    finish(*gemm, {{"gemm", bench_gemm(o, peak)}});
  });

  auto train = std::make_shared<BenchFlags>();
  auto* t = bench->add_subcommand("train", "training step: tokens/s, MFU, ratio to PyTorch");
  add_common(t, train);
  add_train(t, train);
  t->callback([train] {
    auto o = train->resolve();
    set_threads(o.threads);
    GemmPeak peak;
    nlohmann::json r = {{"gemm", bench_gemm(o, peak)}};
    r["train"] = bench_train(o, peak);
    finish(*train, r);
  });

  auto stream = std::make_shared<BenchFlags>();
  auto* s = bench->add_subcommand("stream", "decode and prefill at long context, full vs chunked");
  add_common(s, stream);
  add_stream(s, stream);
  s->callback([stream] {
    auto o = stream->resolve();
    set_threads(o.threads);
    finish(*stream, {{"stream", bench_stream(o)}});
  });

  auto eval = std::make_shared<BenchFlags>();
  auto* e = bench->add_subcommand("eval", "sweep throughput: (example, phase) pairs scored per second");
  add_common(e, eval);
  add_eval(e, eval);
  e->callback([eval] {
    auto o = eval->resolve();
    set_threads(o.threads);
    finish(*eval, {{"eval", bench_eval(o)}});
  });

  auto all = std::make_shared<BenchFlags>();
  auto* a = bench->add_subcommand("all", "gemm, train and stream in one run");
  add_common(a, all);
  add_train(a, all);
  add_stream(a, all);
  add_eval(a, all);
  a->callback([all] {
    auto o = all->resolve();
    set_threads(o.threads);
    GemmPeak peak;
    nlohmann::json r = {{"gemm", bench_gemm(o, peak)}};
    r["train"] = bench_train(o, peak);
    r["stream"] = bench_stream(o);
    r["eval"] = bench_eval(o);
    finish(*all, r);
  });

  auto dump = std::make_shared<BenchFlags>();
  auto size = std::make_shared<std::string>("small");
  auto out = std::make_shared<std::string>();
  auto* d = bench->add_subcommand(
      "dump", "write model, batch, loss and gradients of one f32 step for the PyTorch check");
  add_common(d, dump);
  add_train(d, dump);
  d->add_option("--size", *size, "small | large | study");
  d->add_option("--out", *out, "output directory")->required()->check(output_dir());
  d->callback([dump, size, out] {
    auto o = dump->resolve();
    set_threads(o.threads);
    finish(*dump, bench_dump(o, *size, *out));
  });
}

}  // namespace phasekv::cli
