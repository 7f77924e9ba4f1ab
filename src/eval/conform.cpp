#include "eval/conform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <utility>

#include "util/error.h"

namespace phasekv {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

std::string complete_verdict_text(const ConformSummary& s) {
  if (s.items == s.censored)
    return fmt::format(
        "no deviation measurable: every item censored ({} greedy and {} verdict "
        "flips over {} items)",
        s.greedy_flips, s.verdict_flips, s.items);
  if (s.max_dlogprob <= s.tolerance && s.greedy_flips == 0)
    return fmt::format("conforms within {:.1e} (max |dlogprob| {:.1e} over {} items)", s.tolerance,
                       s.max_dlogprob, s.items - s.censored);
  const std::string flips = fmt::format("{} greedy and {} verdict flips over {} items",
                                        s.greedy_flips, s.verdict_flips, s.items);
  std::string jumps;
  if (!s.jumps.empty()) {
    std::string at;
    for (size_t i = 0; i < s.jumps.size() && i < 4; ++i)
      at += fmt::format("{}example {} r = {} ({:.2g})", i ? ", " : "", s.jumps[i].example,
                        s.jumps[i].r, s.jumps[i].dlogprob);
    jumps = fmt::format("; {} isolated jump{} at {}{}", s.jumps.size(),
                        s.jumps.size() == 1 ? "" : "s", at, s.jumps.size() > 4 ? ", ..." : "");
  }
  if (!s.flagged.empty()) {
    std::string phases;
    for (int r : s.flagged) phases += (phases.empty() ? "" : ", ") + std::to_string(r);
    return fmt::format("phase-dependent deviation at r = {} (max |dlogprob| {:.2g}, {}){}", phases,
                       s.max_dlogprob, flips, jumps);
  }
  return fmt::format("deviates at every phase (typical |dlogprob| {:.2g}, max {:.2g}, {}){}",
                     s.typical_dlogprob, s.max_dlogprob, flips, jumps);
}

std::string verdict_text(const ConformSummary& s) {
  const std::string censored =
      s.censored == 0 ? ""
                      : fmt::format(
                            "; {} items censored (the target outside a top-n: |dlogprob| "
                            "unknown there, greedy answers compared; raise --top-n)",
                            s.censored);
  // Never a whole verdict from part of the items: the missing ones may be where it deviates.
  if (s.missing > 0)
    return fmt::format("incomplete: {} of {} items missing (errors or unscored); so far {}{}",
                       s.missing, s.missing + s.items, complete_verdict_text(s), censored);
  return complete_verdict_text(s) + censored;
}

}  // namespace

ConformSummary conform_summary(const RunResult& reference, const RunResult& engine,
                               const std::string& condition, int modulus, const ConformOptions& o) {
  if (modulus < 1) throw Error(fmt::format("conform: modulus {} (allowed: >= 1)", modulus));
  ConformSummary s;
  s.condition = condition;
  s.modulus = modulus;
  s.tolerance = o.tolerance;
  s.phases.resize(static_cast<size_t>(modulus));
  for (int r = 0; r < modulus; ++r) s.phases[static_cast<size_t>(r)].r = r;
  // The engine's records by (example, phase): its condition names the engine's setting.
  std::map<std::pair<int64_t, int>, const EvalRecord*> by_item;
  std::vector<std::vector<ConformSummary::Jump>> deviations(static_cast<size_t>(modulus));
  for (const auto& [key, rec] : engine.latest) by_item[{rec.example_id, rec.phase}] = &rec;
  for (const auto& [key, ref] : reference.latest) {
    if (ref.phase < 0 || ref.phase >= modulus) continue;
    const auto it = by_item.find({ref.example_id, ref.phase});
    const EvalRecord* eng = it == by_item.end() ? nullptr : it->second;
    if (!eng || !ref.ok() || !eng->ok()) {
      ++s.missing;
      continue;
    }
    ConformPhase& p = s.phases[static_cast<size_t>(ref.phase)];
    ++p.n;
    // A NaN is a log-probability the scorer could not give (a record written to disk holds null).
    const auto known = [](const std::optional<double>& lp) { return lp && std::isfinite(*lp); };
    if (known(ref.target_logprob) && known(eng->target_logprob)) {
      const double d = std::abs(*eng->target_logprob - *ref.target_logprob);
      ++p.scored;
      p.max_dlogprob = std::max(p.max_dlogprob, d);
      p.mean_dlogprob += d;  // a sum until every item is in
      p.beyond_tolerance += d > o.tolerance;
      deviations[static_cast<size_t>(ref.phase)].push_back({ref.example_id, ref.phase, d});
    } else {
      ++s.censored;
    }
    p.greedy_flips += eng->prediction != ref.prediction;
    p.verdict_flips += eng->correct != ref.correct;
  }
  std::vector<double> medians, all;
  for (ConformPhase& p : s.phases) {
    if (p.n == 0) continue;
    if (p.scored > 0) {
      p.mean_dlogprob /= static_cast<double>(p.scored);
      std::vector<double> d;
      for (const auto& j : deviations[static_cast<size_t>(p.r)]) d.push_back(j.dlogprob);
      p.median_dlogprob = median(d);
      medians.push_back(p.median_dlogprob);
      all.insert(all.end(), d.begin(), d.end());
    }
    s.items += p.n;
    s.max_dlogprob = std::max(s.max_dlogprob, p.max_dlogprob);
    s.greedy_flips += p.greedy_flips;
    s.verdict_flips += p.verdict_flips;
  }
  if (s.items == 0)
    throw Error("conform: the reference and the engine share no scored item (" + reference.path +
                ", " + engine.path + ")");
  const double typical_phase = median(medians);
  for (const ConformPhase& p : s.phases)
    if (p.scored > 0 && p.median_dlogprob > o.tolerance &&
        p.median_dlogprob >= o.phase_factor * typical_phase)
      s.flagged.push_back(p.r);
  s.typical_dlogprob = median(all);
  for (const auto& phase : deviations)
    for (const auto& j : phase)
      if (j.dlogprob > o.tolerance && j.dlogprob >= o.phase_factor * s.typical_dlogprob &&
          std::find(s.flagged.begin(), s.flagged.end(), j.r) == s.flagged.end())
        s.jumps.push_back(j);
  std::sort(s.jumps.begin(), s.jumps.end(),
            [](const auto& a, const auto& b) { return a.dlogprob > b.dlogprob; });
  s.verdict = verdict_text(s);
  return s;
}

nlohmann::json ConformSummary::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const ConformPhase& p : phases)
    rows.push_back({{"phase", p.r},
                    {"n", p.n},
                    {"scored", p.scored},
                    {"max_dlogprob", p.max_dlogprob},
                    {"mean_dlogprob", p.mean_dlogprob},
                    {"median_dlogprob", p.median_dlogprob},
                    {"beyond_tolerance", p.beyond_tolerance},
                    {"greedy_flips", p.greedy_flips},
                    {"verdict_flips", p.verdict_flips}});
  nlohmann::json jump_rows = nlohmann::json::array();
  for (const Jump& j : jumps)
    jump_rows.push_back({{"example", j.example}, {"phase", j.r}, {"dlogprob", j.dlogprob}});
  return {{"condition", condition},       {"modulus", modulus},
          {"tolerance", tolerance},       {"phases", rows},
          {"max_dlogprob", max_dlogprob}, {"items", items},
          {"greedy_flips", greedy_flips}, {"verdict_flips", verdict_flips},
          {"missing", missing},           {"censored", censored},
          {"flagged_phases", flagged},    {"typical_dlogprob", typical_dlogprob},
          {"jumps", jump_rows},           {"verdict", verdict}};
}

}  // namespace phasekv
