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

// The largest phase grid a sweep, an audit or a suite accepts. Every (example, phase) item is
// generated before the first is scored, so an unbounded --modulus (1e9) reached gigabytes of
// memory before any error; real weak-spot periods are strides of a few to a few hundred tokens.
constexpr int kMaxModulus = 4096;
constexpr int kMaxExamples = 100000;
constexpr int64_t kMaxItems = 10'000'000;  // examples x modulus
// Throws phasekv::Error naming `examples_key` / `modulus_key` (a flag or a file key) and the limit.
void check_phase_grid(int examples, int modulus, const std::string& examples_key,
                      const std::string& modulus_key);

struct SweepOptions {
  TaskConfig task;
  int examples = 100;  // logical example ids [0, examples)
  int modulus = 8;     // M: phases r in [0, M)
  PaddingMode padding = PaddingMode::kPrefix;
  uint64_t seed = 0;  // names the logical examples (with the task config)
  // Stride S for the interior/boundary split and the periodicity check. 0: the model's stride
  // (Backend::model_stride). A model stride that does not
  // divide M is an error (the phases would not determine p mod S) unless stride_given: the
  // caller chose the stride (--stride, even 0), and then there is no split.
  int stride = 0;
  bool stride_given = false;
  std::string out_dir;  // results.jsonl (the caller writes the report files beside it)
  int batch = 32;       // requests per Backend::score call, and per flush of results.jsonl
  SummaryOptions stats;
  // > 0: the smallest gap worth detecting, pp (--min-gap): the summary gets its sensitivity
  // (eval/plan.h attach_sensitivity), and a verdict that found nothing says whether it could have.
  double min_gap_pp = 0.0;
  // Inference-time mitigations (eval/mitigations.h, docs/MITIGATIONS.md); the defaults are the
  // plain sweep. ensemble K: average the next-token distributions of K copies shifted by
  // floor(k S / K) prefix fillers. recent_copy (lookup): the target record again right before the
  // target key.
  int ensemble = 1;
  bool recent_copy = false;
  // Each record also carries its prompt's length and FNV-1a hash of its ids (prompt_tokens,
  // prompt_ids_fnv1a64): chat audits, whose server-rendered prompt was checked equal to them.
  bool record_prompt_hash = false;
  // Free-form model description copied into summary.json's meta (model dir, config hash,
  // stride ...). Key "config_hash" is read when present.
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

// The sweep's default batch for contexts of `context_tokens` tokens: as many as fit a forward of
// kAutoBatchTokens tokens, at least 1 and at most 64. Wide batches pay off only for short contexts
// (bundled lookup sweep, 136 tokens, one thread: 944 items/s at 16, 1,305 at 64; Zen 4); long ones
// would only grow the activations.
inline constexpr int64_t kAutoBatchTokens = 16384;
int auto_batch(int64_t context_tokens);

// Validates everything first (throws phasekv::Error and writes nothing): examples >= 1,
// modulus >= 1, batch >= 1, a known task and padding, a valid task config, a stride that divides
// the modulus, the mitigations (ensemble_shifts), a context that fits the backend's max_context
// (shifted copies and the recent copy included), and an existing results.jsonl that belongs to
// this sweep (same model, config hash, task, seed, modulus and padding). The items' condition is
// mitigation_condition(o). Throws when a phase has no successful outcome (after writing what was
// scored).
SweepResult run_sweep(Backend& backend, const SweepOptions& opts);

// The sweep's items as an evaluation mode, with conditions: items (condition, example, phase)
// for every condition, example in [0, examples) and phase in [0, M), in that order, each a
// context materialized as by run_sweep. Modes that compare variants of one model on the same
// items (src/explain: knockouts, gate cycling) are SweepModes with their own conditions and
// scorer; run_sweep is the one with the single condition "" and Backend::score.
class SweepMode : public EvalMode {
 public:
  // Scores the requests of one condition (the consecutive items of a batch that share it), in
  // order. A scorer that changes the model for its condition restores it before returning.
  using Scorer = std::function<std::vector<ScoreResult>(
      Backend& backend, const std::string& condition, const std::vector<ScoreRequest>& requests)>;
  // Mode-specific record fields of a condition (EvalRecord::extra), or null.
  using Extra = std::function<nlohmann::json(const std::string& condition)>;
  // `o` must outlive the mode. scorer nullptr: Backend::score (score_ensemble with
  // o.ensemble > 1, which a scorer of its own cannot be combined with).
  SweepMode(const SweepOptions& o, EvalRecord identity,
            std::vector<std::string> conditions = {""}, Scorer scorer = nullptr,
            Extra extra = nullptr);

  EvalRecord identity() const override { return identity_; }
  std::vector<EvalItem> items() const override;
  size_t batch_size() const override { return static_cast<size_t>(o_.batch); }
  std::vector<EvalRecord> evaluate(Backend& backend, const std::vector<EvalItem>& batch) override;

 private:
  EvalRecord record(const std::string& condition, const TaskExample& ex,
                    const ScoreResult& res) const;

  const SweepOptions& o_;
  EvalRecord identity_;
  std::vector<std::string> conditions_;
  Scorer scorer_;
  Extra extra_;
  std::optional<LogicalExample> lg_;
};

// What run_sweep does before scoring, for modes built on SweepMode: validates `o` and checks
// that its contexts fit the backend (throws phasekv::Error as run_sweep documents), and returns
// the identity every record shares. `described`, when given, receives backend.describe().
EvalRecord prepare_sweep(Backend& backend, const SweepOptions& o,
                         nlohmann::json* described = nullptr);

// The stride for the interior/boundary split (o.stride, else the model's when it divides M,
// else 0), as run_sweep chooses it.
int sweep_stride(Backend& backend, const SweepOptions& o);

// "records: 2400 scored now, 0 resumed, ..." for the terminal, after terminal_table().
std::string sweep_records_line(const SweepResult& r);

}  // namespace phasekv
