#include "eval/sla_gate.h"

#include <fmt/format.h>

#include "util/error.h"

namespace phasekv {

void validate_sla(const SlaGate& gate) {
  if (gate.max_gap_pp && !(*gate.max_gap_pp >= 0.0 && *gate.max_gap_pp <= 100.0))
    throw Error(fmt::format("--max-gap is {} (allowed: percentage points in [0, 100], e.g. 3)",
                            *gate.max_gap_pp));
  if (gate.min_worst_acc && !(*gate.min_worst_acc >= 0.0 && *gate.min_worst_acc <= 1.0))
    throw Error(
        fmt::format("--min-worst is {} (allowed: an accuracy as a fraction in [0, 1], e.g. 0.95)",
                    *gate.min_worst_acc));
}

SlaVerdict evaluate_sla(const SlaGate& gate, const PhaseSummary& s) {
  SlaVerdict v;
  // No verdict, no pass: a gate cannot vouch for phases that were not scored, or for a model
  // that does not do the task (a flat zero has no gap to exceed).
  if (!s.complete()) {
    v.passed = false;
    v.line = fmt::format(
        "SLA FAILED: incomplete, {} of {} outcomes (rerun the same command to retry the rest)",
        s.outcomes, s.planned_outcomes);
    return v;
  }
  if (s.at_or_below_shortcut()) {
    v.passed = false;
    v.line = fmt::format(
        "SLA FAILED: uninformative, accuracy at or below the shortcut {:.3f} at every phase "
        "(mean {:.3f}): the model does not do the task",
        *s.shortcut, s.mean_acc);
    return v;
  }
  std::string checks;
  auto add = [&](bool ok, const std::string& text) {
    v.passed = v.passed && ok;
    checks += (checks.empty() ? "" : "; ") + text;
  };
  if (gate.max_gap_pp) {
    const bool ok = s.gap_ci_pp.hi <= *gate.max_gap_pp;
    add(ok, fmt::format("gap {:.1f} pp (95% CI upper {:.1f}) {} --max-gap {:g}", s.gap_pp,
                        s.gap_ci_pp.hi, ok ? "<=" : ">", *gate.max_gap_pp));
  }
  if (gate.min_worst_acc) {
    const bool ok = s.worst_acc_ci.lo >= *gate.min_worst_acc;
    add(ok, fmt::format("worst phase r={} {:.3f} (95% CI lower {:.3f}) {} --min-worst {:g}",
                        s.worst_phase, s.worst_acc, s.worst_acc_ci.lo, ok ? ">=" : "<",
                        *gate.min_worst_acc));
  }
  v.line = (v.passed ? "SLA passed: " : "SLA FAILED: ") + checks;
  return v;
}

}  // namespace phasekv
