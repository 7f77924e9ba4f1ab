// phasekv theory: the study's idealised model of chunked compression, integrated by gradient
// flow (theory/flow.h); `phasekv theory sweep` runs it over a grid and measures how often the
// heads cover every non-final position (docs/THEORY.md).
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "theory/output.h"
#include "theory/sweep.h"
#include "util/error.h"

namespace phasekv::cli {
namespace {

using theory::FlowConfig;
using theory::ModelConfig;

// Flags shared by both commands. In the sweep, heads, stride, vocab and rho are lists instead.
void add_shared_flags(CLI::App* cmd, ModelConfig& m, FlowConfig& f, bool sweep) {
  if (!sweep) {
    cmd->add_option("--heads", m.heads, "heads m (1..64; the study's theorems take m < S)");
    cmd->add_option("--stride", m.stride, "tokens per chunk S (2..64)");
    cmd->add_option("--vocab", m.vocab, "tokens N (>= chunks x stride, <= 4096)");
    cmd->add_option("--rho", m.rho, "radius of every gate vector at the start (0..100)");
  }
  cmd->add_option("--chunks", m.chunks, "chunks L per context (1..256)");
  cmd->add_option("--kappa", m.kappa, "inner product of distinct embeddings (0..10)");
  cmd->add_option("--epsilon", m.epsilon,
                  "largest deviation of the Gram matrix from kappa J + I (0..0.5; 0: exact)");
  cmd->add_option("--gamma", m.gamma, "attention scale over chunks (0..1000)");
  cmd->add_option("--beta", m.beta, "unembedding scale (0..1000)");
  cmd->add_option("--contexts", m.contexts,
                  "contexts in the fixed Monte Carlo sample the loss averages over");
  cmd->add_option("--seed", m.seed, "seed of the embeddings, samples and start")
      ->check(non_negative());
  cmd->add_option("--integrator", f.integrator, "euler or rk4");
  cmd->add_option("--dt", f.dt, "step of flow time (0..100]");
  cmd->add_option("--time", f.time, "flow time to integrate (a sweep run may stop earlier)");
  cmd->add_option("--record-every", f.record_every, "steps between trajectory records");
  cmd->add_option("--eval-contexts", f.eval_contexts,
                  "fresh contexts for accuracy and gate statistics");
  cmd->add_option("--threshold", f.threshold,
                  "a head is concentrated when its mean p^K(r_h) and p^V(r_h + 1) reach this");
}

struct RunArgs {
  ModelConfig model;
  FlowConfig flow;
  std::string out = "runs/theory";
  bool quiet = false;
};

struct SweepArgs {
  theory::SweepConfig sweep;
  std::string out = "runs/theory-sweep";
  bool quiet = false;
  SweepArgs() {
    sweep.heads = {1, 2, 3, 4, 5, 6};
    sweep.strides = {4};
    sweep.vocabs = {32, 256, 2048};
    sweep.rhos = {0.05, 4.0};
    sweep.flow.time = 3000.0;
    sweep.flow.record_every = 5;
    sweep.flow.eval_contexts = 128;
    sweep.flow.stop_when_concentrated = true;
  }
};

void run_theory(const RunArgs& a) {
  theory::validate(a.model);
  theory::validate(a.flow);
  const theory::FlowResult r =
      theory::run_flow(a.model, a.flow, a.quiet ? nullptr : &std::cerr);
  const auto paths = theory::write_flow_outputs(a.out, r);
  for (size_t h = 0; h < r.heads.size(); ++h) {
    const auto& o = r.heads[h];
    std::cout << fmt::format("head {}: key on r = {} ({:.3f}), value on r + 1 ({:.3f}){}\n", h,
                             o.r, o.key, o.value, o.concentrated ? "" : "  [not concentrated]");
  }
  std::string weak;
  for (size_t i = 0; i < r.covered.size(); ++i)
    if (!r.covered[i]) weak += (weak.empty() ? "" : ", ") + std::to_string(i);
  std::cout << (weak.empty() ? std::string("every non-final position covered")
                             : "weak spots (no head covers them): r* = " + weak)
            << fmt::format("; {:.1f} s\n", r.seconds);
  for (const auto& p : paths) std::cout << "wrote " << p << "\n";
}

void run_theory_sweep(const SweepArgs& a) {
  const theory::SweepResult s =
      theory::run_sweep(a.sweep, a.quiet ? nullptr : &std::cerr);
  const auto paths = theory::write_sweep_outputs(a.out, s);
  std::cout << theory::coverage_csv(s.rows) << fmt::format("{} runs in {:.1f} s\n", s.runs.size(),
                                                           s.seconds);
  for (const auto& p : paths) std::cout << "wrote " << p << "\n";
}

}  // namespace

void register_theory(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "theory",
      "the study's idealised model: gradient flow of log-linear compression gates; which "
      "positions the heads pick and which stay weak (docs/THEORY.md)");
  auto a = std::make_shared<RunArgs>();
  add_shared_flags(cmd, a->model, a->flow, false);
  cmd->add_option("--out", a->out, "output directory (JSON, CSV, SVG)")->check(output_dir());
  cmd->add_flag("--quiet", a->quiet, "no progress lines");
  cmd->callback([a, cmd] {
    if (!cmd->got_subcommand("sweep")) run_theory(*a);
  });

  auto* sweep = cmd->add_subcommand(
      "sweep", "many flows over heads x stride x vocab x rho x seeds: P(every position covered)");
  auto s = std::make_shared<SweepArgs>();
  add_shared_flags(sweep, s->sweep.base, s->sweep.flow, true);
  sweep->add_option("--heads", s->sweep.heads, "heads m, comma-separated")->delimiter(',');
  sweep->add_option("--stride", s->sweep.strides, "strides S, comma-separated")->delimiter(',');
  sweep->add_option("--vocab", s->sweep.vocabs, "vocabulary sizes N, comma-separated")
      ->delimiter(',');
  sweep->add_option("--rho", s->sweep.rhos, "start radii rho, comma-separated")->delimiter(',');
  sweep->add_option("--seeds", s->sweep.seeds, "runs per grid point (1..100000)");
  sweep->add_option("--jobs", s->sweep.jobs, "runs side by side, one thread each");
  sweep->add_flag("!--no-stop", s->sweep.flow.stop_when_concentrated,
                  "integrate the full --time even after every head has concentrated");
  sweep->add_option("--out", s->out, "output directory (JSON, CSV, SVG)")->check(output_dir());
  sweep->add_flag("--quiet", s->quiet, "no progress lines");
  sweep->callback([s] { run_theory_sweep(*s); });
}

}  // namespace phasekv::cli
