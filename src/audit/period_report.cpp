#include "audit/period_report.h"

#include <fmt/format.h>

#include "report/report.h"

namespace phasekv {

using json = nlohmann::json;

json period_report(const std::vector<PhaseOutcome>& outcomes, const PhaseSummary& s,
                   const SummaryOptions& stats) {
  json j = {{"modulus", s.modulus},
            {"detected_period", s.period.detected > 0 ? json(s.period.detected) : json(nullptr)},
            {"p_value", s.period.p_value},
            {"permutations", s.period.permutations},
            {"significant", s.period.detected > 0 && s.period.p_value < 0.05},
            {"gap_pp", s.gap_pp},
            {"worst_phase", s.worst_phase},
            {"best_phase", s.best_phase}};
  const std::vector<int> tried = candidate_periods(s.modulus, s.period.positions_known);
  j["periods_tested"] = tried;
  j["positions"] = s.period.positions_known ? "key_pos" : "phase";
  j["support"] = s.period.detected_support();
  const int P = s.period.detected;
  if (P < 2) return j;
  // Residues of the key position: with positions known P need not divide M.
  std::vector<PhaseOutcome> folded = outcomes;
  for (auto& o : folded)
    o.phase = static_cast<int>((s.period.positions_known ? o.key_pos : o.phase) % P);
  json rows = json::array();
  for (const auto& r : phase_table(folded, P))
    rows.push_back(
        {{"phase", r.r}, {"n", r.n}, {"acc", r.acc}, {"ci_lo", r.ci_lo}, {"ci_hi", r.ci_hi}});
  j["by_residue"] = rows;
  if (s.modulus % P == 0)  // the interior/boundary split needs r mod M to fix p mod P
    j["summary_with_stride_" + std::to_string(P)] =
        summarize(outcomes, s.modulus, P, stats).to_json();
  return j;
}

std::string period_text(const json& p) {
  const auto tried = p["periods_tested"].get<std::vector<int>>();
  const int M = p["modulus"].get<int>();
  const std::string range =
      tried.empty() ? std::string("none")
      : p["positions"] == "key_pos"
          ? fmt::format(
                "every period {}..{} (key positions); a stride above {} needs --modulus "
                ">= 2 x stride",
                tried.front(), tried.back(), tried.back())
          : fmt::format("the divisors of {} in [2, {}] only (no key positions)", M, M / 2);
  if (p["detected_period"].is_null())
    return fmt::format("no candidate period: M = {} leaves none to test\n", M);
  std::string t = fmt::format(
      "detected period {} (sign-flip p = {}; detected in {:.0f} % of example resamples){}\n"
      "periods tested: {}\n",
      p["detected_period"].get<int>(), format_p(p["p_value"].get<double>()),
      100.0 * p["support"].get<double>(),
      p["significant"].get<bool>() ? "" : "  -- not significant", range);
  t += fmt::format("per phase r mod {}:\n", p["detected_period"].get<int>());
  for (const auto& r : p["by_residue"])
    t += fmt::format("  r={:<3} n={:<6} acc {:.3f}  [{:.3f}, {:.3f}]\n", r["phase"].get<int>(),
                     r["n"].get<int64_t>(), r["acc"].get<double>(), r["ci_lo"].get<double>(),
                     r["ci_hi"].get<double>());
  return t;
}

}  // namespace phasekv
