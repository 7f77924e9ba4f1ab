// Evaluation commands: sweep (every phase of the compression grid, with a resumable
// results.jsonl) and compare (several sweeps side by side).
#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <memory>

#include "backend/in_process.h"
#include "cli/commands.h"
#include "cli/path_options.h"
#include "eval/plan.h"
#include "eval/sweep.h"
#include "model/model_dir.h"
#include "io/tokenizer.h"
#include "report/modulus_check.h"
#include "report/report.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

PaddingMode parse_padding(const std::string& s) { return padding_mode_from_string(s, "--padding"); }

// The task comes from the model's task.json, so the sweep asks the model about the vocabulary and
// sizes it was trained on. --task passkey on a kv model keeps those settings with one needle.
TaskConfig select_task(const std::string& model_dir, const std::string& flag) {
  TaskConfig task = load_task_config(model_dir);
  if (flag == to_string(task.kind)) return task;
  if (flag != "kv" && flag != "passkey")
    throw Error("--task: '" + flag + "' is not this model's task (allowed: " +
                to_string(task.kind) + (task.kind == TaskKind::kKv ? ", passkey" : "") + ")");
  if (task.kind != TaskKind::kKv)
    throw Error("--task " + flag + ": the model in " + model_dir + " was trained on " +
                to_string(task.kind) + " (allowed for this model: --task " +
                to_string(task.kind) + ")");
  if (flag == "passkey") {
    task.kind = TaskKind::kPasskey;
    task.n_records = 1;
    task.n_queries = 1;
    validate(task, model_dir + "/task.json with --task passkey");
    return task;
  }
  throw Error("--task kv: the model in " + model_dir +
              " was trained on passkey (task.json), which has no key-value records to ask "
              "about (allowed for this model: --task passkey)");
}

struct SweepArgs {
  std::string model, task, padding, out;
  int examples = 0, modulus = 0, stride = 0, threads = 0, batch = 0;  // batch 0: auto_batch
  int bootstrap = 2000, permutations = 1000;
  uint64_t seed = 0;
  double target_depth = -2;  // -2: as in task.json
  int ensemble = 1;
  bool recent_copy = false;
  bool stride_given = false;  // --stride on the command line, even 0
  double min_gap_pp = 0;      // --min-gap
  bool plan = false;          // --plan: print the examples needed and stop
  SlaGate sla;
};

// The length of the sweep's contexts (every example and phase has it; task/tasks.h materialize).
int64_t sweep_context_tokens(const TaskConfig& task, const SweepArgs& a, PaddingMode padding) {
  return static_cast<int64_t>(
      materialize(make_logical_example(task, a.seed, 0), a.modulus, 0, padding, false)
          .tokens.size());
}

// --plan: the examples a --min-gap dip at the model's stride needs (eval/plan.h), priced in the
// prompt tokens of this sweep's longest item, and what --examples reaches.
void print_sweep_plan(const SweepArgs& a, const SweepOptions& o, int model_stride) {
  const int stride = a.stride_given ? a.stride : model_stride;
  const PlanRequest r = plan_request_for(a.modulus, stride, a.min_gap_pp > 0 ? a.min_gap_pp : 10.0,
                                         std::max(1, a.threads));
  const int64_t tokens = sweep_context_tokens(o.task, a, o.padding);
  const Plan p = plan_examples(r);
  std::cout << plan_text(p, tokens);
  if (p.examples_to_detect > 0)
    std::cout << fmt::format("--examples {} {} the {} needed to detect the dip\n", a.examples,
                             a.examples >= p.examples_to_detect ? "reaches" : "is below",
                             p.examples_to_detect);
  std::cout << "plan: nothing was scored and nothing was written\n";
}

void run_sweep_command(const SweepArgs& a) {
  const PaddingMode padding = parse_padding(a.padding);
  if (a.batch < 0)
    throw Error("--batch is " + std::to_string(a.batch) + " (allowed: >= 1, or 0 for auto)");
  if (a.bootstrap < 0 || a.permutations < 0)
    throw Error("--bootstrap-reps and --permutations must be >= 0");
  validate_sla(a.sla);
  if (!(a.min_gap_pp >= 0 && a.min_gap_pp <= 100))
    throw Error(fmt::format("--min-gap {} pp must lie in (0, 100] (0: off)", a.min_gap_pp));
  if (a.plan && a.modulus < 4)
    throw Error(fmt::format("--plan needs --modulus >= 4 (is {})", a.modulus));
  set_threads(a.threads);
  SweepOptions o;
  o.task = select_task(a.model, a.task);
  if (a.target_depth != -2) {
    o.task.target_depth = a.target_depth;
    validate(o.task, "--target-depth");
  }
  check_phase_grid(a.examples, a.modulus, "--examples", "--modulus");  // before materializing
  const int batch = a.batch > 0 ? a.batch : auto_batch(sweep_context_tokens(o.task, a, padding));
  const std::unique_ptr<Backend> backend = open_model_dir(a.model, a.threads, batch);
  const nlohmann::json described = backend->describe();
  o.examples = a.examples;
  o.modulus = a.modulus;
  o.padding = padding;
  o.seed = a.seed;
  o.stride = a.stride;
  o.stride_given = a.stride_given;
  o.out_dir = a.out;
  o.batch = batch;
  o.stats.bootstrap_reps = a.bootstrap;
  o.stats.permutations = a.permutations;
  o.ensemble = a.ensemble;
  o.recent_copy = a.recent_copy;
  o.min_gap_pp = a.min_gap_pp;
  if (a.plan) return print_sweep_plan(a, o, backend->model_stride());
  // "stride" is written for readers of summary.json; the sweep takes it from the backend.
  o.model_meta = {{"model_dir", a.model},
                  {"config_hash", described["config_hash"]},
                  {"stride", described["stride"]},
                  {"task_flag", a.task}};
  if (described.contains("family")) o.model_meta["family"] = described["family"];
  o.progress = &std::cerr;
  const SweepResult result = run_sweep(*backend, o);
  write_sweep_outputs(a.out, result.label, result.summary, result.meta);
  std::cout << terminal_table(result.summary, result.label)
            << phase_verdict(result.summary).text() << "\n"
            << sweep_records_line(result)
            << "wrote " << a.out
            << "/{results.jsonl, summary.json, phase.csv, phase.svg, report.html}\n";
  enforce_sla(a.sla, result.summary);
}

// A sweep directory, or a summary.json file itself.
PhaseSummary load_summary(const std::string& arg, nlohmann::json& file) {
  namespace fs = std::filesystem;
  const std::string path = fs::is_directory(arg) ? (fs::path(arg) / "summary.json").string() : arg;
  if (!fs::exists(path))
    throw Error(arg + " has no summary.json (give a directory written by `phasekv sweep --out`)");
  try {
    file = nlohmann::json::parse(read_file(path));
    return PhaseSummary::from_json(file);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": not valid JSON (" + e.what() + ")");
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
}

// Labels are the arguments as given (the user chose those names), made unique.
std::string unique_label(std::string label, const PhaseSeries& series) {
  while (label.size() > 1 && label.back() == '/') label.pop_back();
  const std::string base = label;
  for (int n = 2;; ++n) {
    bool taken = false;
    for (const auto& [l, s] : series) taken = taken || l == label;
    if (!taken) return label;
    label = fmt::format("{} ({})", base, n);
  }
}

void run_compare_command(const std::vector<std::string>& dirs, const std::string& out) {
  PhaseSeries series;
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& dir : dirs) {
    nlohmann::json file;
    PhaseSummary s = load_summary(dir, file);
    const std::string label = unique_label(dir, series);
    meta[label] = file.contains("label") && file["label"].is_string()
                      ? file["label"].get<std::string>()
                      : std::string("(no label)");
    series.emplace_back(label, std::move(s));
  }
  if (const std::string w = modulus_mismatch(series); !w.empty())
    std::cerr << "phasekv: warning: " << w << "\n";
  std::cout << compare_table(series);
  const std::filesystem::path base(out);
  write_file_atomic((base / "compare.svg").string(), phase_svg(series, "accuracy by phase"));
  write_file_atomic((base / "compare.html").string(), report_html(series, "phasekv compare", meta));
  std::cout << "wrote " << (base / "compare.svg").string() << " and "
            << (base / "compare.html").string() << "\n";
}

}  // namespace

void register_sweep(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "sweep", "evaluate retrieval with the target at every phase r in [0, M) (resumable)");
  auto a = std::make_shared<SweepArgs>();
  cmd->add_option("--model", a->model, "model directory (config.json, weights, task.json)")
      ->required()
      ->transform(bundled_path());
  cmd->add_option("--task", a->task,
                  "kv|lookup|passkey: the model's task (task.json); a kv model also takes "
                  "passkey")
      ->required();
  cmd->add_option("--examples", a->examples, "logical examples, each at every phase")->required();
  cmd->add_option("--modulus", a->modulus, "M: phases r = key position mod M (e.g. 8 for S = 4)")
      ->required();
  cmd->add_option("--padding", a->padding, "prefix|in_sequence (in-sequence is accepted too)")->required();
  cmd->add_option("--out", a->out, "output directory (an existing results.jsonl is resumed)")
      ->required()
      ->check(output_dir());
  cmd->add_option("--seed", a->seed, "names the logical examples")->check(non_negative());
  auto* stride = cmd->add_option(
      "--stride", a->stride,
      "stride S for the statistics and --ensemble's shifts (0 = the model's; given explicitly, "
      "a model stride that does not divide --modulus means no interior/boundary split instead of "
      "an error)");
  cmd->add_option("--threads", a->threads, "libtorch threads (0 = all cores)")
      ->check(compute_threads());
  cmd->add_option("--batch", a->batch,
                  "sequences per forward and per results flush (default: as many as fit a "
                  "16384-token forward, 1 to 64)");
  cmd->add_option("--bootstrap-reps,--bootstrap", a->bootstrap, "cluster bootstrap replicates");
  cmd->add_option("--permutations", a->permutations, "sign flips of the period test (at least; more while p is small)");
  cmd->add_option("--target-depth", a->target_depth,
                  "target record depth in [0, 1] (-1 random; -2: task.json's)");
  cmd->add_option("--ensemble", a->ensemble,
                  "phase ensembling: score K copies shifted by k S / K prefix fillers, answer the "
                  "top-1 of their averaged distributions (K x the compute; 1 = off; "
                  "docs/MITIGATIONS.md)");
  cmd->add_flag("--recent-copy", a->recent_copy,
                "lookup: put the target record again right before the target key, inside the raw "
                "window (the harness knows it: an upper bound; docs/MITIGATIONS.md)");
  add_min_gap_option(cmd, a->min_gap_pp);
  cmd->add_flag("--plan", a->plan,
                "print the examples per phase needed to detect a --min-gap dip (default 10 pp) at "
                "the model's stride and to certify a flat model (as `phasekv plan`), and stop");
  add_sla_options(cmd, a->sla);
  cmd->callback([a, stride] {
    a->stride_given = stride->count() > 0;
    run_sweep_command(*a);
  });
}

void add_sla_options(CLI::App* cmd, SlaGate& gate) {
  cmd->add_option_function<double>(
      "--max-gap", [&gate](const double& v) { gate.max_gap_pp = v; },
      "SLA gate: exit 4 unless the 95 % CI upper bound of the gap (best minus worst phase) is "
      "<= PP percentage points")
      ->type_name("PP");
  cmd->add_option_function<double>(
      "--min-worst", [&gate](const double& v) { gate.min_worst_acc = v; },
      "SLA gate: exit 4 unless the 95 % CI lower bound of the worst phase's accuracy is >= ACC "
      "(a fraction in [0, 1])")
      ->type_name("ACC");
  cmd->footer(
      "Exit status: 0 done (and the SLA gate passed), 2 an error, 4 the SLA gate failed (results "
      "and reports written first; one line says why). The gate uses the conservative bound: a "
      "model passes only when its interval lies inside the limit (README).");
}

void add_min_gap_option(CLI::App* cmd, double& min_gap_pp) {
  cmd->add_option("--min-gap", min_gap_pp,
                  "PP: the smallest gap worth detecting; a verdict that finds no period says "
                  "whether these examples could have found one (simulated power) or rules it out")
      ->type_name("PP");
}

void enforce_sla(const SlaGate& gate, const PhaseSummary& summary) {
  if (!gate.enabled()) return;
  const SlaVerdict v = evaluate_sla(gate, summary);
  std::cout << v.line << std::endl;
  if (!v.passed) throw SlaGateFailed{};
}

void register_compare(CLI::App& app) {
  auto* cmd = app.add_subcommand("compare", "compare the phase profiles of several sweeps");
  auto dirs = std::make_shared<std::vector<std::string>>();
  auto out = std::make_shared<std::string>();
  cmd->add_option("dirs", *dirs, "sweep directories (each with summary.json)")->required();
  // Required, like every command's --out: the default "." scattered compare.svg and
  // compare.html into whatever directory the user stood in.
  cmd->add_option("--out", *out, "output directory for compare.svg and compare.html")
      ->required()
      ->check(output_dir());
  cmd->callback([dirs, out] { run_compare_command(*dirs, *out); });
}

}  // namespace phasekv::cli
