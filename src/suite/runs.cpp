#include "suite/runs.h"

#include <fmt/format.h>

#include <filesystem>
#include <sstream>

#include "eval/results_file.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

void read_geometry(RunData& r) {
  for (const auto& l : r.config["model"].value("layers", json::array()))
    if (l.value("kind", "") == "chunked") {
      r.stride = l.value("stride", 0);
      r.width = l.value("width", 0);
      return;
    }
}

// train_log.jsonl: one JSON object per logged step; those with "eval_acc" are the periodic
// evaluations. A line cut short by a running or killed trainer is skipped, not an error.
void read_train_log(RunData& r, const std::string& path) {
  if (!fs::exists(path)) return;
  std::istringstream in(read_file(path));
  std::string line;
  json last;
  while (std::getline(in, line)) {
    json j = json::parse(line, nullptr, false);
    if (j.is_discarded() || !j.is_object()) continue;
    if (j.contains("eval_acc") && j.contains("step"))
      r.evals.push_back({j["step"].get<int>(), j["eval_acc"].get<double>()});
    last = std::move(j);
  }
  if (last.is_null()) return;
  if (last.contains("loss")) r.train_loss = last["loss"].get<double>();
  if (last.contains("eval_acc")) r.eval_acc = last["eval_acc"].get<double>();
  if (last.contains("eval_loss")) r.eval_loss = last["eval_loss"].get<double>();
}

// The sweep summarised again from its records with this build's statistics (summary.json keeps
// what the sweep's build computed), the records folded mod the run's stride S (the fold
// columns), and the interior test on the unfolded records: folding first would count an
// example's M/S near copies under prefix padding as independent outcomes.
void fold_sweep(SweepData& d, int S, const std::string& dir) {
  const int M = d.summary.modulus;
  std::map<ItemKey, PhaseOutcome> latest;  // success wins over error, as the runner keeps them
  for (const auto& rec : read_results(dir + "/results.jsonl").records)
    if (rec.ok() && rec.condition.empty() && rec.phase < M)
      latest[rec.key()] = {rec.example_id, rec.phase, rec.correct, rec.key_pos};
  std::vector<PhaseOutcome> outcomes;
  for (const auto& [key, o] : latest) outcomes.push_back(o);
  if (outcomes.empty()) return;
  SummaryOptions now;  // the sweep's own replicate counts and seed, this build's other defaults
  now.bootstrap_reps = d.summary.options.bootstrap_reps;
  now.permutations = d.summary.options.permutations;
  now.seed = d.summary.options.seed;
  PhaseSummary fresh = summarize(outcomes, M, S >= 2 && M % S == 0 ? S : 0, now);
  fresh.planned_outcomes = d.summary.planned_outcomes;
  fresh.shortcut = d.summary.shortcut;
  d.summary = std::move(fresh);
  if (S < 2 || M % S != 0) return;
  if (d.summary.split && d.summary.split->interior_test.flips > 0)
    d.interior = d.summary.split->interior_test;
  SummaryOptions opts;
  opts.bootstrap_reps = 500;
  opts.permutations = 500;
  opts.period_bootstrap = 0;
  std::vector<PhaseOutcome> folded;
  for (const PhaseOutcome& o : outcomes) folded.push_back({o.example_id, o.phase % S, o.correct});
  d.fold = summarize(folded, S, S, opts);
}

}  // namespace

std::optional<SweepData> read_sweep_dir(const std::string& dir) {
  const std::string path = dir + "/summary.json";
  if (!fs::exists(path)) return std::nullopt;
  const json file = read_json_file(path);
  SweepData d;
  try {
    d.summary = PhaseSummary::from_json(file);
  } catch (const Error& e) {
    throw Error(path + ": " + e.what());
  }
  d.meta = file.value("meta", json::object());
  if (d.meta.contains("shortcut_ceiling")) d.shortcut = d.meta["shortcut_ceiling"].get<double>();
  return d;
}

SuiteResults load_suite_results(const std::string& suite_dir, const LoadSuiteOptions& o) {
  const std::string suite_path = suite_dir + "/suite.json";
  if (!fs::exists(suite_path))
    throw Error(suite_dir + " has no suite.json (give the --out of `phasekv repro`)");
  SuiteResults out;
  out.suite = read_json_file(suite_path);
  for (const char* key : {"runs", "paddings", "depths", "modulus", "examples", "name"})
    if (!out.suite.contains(key)) throw Error(fmt::format("{}: no key \"{}\"", suite_path, key));
  for (const auto& jr : out.suite["runs"]) {
    RunData r;
    r.name = jr.at("name").get<std::string>();
    r.config = jr.at("config");
    r.study = jr.value("study", json::object());
    r.dir = suite_dir + "/" + r.name;
    read_geometry(r);
    r.trained = fs::exists(r.dir + "/train.done");
    if (const std::string tj = r.dir + "/model/train.json"; fs::exists(tj))
      r.cpu = read_json_file(tj).value("runtime", json::object()).value("cpu", "");
    read_train_log(r, r.dir + "/model/train_log.jsonl");
    for (const auto& p : out.suite["paddings"]) {
      const std::string padding = p.get<std::string>(), dir = r.dir + "/sweep-" + padding;
      auto d = read_sweep_dir(dir);
      if (!d) continue;
      if (o.fold) fold_sweep(*d, r.stride, dir);
      r.sweeps[padding] = std::move(*d);
    }
    for (const auto& depth : out.suite["depths"]) {
      const std::string ddir = r.dir + fmt::format("/depth-{:g}", depth.get<double>());
      if (auto d = read_sweep_dir(ddir)) r.depths[depth.get<double>()] = d->summary;
    }
    out.runs.push_back(std::move(r));
  }
  return out;
}

}  // namespace phasekv
