// The phase sweep (docs/PAPER.md section 3): every logical example evaluated with its target key
// at every phase r in [0, M), scored by full-vocabulary top-1 accuracy of the answer token.
//
// One record per (example, phase) is streamed to OUT/results.jsonl (appended and flushed after
// every batch), so an interrupted sweep resumes where it stopped: a rerun with the same options
// reads the file, drops a truncated last line, checks that the file belongs to the same sweep and
// scores only the missing pairs. Then the records are summarised (src/eval/stats.h) and the
// report files written (write_sweep_outputs). docs/RESULTS.md documents every file.
#pragma once
#include <cstdint>
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "eval/stats.h"
#include "train/tasks.h"

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
  std::string out_dir;  // results.jsonl, summary.json, phase.csv, phase.svg, report.html
  int batch = 32;       // requests per Backend::score call, and per flush of results.jsonl
  SummaryOptions stats;
  // Free-form model description copied into summary.json's meta (model dir, config hash,
  // stride ...). Keys "stride" and "config_hash" are read when present.
  nlohmann::json model_meta = nlohmann::json::object();
  std::ostream* out = nullptr;       // the terminal table; nullptr: silent
  std::ostream* progress = nullptr;  // progress and warnings; nullptr: silent
};

// One line of results.jsonl.
struct SweepRecord {
  std::string model;        // Backend::model_id()
  std::string config_hash;  // "" when the backend does not know it
  std::string task;         // "kv" | "passkey"
  uint64_t seed = 0;
  int64_t example_id = 0;
  int phase = 0;
  int modulus = 1;
  std::string padding;  // to_string(PaddingMode): "prefix" | "in_sequence"
  int key_pos = 0;      // absolute positions in the scored context
  int value_pos = 0;
  int query_pos = 0;  // the last context position: the prediction made here is scored
  int32_t target = 0;
  int32_t prediction = -1;  // -1 (null in JSON) on error
  bool correct = false;
  std::optional<double> target_logprob;  // null on error, when censored, or when not finite
  bool censored = false;
  std::string error;  // "" (null in JSON) when the request succeeded
};

nlohmann::json sweep_record_to_json(const SweepRecord& r);
// Throws phasekv::Error naming `where` and the missing or mistyped key.
SweepRecord sweep_record_from_json(const nlohmann::json& j, const std::string& where);

// The records of a results.jsonl file, in file order. A last line that does not parse (an
// interrupted append) is dropped and reported in `dropped_line`; any other bad line throws
// phasekv::Error naming the file and line. Reads only; run_sweep does the repair.
struct ResultsFile {
  std::vector<SweepRecord> records;
  std::vector<std::string> lines;  // the raw text of each kept record, for a lossless rewrite
  bool dropped_line = false;
  bool ends_with_newline = true;
};
ResultsFile read_results(const std::string& path);

struct SweepResult {
  PhaseSummary summary;
  nlohmann::json meta;  // summary.json's "meta"
  std::string label;
  int64_t scored = 0;   // (example, phase) pairs evaluated by this call
  int64_t resumed = 0;  // pairs taken from an existing results.jsonl
  int64_t errors = 0;   // pairs whose latest record is an error (left out of the statistics)
  int64_t censored = 0;
};

// Validates everything first (throws phasekv::Error and writes nothing): examples >= 1,
// modulus >= 1, batch >= 1, a known task and padding, a valid task config, a stride that divides
// the modulus, a context that fits the backend's max_context, and an existing results.jsonl that
// belongs to this sweep (same model, config hash, task, seed, modulus and padding).
SweepResult run_sweep(Backend& backend, const SweepOptions& opts);

}  // namespace phasekv
