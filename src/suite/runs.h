// A reproduction suite's results as `phasekv repro --out DIR` left them: suite.json, and per run
// its config, its training log and the summary.json of each sweep. One loader for every page
// generated from a suite (`repro report`, `mitigations report`), so they read the same numbers.
#pragma once
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

struct SweepData {
  PhaseSummary summary;              // at the suite's modulus
  nlohmann::json meta;               // summary.json's "meta" (records, sweep settings, ...)
  std::optional<PhaseSummary> fold;  // folded mod the run's own stride (LoadSuiteOptions::fold)
  // Do the interior phases differ? The sign-flip test of summary.h StrideSplit::interior_test on
  // the unfolded records (each example one cluster).
  std::optional<FlipResult> interior;
  double shortcut = NAN;
};

// One periodic evaluation of the training log (`eval_every` steps).
struct EvalPoint {
  int step = 0;
  double acc = 0.0;
};

struct RunData {
  std::string name;
  std::string dir;  // <suite dir>/<name>
  nlohmann::json config, study;
  int stride = 0, width = 0;  // of the first chunked layer; 0: no chunked layer (a control)
  bool trained = false;       // train.done exists
  std::string cpu;  // model/train.json's runtime.cpu: the last training segment's; "" unrecorded
  std::optional<double> train_loss, eval_acc, eval_loss;  // the training log's last line
  std::vector<EvalPoint> evals;                           // in step order
  std::map<std::string, SweepData> sweeps;                // by padding
  std::map<double, PhaseSummary> depths;
};

struct SuiteResults {
  nlohmann::json suite;       // suite.json
  std::vector<RunData> runs;  // in the suite file's order, with or without results
};

struct LoadSuiteOptions {
  // Summarise every sweep again from its records (reads results.jsonl: this build's statistics,
  // not the ones summary.json was written with) and refold them mod the run's stride: what
  // `repro report` needs, and nothing else does.
  bool fold = false;
};

// Throws phasekv::Error naming the file when suite.json is missing or a summary.json is malformed.
SuiteResults load_suite_results(const std::string& suite_dir, const LoadSuiteOptions& o = {});

// The summary.json of one sweep directory; nullopt when it has none yet.
std::optional<SweepData> read_sweep_dir(const std::string& dir);

}  // namespace phasekv
