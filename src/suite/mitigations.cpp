#include "suite/mitigations.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "suite/commands.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// The [train] keys a candidate suite may change against the baseline: training-time mitigations.
constexpr const char* kTrainingMitigations[] = {"phase_curriculum", "offset_randomization",
                                                "in_sequence_padding"};
using json = nlohmann::json;

// Issue 19's architecture candidates that the study suite trains, in the order the page lists
// them. A run missing from the suite file or not finished yet stays in the table as missing.
struct ArchitectureCandidate {
  const char* run;
  const char* what;
};
constexpr ArchitectureCandidate kArchitecture[] = {
    {"W8S4", "overlap W = 2S (stride 4, width 8)"},
    {"W8S8-uniform", "mean pooling (no learned gates)"},
    {"W8S8-no-gate-bias", "no slot bias in the gates"},
    {"W8S8-uncompressed-tail", "uncompressed tail instead of the 16-token window"},
    {"W8S8-4kv", "4 KV heads"},
    {"W8S8-8kv", "8 KV heads"},
    // Not named by the issue, but trained by the suite and near the baseline's cache bytes.
    {"W8S8-vector", "vector gates"},
    {"W8S8-post-norm", "post-norm: RMSNorm of every slot payload"},
    {"deepseek-style", "W8/S4, vector gates, tied K/V, partial RoPE, shared payload"},
    {"deepseek-scalar-twin", "the same with scalar gates"},
    {"full-1kv", "full attention, 1 KV head (control)"},
    {"full-8kv", "full attention, 8 KV heads (control)"},
};

Candidate named(std::string name, std::string what, CandidateKind kind) {
  Candidate x;
  x.name = std::move(name);
  x.what = std::move(what);
  x.kind = kind;
  return x;
}

std::string inference_what(const std::string& setting) {
  if (setting.rfind("ensemble", 0) == 0)
    return fmt::format("phase ensembling, K = {} shifted copies", setting.substr(8));
  return "recent copy of the target record (an upper bound)";
}

int train_seed(const RunData& r) {
  return r.config.contains("train") ? r.config["train"].value("seed", 0) : 0;
}

json without_seed(json c) {
  if (c.contains("train")) c["train"].erase("seed");
  return c;
}

// "key = value" for every leaf of `model` that differs from `base` (dotted paths).
void model_diff(const json& model, const json& base, const std::string& path,
                std::vector<std::string>& out) {
  if (model.is_object()) {
    for (auto it = model.begin(); it != model.end(); ++it)
      model_diff(it.value(), base.is_object() && base.contains(it.key()) ? base[it.key()] : json(),
                 path.empty() ? it.key() : path + "." + it.key(), out);
  } else if (model.is_array() &&
             std::any_of(model.begin(), model.end(), [](const json& e) { return e.is_structured(); })) {
    // Arrays of objects (layers) element by element; lists of numbers (kv_head_offsets) whole.
    for (size_t i = 0; i < model.size(); ++i)
      model_diff(model[i], base.is_array() && i < base.size() ? base[i] : json(),
                 path + "." + std::to_string(i), out);
  } else if (model != base) {
    out.push_back(path + " = " + model.dump());
  }
}

// Runs whose config equals the baseline's except train.seed: the baseline's other seeds.
std::vector<std::string> seed_runs(const SuiteResults& s, const RunData& base) {
  std::vector<std::string> out;
  for (const auto& r : s.runs)
    if (r.name != base.name && without_seed(r.config) == without_seed(base.config))
      out.push_back(r.name);
  return out;
}

// The first step at which the periodic evaluation reached `threshold`.
std::optional<int> first_reaching(const std::vector<EvalPoint>& evals, double threshold) {
  for (const auto& e : evals)
    if (e.acc >= threshold) return e.step;
  return std::nullopt;
}

// An inference sweep must be the suite's sweep of the same model with the setting its directory
// names: otherwise the rows would compare different examples or models.
void check_inference_sweep(const SweepData& d, const std::string& path, const json& suite,
                           const RunData& run, const std::string& padding,
                           const std::string& setting, bool timing) {
  const json& sw = d.meta.value("sweep", json::object());
  auto expect = [&](const char* key, const json& want) {
    if (!sw.contains(key) || sw[key] != want)
      throw Error(fmt::format("{}: meta.sweep.{} is {}, expected {}", path, key,
                              sw.contains(key) ? sw[key].dump() : "missing", want.dump()));
  };
  if (!timing) {
    expect("modulus", suite["modulus"]);
    expect("examples", suite["examples"]);
  }
  expect("seed", suite.value("seed", 0));
  expect("padding", padding);
  const bool recent = setting == "recent-copy";
  const int ensemble = setting.rfind("ensemble", 0) == 0 ? std::stoi(setting.substr(8)) : 1;
  expect("ensemble", ensemble);
  expect("recent_copy", recent);
  // The model: its config hash must be the one the suite's own sweep of the run recorded.
  for (const auto& [p, own] : run.sweeps) {
    const json want = own.meta.value("config_hash", json());
    if (!want.is_null() && d.meta.value("config_hash", json()) != want)
      throw Error(fmt::format("{}: meta.config_hash is {}, but the suite's run {} has {}", path,
                              d.meta.value("config_hash", json()).dump(), run.name, want.dump()));
    break;
  }
}

// What the timing rounds time: the plain model ("baseline") and every inference setting.
std::vector<std::string> timed_settings() {
  std::vector<std::string> out = kInferenceSettings;
  out.insert(out.begin(), "baseline");
  return out;
}

// Milliseconds per scored item of a sweep (its own measurement).
std::optional<double> ms_per_item(const SweepData& d, const std::string& path) {
  const json& rec = d.meta.value("records", json::object());
  if (!rec.contains("scoring_seconds") || !rec.contains("scored_this_run"))
    throw Error(path + ": meta.records has no scoring_seconds / scored_this_run");
  const double n = rec["scored_this_run"].get<double>();
  if (n <= 0) return std::nullopt;  // resumed entirely: no time measured
  return 1e3 * rec["scoring_seconds"].get<double>() / n;
}

// The fastest round per setting of <inference>/timing/<round>/<setting>: a shared machine only
// ever adds time, so the minimum is the least disturbed measurement.
std::map<std::string, double> fastest_timings(const std::string& dir, const json& suite,
                                              const RunData& base, int& rounds) {
  std::map<std::string, double> best;
  rounds = 0;
  if (!fs::is_directory(dir)) return best;
  for (const auto& entry : fs::directory_iterator(dir)) {
    if (!entry.is_directory()) continue;
    bool any = false;
    for (const auto& s : timed_settings()) {
      const std::string sd = entry.path().string() + "/" + s;
      auto d = read_sweep_dir(sd);
      if (!d) continue;
      check_inference_sweep(*d, sd + "/summary.json", suite, base, "prefix",
                            s == "baseline" ? "plain" : s, /*timing=*/true);
      if (auto ms = ms_per_item(*d, sd + "/summary.json")) {
        best[s] = best.count(s) ? std::min(best[s], *ms) : *ms;
        any = true;
      }
    }
    rounds += any;
  }
  return best;
}

}  // namespace

std::string TargetCheck::why() const {
  std::vector<std::string> parts;
  if (!gap_ok)
    parts.push_back(fmt::format("gap CI upper bound {:.1f} pp, not below {:g} pp", gap_hi_pp,
                                kTargetGapPp));
  if (!bytes_ok)
    parts.push_back(fmt::format("{:.2f}x the baseline's cache bytes, more than {:g}x", bytes_x,
                                kTargetBytesX));
  if (!mean_ok)
    parts.push_back(fmt::format("mean {:.3f} below the baseline's {:.3f}", mean, base_mean));
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? "; " : "") + parts[i];
  return out;
}

TargetCheck check_target(const PhaseSummary& s, const ModelCost& cost, const PhaseSummary& base,
                         const ModelCost& base_cost) {
  TargetCheck t;
  t.gap_hi_pp = s.gap_ci_pp.hi;
  t.bytes_x = std::max(cost.bytes_4k / base_cost.bytes_4k, cost.bytes_128k / base_cost.bytes_128k);
  t.mean = s.mean_acc;
  t.worst = s.worst_acc;
  t.base_mean = base.mean_acc;
  t.gap_ok = t.gap_hi_pp < kTargetGapPp;
  t.bytes_ok = t.bytes_x <= kTargetBytesX + 1e-12;
  t.mean_ok = t.mean >= t.base_mean - 1e-12;  // the same phases' means: equal counts tie exactly
  return t;
}

std::optional<TargetCheck> judge(const Comparison& c, const Candidate& x,
                                 const std::string& padding) {
  const Candidate& b = c.baseline();
  if (!x.cost || !b.cost || !x.sweeps.count(padding) || !b.sweeps.count(padding))
    return std::nullopt;
  return check_target(x.sweeps.at(padding), *x.cost, b.sweeps.at(padding), *b.cost);
}

Comparison build_comparison(const SuiteResults& suite, const std::string& suite_dir,
                            const std::string& inference_dir, const CostFn& cost) {
  Comparison c;
  c.suite_dir = suite_dir;
  c.inference_dir = inference_dir;
  c.suite_name = suite.suite["name"].get<std::string>();
  c.modulus = suite.suite["modulus"].get<int>();
  c.examples = suite.suite["examples"].get<int>();
  for (const auto& p : suite.suite["paddings"]) c.paddings.push_back(p.get<std::string>());
  if (c.paddings.empty()) throw Error(suite_dir + "/suite.json: \"paddings\" is empty");
  auto find_run = [&](const std::string& name) -> const RunData* {
    for (const auto& r : suite.runs)
      if (r.name == name) return &r;
    return nullptr;
  };
  const RunData* base = find_run(kBaselineRun);
  if (!base)
    throw Error(fmt::format("{}/suite.json: no run \"{}\", the baseline of the comparison",
                            suite_dir, kBaselineRun));
  if (!base->evals.empty()) c.baseline_eval_acc = base->evals.back().acc;

  // A candidate scored on a suite run's model: its sweeps, cost and training steps.
  auto from_run = [&](const RunData& r, Candidate x) {
    x.run = r.name;
    const std::string where = suite_dir + "/suite.json: run \"" + r.name + "\" model";
    x.cost = cost(r.config.at("model"), where);
    x.has_log = !r.evals.empty();
    if (c.baseline_eval_acc) x.steps_to_baseline = first_reaching(r.evals, *c.baseline_eval_acc);
    return x;
  };
  Candidate b = from_run(*base, named(kBaselineRun, "W8/S8, 1 KV head: the study's reference",
                                           CandidateKind::kBaseline));
  for (const auto& [p, d] : base->sweeps) b.sweeps[p] = d.summary;
  if (b.sweeps.empty()) b.missing = base->trained ? "no sweep yet" : "not trained yet";
  c.candidates.push_back(b);

  for (const auto& a : kArchitecture) {
    const RunData* r = find_run(a.run);
    if (!r) {
      c.candidates.push_back(named(a.run, a.what, CandidateKind::kTrained));
      c.candidates.back().missing = "not in the suite file";
      continue;
    }
    Candidate x = from_run(*r, named(a.run, a.what, CandidateKind::kTrained));
    for (const auto& [p, d] : r->sweeps) x.sweeps[p] = d.summary;
    if (x.sweeps.empty()) x.missing = r->trained ? "no sweep yet" : "not trained yet (suite running)";
    x.compute_basis = "FLOPs";
    x.compute_x = x.cost->flops / b.cost->flops;
    c.candidates.push_back(x);
  }
  c.candidates.front().compute_x = 1.0;
  c.candidates.front().compute_basis = "FLOPs";

  const auto timing = fastest_timings(inference_dir + "/timing", suite.suite, *base,
                                      c.timing_repeats);
  for (const auto& setting : kInferenceSettings) {
    Candidate x = from_run(*base, named(std::string(kBaselineRun) + " + " + setting,
                                             inference_what(setting), CandidateKind::kInference));
    for (const auto& p : c.paddings) {
      const std::string dir = inference_dir + "/" + kBaselineRun + "/" + p + "/" + setting;
      if (auto d = read_sweep_dir(dir)) {
        check_inference_sweep(*d, dir + "/summary.json", suite.suite, *base, p, setting, false);
        x.sweeps[p] = d->summary;
      }
    }
    if (x.sweeps.empty()) x.missing = "not swept yet (scripts/mitigations.sh study)";
    x.compute_basis = "time";
    if (timing.count(setting) && timing.count("baseline"))
      x.compute_x = timing.at(setting) / timing.at("baseline");
    c.candidates.push_back(x);
  }

  // The seeds: the plain model from the suite's sweep, each setting from the inference directory.
  c.seed_runs = seed_runs(suite, *base);
  std::vector<std::string> runs = c.seed_runs;
  runs.insert(runs.begin(), kBaselineRun);
  const std::string& judged = c.paddings.front();
  for (const auto& name : runs) {
    const RunData& r = *find_run(name);
    SeedSweep plain{name, "plain", std::nullopt, std::nullopt};
    if (r.sweeps.count(judged)) plain.prefix = r.sweeps.at(judged).summary;
    c.seed_sweeps.push_back(plain);
    for (const auto& setting : kInferenceSettings) {
      const std::string dir = inference_dir + "/" + name + "/" + judged + "/" + setting;
      SeedSweep s{name, setting, std::nullopt, std::nullopt};
      if (auto d = read_sweep_dir(dir)) {
        check_inference_sweep(*d, dir + "/summary.json", suite.suite, r, judged, setting, false);
        s.prefix = d->summary;
      }
      c.seed_sweeps.push_back(s);
    }
  }
  return c;
}

void add_candidate_suite(Comparison& c, const SuiteResults& base_suite, const SuiteResults& extra,
                         const std::string& extra_dir, const CostFn& cost) {
  const std::string where = extra_dir + "/suite.json";
  const RunData* base = nullptr;
  std::map<int, const RunData*> base_by_seed;  // the baseline's run of every seed
  for (const auto& r : base_suite.runs)
    if (r.name == kBaselineRun) base = &r;
  if (!base) throw Error(fmt::format("the baseline suite has no run \"{}\"", kBaselineRun));
  for (const auto& r : base_suite.runs)
    if (without_seed(r.config) == without_seed(base->config)) base_by_seed[train_seed(r)] = &r;
  const std::string judged = c.paddings.front();

  CandidateSuite cs;
  cs.dir = extra_dir;
  cs.name = extra.suite["name"].get<std::string>();
  cs.modulus = extra.suite["modulus"].get<int>();
  cs.examples = extra.suite["examples"].get<int>();
  std::vector<bool> done(extra.runs.size(), false);
  for (size_t i = 0; i < extra.runs.size(); ++i) {
    if (done[i]) continue;
    const RunData& first = extra.runs[i];
    if (first.config.value("task", json()) != base->config.value("task", json()))
      throw Error(fmt::format("{}: run \"{}\" has another [task] than the baseline {} (a "
                              "candidate suite may change the model, the seed and the training "
                              "mitigations {} only)",
                              where, first.name, kBaselineRun, fmt::join(kTrainingMitigations, ", ")));
    // [train] may differ in the training-time mitigations only: the data order, steps and
    // optimiser stay the baseline's, so "steps to the baseline's accuracy" compares like with like.
    json train_a = without_seed(first.config).value("train", json()),
         train_b = without_seed(base->config).value("train", json());
    for (const char* key : kTrainingMitigations) {
      train_a.erase(key);
      train_b.erase(key);
    }
    if (train_a != train_b)
      throw Error(fmt::format("{}: run \"{}\" has another [train] than the baseline {} (a "
                              "candidate suite may change the model, the seed and the training "
                              "mitigations {} only)",
                              where, first.name, kBaselineRun, fmt::join(kTrainingMitigations, ", ")));
    // The group: every run with this config but the seed; the candidate is its baseline-seed run.
    std::vector<const RunData*> group;
    for (size_t k = i; k < extra.runs.size(); ++k)
      if (without_seed(extra.runs[k].config) == without_seed(first.config)) {
        group.push_back(&extra.runs[k]);
        done[k] = true;
      }
    const RunData* lead = group.front();
    for (const RunData* r : group)
      if (train_seed(*r) == train_seed(*base)) lead = r;
    std::vector<std::string> diff;
    model_diff(lead->config.at("model"), base->config.at("model"), "", diff);
    for (const char* key : kTrainingMitigations) {
      const json a = lead->config.at("train").value(key, json()),
                 b = base->config.at("train").value(key, json());
      if (a != b) diff.push_back(std::string("train.") + key + " = " + a.dump());
    }
    std::string what;
    for (const auto& d : diff) what += (what.empty() ? "" : ", ") + d;
    Candidate x;
    x.name = lead->name;
    x.what = what.empty() ? "the baseline's model" : what;
    x.kind = CandidateKind::kTrained;
    x.run = extra_dir + "/" + lead->name;
    x.cost = cost(lead->config.at("model"), where + ": run \"" + lead->name + "\" model");
    x.has_log = !lead->evals.empty();
    if (c.baseline_eval_acc) x.steps_to_baseline = first_reaching(lead->evals, *c.baseline_eval_acc);
    for (const auto& [p, d] : lead->sweeps) x.sweeps[p] = d.summary;
    if (x.sweeps.empty()) x.missing = lead->trained ? "no sweep yet" : "not trained yet";
    x.compute_basis = "FLOPs";
    if (c.baseline().cost) x.compute_x = x.cost->flops / c.baseline().cost->flops;
    for (const RunData* r : group) {
      const auto b = base_by_seed.find(train_seed(*r));
      if (b == base_by_seed.end())
        throw Error(fmt::format("{}: run \"{}\" has train.seed {}, which no run of the baseline "
                                "suite has",
                                where, r->name, train_seed(*r)));
      SeedSweep sw{b->second->name, x.name, std::nullopt, x.cost};
      if (r->sweeps.count(judged)) sw.prefix = r->sweeps.at(judged).summary;
      c.seed_sweeps.push_back(sw);
    }
    cs.candidates.push_back(x.name);
    c.candidates.push_back(std::move(x));
  }
  c.candidate_suites.push_back(std::move(cs));
}

std::vector<std::string> inference_sweep_commands(const SuiteResults& suite,
                                                  const std::string& suite_dir,
                                                  const std::string& inference_dir,
                                                  const std::string& binary, int repeats) {
  const json& s = suite.suite;
  const RunData* base = nullptr;
  for (const auto& r : suite.runs)
    if (r.name == kBaselineRun) base = &r;
  if (!base)
    throw Error(fmt::format("{}/suite.json: no run \"{}\"", suite_dir, kBaselineRun));
  const std::string judged = s["paddings"].at(0).get<std::string>();
  std::vector<std::string> out;
  auto add = [&](const RunData& r, const std::string& padding, const std::string& setting,
                 const std::string& dir, int examples, bool timing) {
    if (!r.trained || fs::exists(dir + "/summary.json")) return;
    SweepCommand c{.binary = binary,
                   .model = r.dir + "/model",
                   .task = r.config["task"].value("name", "kv"),
                   .examples = examples,
                   .modulus = s["modulus"].get<int>(),
                   .padding = padding,
                   .seed = s.value("seed", uint64_t{0}),
                   .threads = 1,
                   .out = dir};
    if (setting == "recent-copy") c.flags = {"--recent-copy"};
    if (setting.rfind("ensemble", 0) == 0) c.flags = {"--ensemble", setting.substr(8)};
    if (timing)
      for (const char* f : {"--bootstrap-reps", "0", "--permutations", "0"}) c.flags.push_back(f);
    out.push_back(shell_command(sweep_argv(c)));
  };
  const int examples = s["examples"].get<int>();
  for (const auto& p : s["paddings"])
    for (const auto& setting : kInferenceSettings)
      add(*base, p.get<std::string>(), setting,
          fmt::format("{}/{}/{}/{}", inference_dir, kBaselineRun, p.get<std::string>(), setting),
          examples, false);
  for (int round = 1; round <= repeats; ++round)
    for (const auto& setting : timed_settings())
      add(*base, judged, setting, fmt::format("{}/timing/{}/{}", inference_dir, round, setting),
          20, true);
  for (const auto& name : seed_runs(suite, *base))
    for (const auto& r : suite.runs)
      if (r.name == name)
        for (const auto& setting : kInferenceSettings)
          add(r, judged, setting, fmt::format("{}/{}/{}/{}", inference_dir, name, judged, setting),
              examples, false);
  return out;
}

}  // namespace phasekv
