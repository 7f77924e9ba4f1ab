// Issue 19's side-by-side comparison of the weak spot's mitigations on a reproduction suite's
// reference geometry: the suite's architecture candidates (runs of the suite file) and the
// inference-time options (`sweep --ensemble K`, `sweep --recent-copy`) swept on the baseline run's
// model, each with its phase statistics, its cost and the target verdict.
//
// Torch-free: what a model configuration costs (cache bytes, FLOPs) comes from the engine through
// a CostFn (perf/model_cost.h in the CLI and the tests), so the suite library stays light.
#pragma once
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/stats.h"
#include "suite/runs.h"

namespace phasekv {

// The run every candidate is compared with: the study's W8/S8, 1 KV head.
inline constexpr const char* kBaselineRun = "W8S8";

// The inference-time settings, as directory names under the inference directory.
inline const std::vector<std::string> kInferenceSettings = {"ensemble2", "ensemble4",
                                                            "ensemble8", "recent-copy"};

// Per-token cost of one model configuration, from the engine's accounting.
struct ModelCost {
  double bytes_4k = 0, bytes_128k = 0;  // KV-cache bytes per token after 4096 / 131072 tokens
  double flops = 0;                     // forward FLOPs per token of a 4096-token prefill
};
// `model` is a run's config["model"]; `where` names it for error messages.
using CostFn = std::function<ModelCost(const nlohmann::json& model, const std::string& where)>;

// kTrained: a model a suite trained (an architecture or a training recipe); kInference: an option
// applied to the baseline's model at scoring time.
enum class CandidateKind { kBaseline, kTrained, kInference };

struct Candidate {
  std::string name;  // the suite run, or "W8S8 + ensemble4"
  std::string what;  // what it changes, in words
  CandidateKind kind = CandidateKind::kTrained;
  std::string run;                             // the suite run whose model is scored
  std::map<std::string, PhaseSummary> sweeps;  // by padding; a missing padding is absent
  std::optional<ModelCost> cost;               // of the model (the cache of one sequence)
  // Compute per token relative to the baseline, and how it was obtained: "FLOPs" (the engine's
  // count, architecture candidates) or "time" (measured time per item, inference options).
  double compute_x = NAN;
  std::string compute_basis;
  // Training steps until the periodic evaluation first reached the baseline's final one:
  // nullopt with has_log = true: never; has_log = false: no training log.
  std::optional<int> steps_to_baseline;
  bool has_log = false;
  std::string missing;  // non-empty: why the candidate has no figures (yet)
};

// The target for one candidate against the baseline, under one padding.
struct TargetCheck {
  double gap_hi_pp = 0;   // upper bound of the gap's 95 % CI
  double bytes_x = 0;     // cache bytes per token / the baseline's, the larger of 4K and 128K
  double mean = 0, base_mean = 0;
  double worst = 0;  // worst-phase accuracy: what "closest" ranks by
  bool gap_ok = false, bytes_ok = false, mean_ok = false;
  bool met() const { return gap_ok && bytes_ok && mean_ok; }
  int failed() const { return !gap_ok + !bytes_ok + !mean_ok; }
  std::string why() const;  // the failed criteria with their figures; "" when met
};
inline constexpr double kTargetGapPp = 3.0;    // gap CI upper bound must be below this
inline constexpr double kTargetBytesX = 1.25;  // at most this times the baseline's cache bytes
TargetCheck check_target(const PhaseSummary& s, const ModelCost& cost, const PhaseSummary& base,
                         const ModelCost& base_cost);

// One inference setting (or the plain model, "plain") swept on one seed of the baseline.
// An architecture candidate of a candidate suite (`--candidates`) on one seed: run is then the
// baseline's run of that seed, setting the candidate's name, and cost its model's (nullopt: the
// baseline's own model, as for the inference settings).
struct SeedSweep {
  std::string run, setting;
  std::optional<PhaseSummary> prefix;  // the first padding of the suite only
  std::optional<ModelCost> cost;
};

// A second suite whose runs are architecture candidates (`mitigations report --candidates`): the
// same base training config as the baseline's suite, trained on the baseline's seeds.
struct CandidateSuite {
  std::string dir, name;
  int modulus = 0, examples = 0;
  std::vector<std::string> candidates;  // candidate names, as in Comparison::candidates
};

struct Comparison {
  std::string suite_dir, inference_dir, suite_name;
  int modulus = 0, examples = 0;
  std::vector<std::string> paddings;     // the suite's; the first is the one judged
  std::vector<Candidate> candidates;     // the baseline first
  std::vector<std::string> seed_runs;    // the baseline's other seeds (same config but train.seed)
  std::vector<SeedSweep> seed_sweeps;    // every (seed run incl. the baseline, setting)
  std::vector<CandidateSuite> candidate_suites;
  std::optional<double> baseline_eval_acc;  // the baseline's final periodic evaluation
  int timing_repeats = 0;                   // timing rounds found
  const Candidate& baseline() const { return candidates.front(); }
};

// Reads the suite and the inference directory (layout: <dir>/<run>/<padding>/<setting>/ and
// <dir>/timing/<round>/<setting>/ with setting "baseline" for the plain model). An inference
// sweep whose modulus, examples, seed, model or setting differs from what its directory says
// throws phasekv::Error naming its summary.json and the key. Candidates without results are
// kept with `missing` set.
Comparison build_comparison(const SuiteResults& suite, const std::string& suite_dir,
                            const std::string& inference_dir, const CostFn& cost);

// Adds the runs of a candidate suite: runs that differ only in train.seed form one candidate,
// named after its run on the baseline's seed (the candidate row of every table and the chart) and
// judged on every seed against the baseline's run of that seed. Its `what` lists the model keys
// that differ from the baseline's. Throws phasekv::Error naming suite.json when a run's seed has
// no baseline run, or when the suite's base task or training differ from the baseline's in
// anything but the model.
void add_candidate_suite(Comparison& c, const SuiteResults& base_suite, const SuiteResults& extra,
                         const std::string& extra_dir, const CostFn& cost);

// The sweeps build_comparison reads that do not exist yet, as shell commands in the order worth
// running them: the baseline's settings under every padding, then `repeats` timing rounds (20
// examples, the judged padding, no bootstrap), then the other seeds' settings under the judged
// padding. Each command runs at --threads 1 with the suite's modulus, examples, seed and task;
// runs not trained yet are left out.
std::vector<std::string> inference_sweep_commands(const SuiteResults& suite,
                                                  const std::string& suite_dir,
                                                  const std::string& inference_dir,
                                                  const std::string& binary, int repeats);

// The verdict under the judged padding: nullopt when the candidate or the baseline lacks it.
std::optional<TargetCheck> judge(const Comparison& c, const Candidate& x,
                                 const std::string& padding);

// The page section and the chart of a comparison.
struct MitigationsReportOptions {
  std::string suite_dir, inference_dir;
  std::string out_md;   // a page holding the markers below, or a new file
  std::string out_svg;  // the Pareto chart
  std::string command;  // shown in the page
  std::string cpu;      // the machine that generated it (timings were measured there)
  std::vector<std::string> candidate_dirs;  // candidate suites (add_candidate_suite)
  // Rows to keep besides the baseline (candidate names; empty: all), for a page about a few
  // candidates (e.g. one candidate suite's) without the rows of runs that were not trained.
  std::vector<std::string> only;
};
// Keeps the baseline and the named candidates (in every list that names candidates); throws
// phasekv::Error naming a candidate that is not in the comparison, with the allowed names.
void keep_only(Comparison& c, const std::vector<std::string>& names);
// Markers of the generated section inside out_md; everything outside them is kept.
inline constexpr const char* kSectionBegin = "<!-- BEGIN generated by phasekv mitigations report -->";
inline constexpr const char* kSectionEnd = "<!-- END generated by phasekv mitigations report -->";

std::string comparison_markdown(const Comparison& c, const MitigationsReportOptions& o);
std::string pareto_svg(const Comparison& c);
// Loads, builds and writes both (atomically); returns the comparison.
Comparison write_mitigations_report(const MitigationsReportOptions& o, const CostFn& cost);

}  // namespace phasekv
