// The phase sweep (docs/BACKGROUND.md): every logical example evaluated with its target key at
// every phase r in [0, M), scored by full-vocabulary top-1 accuracy of the answer token.
//
// A sweep is one evaluation mode of the runner (eval/runner.h): its items are (example, phase)
// pairs, scored through the Backend and streamed to OUT/results.jsonl, so an interrupted sweep
// resumes where it stopped. The records are then summarised (eval/stats.h); the caller writes the
// report files (report/report.h). docs/RESULTS.md documents every file.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "eval/runner.h"
#include "eval/stats.h"
#include "task/tasks.h"

namespace phasekv {

struct SweepOptions {
  TaskConfig task;
  int examples = 100;  // logical example ids [0, examples)
  int modulus = 8;     // M: phases r in [0, M)
  PaddingMode padding = PaddingMode::kPrefix;
  uint64_t seed = 0;  // names the logical examples (with the task config)
  // Stride S for the interior/boundary split and the periodicity check. 0: the model's stride
  // (model_meta["stride"], else the backend's describe()["stride"]) when it divides M, else none.
  int stride = 0;
  std::string out_dir;  // results.jsonl (the caller writes the report files beside it)
  int batch = 32;       // requests per Backend::score call, and per flush of results.jsonl
  SummaryOptions stats;
  // Free-form model description copied into summary.json's meta (model dir, config hash,
  // stride ...). Keys "stride" and "config_hash" are read when present.
  nlohmann::json model_meta = nlohmann::json::object();
  std::ostream* progress = nullptr;  // progress and warnings; nullptr: silent
  std::string progress_label = "sweep";
  std::function<std::string()> progress_note;  // appended to progress lines (e.g. retries)
};

struct SweepResult {
  PhaseSummary summary;
  nlohmann::json meta;  // summary.json's "meta"
  std::string label;
  int64_t scored = 0;   // (example, phase) pairs evaluated by this call
  int64_t resumed = 0;  // pairs taken from an existing results.jsonl
  int64_t errors = 0;   // pairs whose latest record is an error (left out of the statistics)
  int64_t censored = 0;
  RunResult run;        // the latest record of every (example, phase)
};

// Validates everything first (throws phasekv::Error and writes nothing): examples >= 1,
// modulus >= 1, batch >= 1, a known task and padding, a valid task config, a stride that divides
// the modulus, a context that fits the backend's max_context, and an existing results.jsonl that
// belongs to this sweep (same model, config hash, task, seed, modulus and padding). Throws when a
// phase has no successful outcome (after writing what was scored).
SweepResult run_sweep(Backend& backend, const SweepOptions& opts);

// "records: 2400 scored now, 0 resumed, ..." for the terminal, after terminal_table().
std::string sweep_records_line(const SweepResult& r);

}  // namespace phasekv
