// The one resumable evaluation engine. Every evaluation mode (the phase sweep, the text audit,
// and later knockouts, gate cycling, probes and suites) turns its work into items, each keyed by
// (condition, example, phase); the runner scores them through the mode and its Backend, appends
// and flushes one results.jsonl line per item after every batch, and on a rerun:
//   - repairs a torn last line (an interrupted append) before appending again,
//   - refuses a file that holds another run (check_same_run), or is corrupt before its last line,
//   - skips items that already have a successful record and retries the failed ones.
// It hands back the latest record of every item, from which the mode builds its summary; the
// caller (cli) writes the report files.
#pragma once
#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "eval/results_file.h"
#include "eval/stats.h"
#include "util/error.h"

namespace phasekv {

struct EvalItem {
  std::string condition;  // "" for a plain evaluation
  int64_t example_id = 0;
  int phase = 0;
  ItemKey key() const { return {condition, example_id, phase}; }
};

// What an evaluation mode supplies to the runner.
class EvalMode {
 public:
  virtual ~EvalMode() = default;
  // The fields every record of the run shares; an existing results.jsonl must match them.
  virtual EvalRecord identity() const = 0;
  // Every item of the run, in the order they are scored.
  virtual std::vector<EvalItem> items() const = 0;
  // Scores one batch: one record per item, in order, with identity() filled in and each item's
  // key. Failures go into EvalRecord::error (never thrown), so a long run goes on.
  virtual std::vector<EvalRecord> evaluate(Backend& backend,
                                           const std::vector<EvalItem>& batch) = 0;
  // Items per call of evaluate() and per flush of results.jsonl.
  virtual size_t batch_size() const = 0;
};

struct RunOptions {
  std::string out_dir;               // results.jsonl goes here (created if missing)
  std::string label = "eval";        // names the run in progress lines
  std::ostream* progress = nullptr;  // progress and resume notes; nullptr: silent
  // Appended to each progress line (e.g. the transport's retry count); may be empty.
  std::function<std::string()> progress_note;
};

struct RunResult {
  std::string path;                      // OUT/results.jsonl
  std::map<ItemKey, EvalRecord> latest;  // the latest record of every item of this run
  int64_t items = 0;                     // items of this run
  int64_t scored = 0;                    // items evaluated by this call
  int64_t resumed = 0;                   // items taken from an existing results.jsonl
  int64_t ignored = 0;    // records in the file for items outside this run (e.g. a larger sweep)
  bool repaired = false;  // a torn last line was dropped or completed
  double seconds = 0.0;   // wall time this call spent scoring (the pending items only)
};

// Thrown by run_items when the backend stops (Backend::stop_reason, e.g. an endpoint that stopped
// answering): every successful record scored before is in results.jsonl, the failed records of
// the last batch are not written (a rerun scores them). main() returns kRunStoppedExit.
class RunStopped : public Error {
 public:
  using Error::Error;
};
inline constexpr int kRunStoppedExit = 6;

// Validates the existing file before anything is written (throws phasekv::Error), then scores
// the pending items. Throws when the backend returns a wrong number of records or the disk
// refuses an append; everything flushed before stays in the file.
RunResult run_items(Backend& backend, EvalMode& mode, const RunOptions& options);

// The outcomes of one condition's latest records, for the statistics.
struct Tally {
  std::vector<PhaseOutcome> outcomes;  // successful records
  int64_t errors = 0, censored = 0;
  std::string first_error;
  std::vector<int64_t> per_phase;                                  // successful outcomes per phase
  nlohmann::json mean_logprob_by_phase = nlohmann::json::array();  // null where none
};
Tally tally(const RunResult& run, const std::string& condition, int modulus);
// The records of any of `conditions` together (e.g. every needle of a grid cell).
Tally tally(const RunResult& run, const std::vector<std::string>& conditions, int modulus);

// Throws phasekv::Error when a phase has no successful outcome (its statistics would be
// undefined); the message says that a rerun retries the failed items.
void require_every_phase(const Tally& t, const std::string& path);

}  // namespace phasekv
