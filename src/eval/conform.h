// Engine conformance (issue 41, section 2): the same sweep run through the model in process (the
// reference) and through a served engine under one condition (a micro-batch size, flash attention
// on or off, a split prompt ...), each an ordinary resumable sweep (eval/sweep.h), joined item by
// item. Per phase r: the largest and mean |log p_engine(target) - log p_reference(target)|, how
// often the greedy answer changes, and how often the task's verdict (right or wrong) changes.
//
// The verdict: "conforms within X" when no item deviates by more than the tolerance and no greedy
// answer changes; "phase-dependent deviation at r = ..." when the deviation sits at some phases
// (their largest deviation above the tolerance and at least `phase_factor` times the median of
// the phases' largest deviations); otherwise "deviates at every phase (max X)". A port bug that
// moves one phase (an entry visible a token early at the block boundary) shows as the first
// kind's opposite: a few flagged phases; engine noise (summation order) as the first kind.
// Plain C++ (no libtorch).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/runner.h"

namespace phasekv {

struct ConformPhase {
  int r = 0;
  int64_t n = 0;  // items scored by both
  double max_dlogprob = 0.0, mean_dlogprob = 0.0;
  int64_t greedy_flips = 0, verdict_flips = 0;
};

struct ConformSummary {
  std::string condition;
  int modulus = 0;
  double tolerance = 0.0;
  std::vector<ConformPhase> phases;
  double max_dlogprob = 0.0;
  int64_t items = 0, greedy_flips = 0, verdict_flips = 0;
  int64_t missing = 0;       // reference items without an engine record (or either failed)
  std::vector<int> flagged;  // phases with a phase-dependent deviation
  std::string verdict;
  nlohmann::json to_json() const;
};

struct ConformOptions {
  double tolerance = 1e-3;     // nats of target log-probability
  double phase_factor = 10.0;  // a flagged phase deviates this many times the median phase
};

// Joins the two runs' latest records of `modulus` phases on (example, phase); records whose
// target log-probability is missing (censored or failed) count as missing. Throws phasekv::Error
// when the runs share no item.
ConformSummary conform_summary(const RunResult& reference, const RunResult& engine,
                               const std::string& condition, int modulus,
                               const ConformOptions& o = {});

}  // namespace phasekv
