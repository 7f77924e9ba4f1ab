// Explanation commands (docs/EXPLANATION.md): knockout (which heads carry which phases), gates
// (gate concentration, over checkpoints), gate-cycle (do the gates move the weak spots), and
// `explain report` (the generated findings page from their output directories).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <iostream>

#include "backend/local_backend.h"
#include "cli/commands.h"
#include "cli/path_options.h"
#include "explain/explanation.h"
#include "explain/gate_cycle.h"
#include "explain/gates.h"
#include "explain/knockout.h"
#include "model/model_dir.h"
#include "task/task_file.h"
#include "util/cpu_info.h"
#include "util/error.h"

namespace phasekv::cli {
namespace {

// The command line as run (from /proc/self/cmdline), recorded so that a figure names the command
// that reproduces it; "" where /proc is missing.
std::string command_line() {
  std::ifstream in("/proc/self/cmdline", std::ios::binary);
  std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::string out;
  bool first = true;
  for (size_t start = 0; start < all.size();) {
    size_t end = all.find('\0', start);
    if (end == std::string::npos) end = all.size();
    std::string arg = all.substr(start, end - start);
    if (first) arg = "phasekv";  // the binary's path says nothing about the run
    first = false;
    const bool plain = !arg.empty() && arg.find_first_of(" \t'\"$*?") == std::string::npos;
    out += (out.empty() ? "" : " ") + (plain ? arg : "'" + arg + "'");
    start = end + 1;
  }
  return out;
}

nlohmann::json run_meta(const std::string& model_dir, Decoder& model) {
  const int stride = chunked_stride(model->cfg);
  return {{"model_dir", model_dir},
          {"config_hash", config_hash(model->cfg)},
          {"stride", stride > 0 ? nlohmann::json(stride) : nlohmann::json(nullptr)},
          {"command", command_line()},
          {"cpu", cpu_description()}};
}

// Options every sweep-shaped analysis shares.
struct SweepArgs {
  std::string model, padding = "prefix", out;
  int examples = 200, modulus = 0, stride = 0, threads = 0, batch = 32;
  int bootstrap = 2000, permutations = 1000;
  uint64_t seed = 0;
};

void add_sweep_options(CLI::App* cmd, SweepArgs& a) {
  cmd->add_option("--model", a.model, "model directory (config.json, weights, task.json)")
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--out", a.out, "output directory (an existing results.jsonl is resumed)")
      ->required()
      ->check(output_dir());
  cmd->add_option("--examples", a.examples, "logical examples, each at every phase");
  cmd->add_option(
      "--modulus", a.modulus,
      "M: phases r = key position mod M (0: twice --stride or the model's stride, else 24)");
  cmd->add_option("--padding", a.padding, "prefix|in_sequence");
  cmd->add_option("--seed", a.seed, "names the logical examples")->check(non_negative());
  cmd->add_option("--stride", a.stride,
                  "S for the interior/boundary split and the phase folding (0 = the model's)");
  cmd->add_option("--threads", a.threads, "libtorch threads (0 = all cores)")
      ->check(compute_threads());
  cmd->add_option("--batch", a.batch, "sequences per forward and per results flush");
  cmd->add_option("--bootstrap-reps,--bootstrap", a.bootstrap, "cluster bootstrap replicates");
  cmd->add_option("--permutations", a.permutations, "permutations of the tests");
}

SweepOptions sweep_options(const SweepArgs& a, LocalBackend& backend) {
  if (a.batch < 1) throw Error("--batch is " + std::to_string(a.batch) + " (allowed: >= 1)");
  if (a.bootstrap < 0 || a.permutations < 0)
    throw Error("--bootstrap-reps and --permutations must be >= 0");
  SweepOptions o;
  o.task = load_task_config(a.model);
  o.examples = a.examples;
  // Twice the stride (--stride, else the model's); an unknown stride gets the glossary's 24
  // (divisible by 2, 3, 4, 6, 8, 12), as everywhere.
  const int stride = a.stride > 0 ? a.stride : backend.model_stride();
  o.modulus = a.modulus > 0 ? a.modulus : (stride > 0 ? 2 * stride : 24);
  o.padding = padding_mode_from_string(a.padding, "--padding");
  o.seed = a.seed;
  o.stride = a.stride;
  o.out_dir = a.out;
  o.batch = a.batch;
  o.stats.bootstrap_reps = a.bootstrap;
  o.stats.permutations = a.permutations;
  o.model_meta = run_meta(a.model, backend.model());
  o.progress = &std::cerr;
  return o;
}

void register_knockout(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "knockout",
      "mean-ablate each (layer, KV head) or whole layer at the final position; per-phase effect "
      "and phase-specialisation index (resumable)");
  auto a = std::make_shared<SweepArgs>();
  auto calibration = std::make_shared<int>(64);
  auto unit = std::make_shared<std::string>("head");
  auto layers = std::make_shared<std::vector<int>>();
  add_sweep_options(cmd, *a);
  cmd->add_option("--calibration", *calibration,
                  "N_cal: calibration prompts (disjoint examples) for the mean replacement");
  cmd->add_option("--unit", *unit, "head|layer|both: knock out KV heads, whole layers, or both");
  cmd->add_option("--layers", *layers, "layers to knock out (default: all)")->delimiter(',');
  cmd->callback([=] {
    set_threads(a->threads);
    LocalBackend backend = LocalBackend::from_dir(a->model, a->threads, a->batch);
    KnockoutOptions o;
    o.unit = knockout_unit_from_string(*unit);
    o.sweep = sweep_options(*a, backend);
    o.sweep.progress_label = "knockout";
    o.calibration = *calibration;
    o.layers = *layers;
    const KnockoutResult r = run_knockout(backend, o);
    write_knockout_outputs(a->out, r);
    std::cout << knockout_table(r) << "wrote " << a->out
              << "/{results.jsonl, knockout.json, knockout.csv, knockout.svg}\n";
  });
}

void register_gates(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "gates", "static and per-entry concentration and mean profile of every compressor gate");
  auto model_dir = std::make_shared<std::string>();
  auto out = std::make_shared<std::string>();
  auto checkpoints = std::make_shared<std::string>();
  auto o = std::make_shared<GatesOptions>();
  auto padding = std::make_shared<std::string>("prefix");
  auto threads = std::make_shared<int>(0);
  cmd->add_option("--model", *model_dir, "model directory (config.json, weights, task.json)")
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--out", *out, "output directory")->required()->check(output_dir());
  cmd->add_option("--checkpoints", *checkpoints,
                  "directory of checkpoint subdirectories (each with model.safetensors, e.g. "
                  "copies of a training's checkpoint/): trajectories over training");
  cmd->add_option("--contexts", o->contexts, "task contexts whose windows are measured");
  cmd->add_option("--modulus", o->modulus, "the contexts' phases (example k at k mod M)");
  cmd->add_option("--padding", *padding, "prefix|in_sequence");
  cmd->add_option("--seed", o->seed, "names the contexts")->check(non_negative());
  cmd->add_option("--batch", o->batch, "contexts per forward");
  cmd->add_option("--threads", *threads, "libtorch threads (0 = all cores)")
      ->check(compute_threads());
  cmd->callback([=] {
    set_threads(*threads);
    Decoder model = load_model_dir(*model_dir);
    GatesOptions opts = *o;
    opts.task = load_task_config(*model_dir);
    opts.padding = padding_mode_from_string(*padding, "--padding");
    GatesResult r;
    try {
      r = run_gates(model, opts, *checkpoints);
    } catch (const Error& e) {
      throw Error("--model " + *model_dir + ": " + e.what());
    }
    r.meta["model"] = run_meta(*model_dir, model);
    if (!checkpoints->empty()) r.meta["checkpoints"] = *checkpoints;
    std::filesystem::create_directories(*out);
    write_gates_outputs(*out, r);
    std::cout << gates_table(r) << "wrote " << *out
              << "/{gates.json, gates.csv, gates_profile.svg, gates_plane.svg}\n";
  });
}

void register_gate_cycle(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "gate-cycle",
      "W = S models: cycle the gate parameters by D slots and test A_D(r) = A_0((r-D) mod S) "
      "(resumable)");
  auto a = std::make_shared<SweepArgs>();
  auto deltas = std::make_shared<std::vector<std::string>>();
  auto layers = std::make_shared<std::vector<int>>();
  auto heads = std::make_shared<std::vector<int>>();
  add_sweep_options(cmd, *a);
  cmd->add_option("--delta", *deltas,
                  "shifts D, comma-separated (write --delta=-1,1 for negatives), or 'all' = 1 ... "
                  "S-1 (with W = S, D and D - S are the same shift)")
      ->required()
      ->delimiter(',')
      ->allow_extra_args(false);
  cmd->add_option("--layers", *layers, "chunked layers to cycle (default: all)")->delimiter(',');
  cmd->add_option("--heads", *heads, "KV heads to cycle (default: all)")->delimiter(',');
  cmd->callback([=] {
    set_threads(a->threads);
    LocalBackend backend = LocalBackend::from_dir(a->model, a->threads, a->batch);
    GateCycleOptions o;
    const int stride = check_cyclable(backend.model()->cfg, *layers, *heads);
    for (const auto& d : *deltas) {
      if (d == "all") {
        for (int k = 1; k < stride; ++k) o.deltas.push_back(k);
        continue;
      }
      try {
        size_t used = 0;
        o.deltas.push_back(std::stoi(d, &used));
        if (used != d.size()) throw std::invalid_argument(d);
      } catch (const std::exception&) {
        throw Error("--delta: '" + d + "' is not an integer (allowed: integers, or all)");
      }
    }
    o.sweep = sweep_options(*a, backend);
    o.sweep.progress_label = "gate-cycle";
    o.layers = *layers;
    o.heads = *heads;
    const GateCycleResult r = run_gate_cycle(backend, o);
    write_gate_cycle_outputs(a->out, r);
    std::cout << gate_cycle_table(r) << "wrote " << a->out
              << "/{results.jsonl, gate_cycle.json, gate_cycle.csv, gate_cycle.svg}\n";
  });
}

void register_explain_report(CLI::App& app) {
  auto* cmd = app.add_subcommand("explain", "the explanation analyses' findings page");
  cmd->require_subcommand(1);
  auto* report = cmd->add_subcommand(
      "report", "write docs/EXPLANATION.md from knockout, gates and gate-cycle output directories");
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  auto figures = std::make_shared<std::string>();
  auto notes = std::make_shared<std::string>();
  report->add_option("dirs", *dirs, "output directories of knockout, gates and gate-cycle runs")
      ->required();
  report->add_option("--out", *out, "the Markdown file to write")->required()->check(output_file());
  report->add_option("--figures", *figures,
                     "where the SVG figures are copied (default: <out without .md>/ beside it)");
  report->add_option("--notes", *notes,
                     "a Markdown file of hand-written reading notes, included verbatim");
  report->callback([=] {
    ExplanationOptions o;
    o.dirs = *dirs;
    o.out = *out;
    o.figures = *figures;
    o.notes = *notes;
    o.command = command_line();
    write_explanation(o);
    std::cout << "wrote " << *out << "\n";
  });
}

}  // namespace

void register_explain(CLI::App& app) {
  register_knockout(app);
  register_gates(app);
  register_gate_cycle(app);
  register_explain_report(app);
}

}  // namespace phasekv::cli
