#include "eval/plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "eval/calibrate.h"
#include "util/error.h"

namespace phasekv {
namespace {

calibrate::Setting setting(const PlanRequest& r, int examples, bool with_dip) {
  calibrate::Setting s;
  s.group = with_dip ? "plan-detect" : "plan-certify";
  s.modulus = r.modulus;
  s.stride = r.stride;
  s.stride_given = r.stride_known && r.modulus % r.stride == 0 ? r.stride : 0;
  s.profile = with_dip ? calibrate::Profile::boundary : calibrate::Profile::flat;
  s.top = r.accuracy;
  s.gap = with_dip ? r.min_gap : 0.0;
  s.icc = r.icc;
  s.replica = r.modulus % r.stride == 0 ? r.replica : 0.0;
  s.examples = examples;
  s.datasets = r.datasets;
  return s;
}

// The tests as a sweep runs them, with fixed flips (p < 0.05 <=> at most 8 of 199 reach the
// observed) and without the bootstraps that no verdict here reads.
calibrate::Options simulation_options(const PlanRequest& r) {
  calibrate::Options o;
  o.permutations = 199;
  o.bootstrap_reps = 0;
  o.period_bootstrap = 0;
  o.threads = r.threads;
  o.seed = r.seed;
  o.sla_max_gap_pp = {100.0 * r.min_gap};
  return o;
}

}  // namespace

void validate(const PlanRequest& r) {
  if (r.modulus < 4) throw Error(fmt::format("--modulus {}: at least 4", r.modulus));
  if (r.stride < 2 || 2 * r.stride > r.modulus)
    throw Error(fmt::format(
        "--stride {} must lie in [2, --modulus / 2 = {}]: a period is resolved from two "
        "repetitions within one example's phases",
        r.stride, r.modulus / 2));
  if (!(r.min_gap > 0.0 && r.min_gap <= 1.0))
    throw Error(fmt::format("--min-gap {} pp must lie in (0, 100]", 100 * r.min_gap));
  if (!(r.accuracy > 0.0 && r.accuracy <= 1.0) || r.accuracy - r.min_gap < 0.0)
    throw Error(
        fmt::format("--accuracy {} with --min-gap {} pp leaves the dip at {:.3f}, outside [0, 1]",
                    r.accuracy, 100 * r.min_gap, r.accuracy - r.min_gap));
  if (!(r.power > 0.0 && r.power < 1.0))
    throw Error(fmt::format("--power {} must lie in (0, 1), e.g. 0.8", r.power));
  if (!(r.icc >= 0.0 && r.icc < 1.0))
    throw Error(fmt::format("--icc {} must lie in [0, 1)", r.icc));
  if (!(r.replica >= 0.0 && r.replica <= 1.0))
    throw Error(fmt::format("--replica {} must lie in [0, 1]", r.replica));
  if (r.datasets < 20) throw Error(fmt::format("--datasets {}: at least 20", r.datasets));
  if (r.min_examples < 1 || r.min_examples > r.max_examples)
    throw Error(
        fmt::format("plan: examples from {} to {} is no grid", r.min_examples, r.max_examples));
  if (r.max_examples < 25)
    throw Error(fmt::format("--max-examples {}: at least 25", r.max_examples));
}

Plan plan_examples(const PlanRequest& r) {
  validate(r);
  Plan p;
  p.request = r;
  const calibrate::Options o = simulation_options(r);
  int index = 0;
  for (int n = r.min_examples; n <= r.max_examples; n *= 2) {
    PlanPoint pt;
    pt.examples = n;
    if (p.examples_to_detect == 0) {
      const calibrate::Result d = calibrate::run_setting(setting(r, n, true), o, index++);
      pt.detect = d.period_reject.value();
      pt.detect_se = d.period_reject.se();
      if (pt.detect >= r.power) p.examples_to_detect = n;
    } else {
      pt.detect = pt.detect_se = NAN;  // already reached: not simulated again
    }
    if (r.certify && p.examples_to_certify == 0) {
      const calibrate::Result c = calibrate::run_setting(setting(r, n, false), o, index++);
      pt.certify = 1.0 - c.sla_fail.front().value();
      pt.certify_se = c.sla_fail.front().se();
      if (pt.certify >= r.power) p.examples_to_certify = n;
    } else {
      pt.certify = pt.certify_se = NAN;
    }
    p.curve.push_back(pt);
    if (p.examples_to_detect && (p.examples_to_certify || !r.certify)) break;
  }
  return p;
}

PlanRequest plan_request_for(int modulus, int stride, double min_gap_pp, int threads) {
  PlanRequest r;
  r.modulus = modulus;
  r.stride_known = stride >= 2 && 2 * stride <= modulus;
  r.stride = r.stride_known ? stride : modulus / 2;
  r.min_gap = min_gap_pp / 100.0;
  r.threads = std::max(1, threads);
  return r;
}

void attach_sensitivity(PhaseSummary& s, double min_gap_pp, int threads, uint64_t seed) {
  if (min_gap_pp <= 0.0 || s.modulus < 4 || s.examples < 1) return;
  PlanRequest r = plan_request_for(s.modulus, s.stride, min_gap_pp, threads);
  r.accuracy = std::clamp(std::isnan(s.mean_acc) ? 1.0 : s.mean_acc, r.min_gap, 1.0);
  r.seed = seed;
  validate(r);  // names --min-gap above 100 pp
  Sensitivity out;
  out.min_gap_pp = min_gap_pp;
  out.stride = r.stride;
  out.stride_assumed = !r.stride_known;
  out.accuracy = r.accuracy;
  out.icc = r.icc;
  out.examples = s.examples;
  out.datasets = r.datasets;
  const int n = static_cast<int>(std::min<int64_t>(s.examples, 1 << 20));
  const calibrate::Result d = calibrate::run_setting(setting(r, n, true), simulation_options(r), 0);
  out.power = d.period_reject.value();
  out.power_se = d.period_reject.se();
  out.ruled_out = s.gap_ci_pp.hi < min_gap_pp;  // false when the interval is NaN
  if (out.power < r.power && !out.ruled_out && 2 * n <= 6400) {
    r.certify = false;
    r.min_examples = 2 * n;
    r.max_examples = 6400;
    out.examples_needed = plan_examples(r).examples_to_detect;
  }
  s.sensitivity = out;
}

nlohmann::json Plan::to_json() const {
  const auto& r = request;
  nlohmann::json curve_j = nlohmann::json::array();
  for (const auto& pt : curve)
    curve_j.push_back(
        {{"examples", pt.examples},
         {"detect", std::isnan(pt.detect) ? nlohmann::json() : nlohmann::json(pt.detect)},
         {"certify", std::isnan(pt.certify) ? nlohmann::json() : nlohmann::json(pt.certify)}});
  auto or_null = [](int n) { return n > 0 ? nlohmann::json(n) : nlohmann::json(); };
  return {{"modulus", r.modulus},
          {"stride", r.stride},
          {"min_gap_pp", 100 * r.min_gap},
          {"accuracy", r.accuracy},
          {"power", r.power},
          {"icc", r.icc},
          {"replica", r.replica},
          {"datasets", r.datasets},
          {"seed", r.seed},
          {"curve", curve_j},
          {"examples_to_detect", or_null(examples_to_detect)},
          {"examples_to_certify", or_null(examples_to_certify)}};
}

std::string plan_text(const Plan& p, int64_t tokens_per_item) {
  const auto& r = p.request;
  std::string t = fmt::format(
      "plan: M = {}, a {:.0f} pp dip every {} phases{} below accuracy {:.2f}; power {:.0f} %; "
      "{} simulated sweeps per point (docs/STATISTICS.md)\n"
      "  examples   detect the dip (period p < 0.05)   a flat model passes --max-gap {:g}\n",
      r.modulus, 100 * r.min_gap, r.stride,
      r.stride_known ? "" : " (stride unknown: M/2, the hardest period to find)", r.accuracy,
      100 * r.power, r.datasets, 100 * r.min_gap);
  auto cell = [](double v, double se) {
    return std::isnan(v) ? std::string("-") : fmt::format("{:5.1f} % ± {:.1f}", 100 * v, 100 * se);
  };
  for (const auto& pt : p.curve)
    t += fmt::format("  {:>8}   {:<34} {}\n", pt.examples, cell(pt.detect, pt.detect_se),
                     cell(pt.certify, pt.certify_se));
  auto cost = [&](int n) {
    const int64_t items = static_cast<int64_t>(n) * r.modulus;
    return tokens_per_item > 0
               ? fmt::format("{} items, about {} prompt tokens", items, items * tokens_per_item)
               : fmt::format("{} items", items);
  };
  auto answer = [&](const char* what, int n) {
    return n > 0 ? fmt::format("{}: {} examples per phase ({}; one padding)\n", what, n, cost(n))
                 : fmt::format("{}: more than {} examples per phase (--max-examples)\n", what,
                               r.max_examples);
  };
  t += answer("to detect the dip", p.examples_to_detect);
  t += answer("to certify a flat model", p.examples_to_certify);
  return t;
}

}  // namespace phasekv
