// Pieces shared by the explanation analyses (docs/EXPLANATION.md): `phasekv knockout`, `gates`
// and `gate-cycle` ask why a chunked model has periodic weak spots, on the sweep's items
// (eval/sweep.h) and through the one evaluation engine (eval/runner.h).
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/runner.h"
#include "eval/stats.h"
#include "eval/sweep.h"

namespace phasekv {

// A results.jsonl written with other analysis settings than `want` must not be resumed: its
// records would mix two analyses. Throws phasekv::Error naming the file, the key and both
// values when a record's extra field `key` differs from want[key], for every key of `want`.
void require_same_settings(const std::string& out_dir, const nlohmann::json& want);

// The (example, phase) pairs that succeeded in both conditions, for summarize_paired.
std::vector<PairedOutcome> pair_conditions(const RunResult& run, const std::string& reference,
                                           const std::string& variant);

// Sorted, distinct, each in [0, n): the --layers / --heads selections. Empty: all of [0, n).
// Throws phasekv::Error naming `flag` and the allowed range.
std::vector<int> select_indices(const std::vector<int>& chosen, int n, const std::string& flag);

// Runs (or resumes) `mode` into o.out_dir with o's progress settings.
RunResult run_analysis(Backend& backend, SweepMode& mode, const SweepOptions& o);

// An analysis's meta: o.model_meta, the model id and backend, `settings` under `key` (with the
// sweep's task, examples, modulus, padding and seed added), and the run's record counts.
nlohmann::json analysis_meta(const SweepOptions& o, const EvalRecord& identity,
                             const nlohmann::json& described, const RunResult& run,
                             const std::string& key, nlohmann::json settings);

// "L1.H0" (kv_head >= 0) or "L1" (a whole layer).
std::string unit_name(int layer, int kv_head);

}  // namespace phasekv
