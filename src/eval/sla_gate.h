// The worst-phase SLA gate of `phasekv sweep` and `phasekv audit` (--max-gap PP, --min-worst ACC;
// README, "A worst-phase SLA gate"), for a model builder's CI: block a checkpoint whose mean
// improved while its worst phase did not.
//
// It judges the sweep's own summary, after the results are written: the 95 % simultaneous
// intervals of PhaseSummary (gap_ci_pp and worst_acc_ci, stats.h), never statistics of its own.
// A model passes only when the interval lies inside the limit:
//   --max-gap PP     the gap's upper bound      <= PP (best minus worst phase, percentage points)
//   --min-worst ACC  the worst phase's lower bound >= ACC (a fraction; the lowest Sidak-level
//                    Wilson bound over phases, so it covers whichever phase is truly worst)
// The conservative side on purpose: a release gate should block a checkpoint whose worst phase
// *might* be out of bounds, not only one whose worst phase surely is. The price is that a sweep
// with too few examples fails for lack of evidence (a wide interval); more examples narrow it.
// Measured on simulated sweeps (docs/STATISTICS.md): the gap interval covers the true gap in
// 97.5-100 % of datasets, so a model whose true gap exceeds the limit passes rarely, while a flat
// model at M = 24 still fails --max-gap 10 with 400 examples per phase. A summary with fewer
// outcomes than planned, or with no phase above the task's shortcut, fails whatever its intervals
// (stats.h PhaseSummary::complete, at_or_below_shortcut): the report's verdict withholds its answer
// for both.
#pragma once
#include <optional>
#include <string>

#include "eval/stats.h"

namespace phasekv {

struct SlaGate {
  std::optional<double> max_gap_pp;     // --max-gap, in [0, 100]
  std::optional<double> min_worst_acc;  // --min-worst, in [0, 1]
  bool enabled() const { return max_gap_pp || min_worst_acc; }
};

// The exit status of a command whose sweep finished and was written but whose gate failed:
// distinct from 0 (passed), 2 (an error), 3 (an internal tensor error) and CLI usage errors
// (>= 100).
inline constexpr int kSlaFailedExit = 4;

// Throws phasekv::Error naming the flag and its range when a limit is outside it. Called before
// anything is scored. (The intervals need no resampling, so any --bootstrap-reps works.)
void validate_sla(const SlaGate& gate);

struct SlaVerdict {
  bool passed = true;
  // One line: "SLA FAILED: gap 98.0 pp (95% CI upper 100.0) > --max-gap 10; worst phase r=1
  // 0.020 (95% CI lower 0.000) < --min-worst 0.9", or "SLA passed: ..." with <= and >=.
  std::string line;
};
SlaVerdict evaluate_sla(const SlaGate& gate, const PhaseSummary& summary);

}  // namespace phasekv
