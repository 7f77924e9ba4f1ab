// The blind part of an audit's report (audit.json "period", and its printed lines): the stride
// of a served model is usually unknown, so the period is detected from the sweep over phases
// 0..M-1 and the per-phase table is folded to it.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

// The detected period, its p-value and the per-phase table folded to that period (plus the
// interior/boundary split computed with the period as the stride).
nlohmann::json period_report(const std::vector<PhaseOutcome>& outcomes, const PhaseSummary& s,
                             const SummaryOptions& stats);

// period_report's lines for the terminal.
std::string period_text(const nlohmann::json& p);

}  // namespace phasekv
