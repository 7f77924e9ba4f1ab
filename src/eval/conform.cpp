#include "eval/conform.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <map>
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

std::string verdict_text(const ConformSummary& s) {
  if (s.max_dlogprob <= s.tolerance && s.greedy_flips == 0)
    return fmt::format("conforms within {:.1e} (max |dlogprob| {:.1e} over {} items)", s.tolerance,
                       s.max_dlogprob, s.items);
  if (!s.flagged.empty()) {
    std::string phases;
    for (int r : s.flagged) phases += (phases.empty() ? "" : ", ") + std::to_string(r);
    return fmt::format(
        "phase-dependent deviation at r = {} (max |dlogprob| {:.2g}, {} greedy and {} verdict "
        "flips over {} items)",
        phases, s.max_dlogprob, s.greedy_flips, s.verdict_flips, s.items);
  }
  return fmt::format(
      "deviates at every phase (max |dlogprob| {:.2g}, {} greedy and {} verdict "
      "flips over {} items)",
      s.max_dlogprob, s.greedy_flips, s.verdict_flips, s.items);
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
  for (const auto& [key, rec] : engine.latest) by_item[{rec.example_id, rec.phase}] = &rec;
  for (const auto& [key, ref] : reference.latest) {
    if (ref.phase < 0 || ref.phase >= modulus) continue;
    const auto it = by_item.find({ref.example_id, ref.phase});
    const EvalRecord* eng = it == by_item.end() ? nullptr : it->second;
    if (!eng || !ref.ok() || !eng->ok() || !ref.target_logprob || !eng->target_logprob) {
      ++s.missing;
      continue;
    }
    ConformPhase& p = s.phases[static_cast<size_t>(ref.phase)];
    const double d = std::abs(*eng->target_logprob - *ref.target_logprob);
    ++p.n;
    p.max_dlogprob = std::max(p.max_dlogprob, d);
    p.mean_dlogprob += d;  // a sum until every item is in
    p.greedy_flips += eng->prediction != ref.prediction;
    p.verdict_flips += eng->correct != ref.correct;
  }
  std::vector<double> maxima;
  for (ConformPhase& p : s.phases) {
    if (p.n == 0) continue;
    p.mean_dlogprob /= static_cast<double>(p.n);
    maxima.push_back(p.max_dlogprob);
    s.items += p.n;
    s.max_dlogprob = std::max(s.max_dlogprob, p.max_dlogprob);
    s.greedy_flips += p.greedy_flips;
    s.verdict_flips += p.verdict_flips;
  }
  if (s.items == 0)
    throw Error("conform: the reference and the engine share no scored item (" + reference.path +
                ", " + engine.path + ")");
  const double typical = median(maxima);
  for (const ConformPhase& p : s.phases)
    if (p.n > 0 && p.max_dlogprob > o.tolerance && p.max_dlogprob >= o.phase_factor * typical)
      s.flagged.push_back(p.r);
  s.verdict = verdict_text(s);
  return s;
}

nlohmann::json ConformSummary::to_json() const {
  nlohmann::json rows = nlohmann::json::array();
  for (const ConformPhase& p : phases)
    rows.push_back({{"r", p.r},
                    {"n", p.n},
                    {"max_dlogprob", p.max_dlogprob},
                    {"mean_dlogprob", p.mean_dlogprob},
                    {"greedy_flips", p.greedy_flips},
                    {"verdict_flips", p.verdict_flips}});
  return {{"condition", condition},
          {"modulus", modulus},
          {"tolerance", tolerance},
          {"phases", rows},
          {"max_dlogprob", max_dlogprob},
          {"items", items},
          {"greedy_flips", greedy_flips},
          {"verdict_flips", verdict_flips},
          {"missing", missing},
          {"flagged_phases", flagged},
          {"verdict", verdict}};
}

}  // namespace phasekv
