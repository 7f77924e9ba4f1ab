// phasekv plan (eval/plan.h): the examples needed to detect a dip and to certify a flat model,
// from simulated sweeps, and the named errors of its options.
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "eval/plan.h"
#include "report/report.h"
#include "util/error.h"
#include "test_util.h"

namespace phasekv {
namespace {

PlanRequest small(double gap) {
  PlanRequest r;
  r.modulus = 8, r.stride = 4, r.min_gap = gap, r.accuracy = 0.9;
  r.datasets = 40, r.max_examples = 400, r.threads = 2, r.seed = 7;
  return r;
}

TEST(Plan, AWideDipNeedsFewExamplesANarrowOneMore) {
  const Plan wide = plan_examples(small(0.5));
  EXPECT_EQ(wide.examples_to_detect, 25);  // a 50 pp dip: every simulated sweep detects it
  ASSERT_FALSE(wide.curve.empty());
  EXPECT_GE(wide.curve.front().detect, 0.8);
  const Plan narrow = plan_examples(small(0.15));
  EXPECT_GT(narrow.examples_to_detect, 25);
  // Detection power grows with the examples until the target is reached.
  double last = -1;
  for (const auto& pt : narrow.curve)
    if (!std::isnan(pt.detect)) {
      EXPECT_GE(pt.detect, last - 0.15);  // Monte-Carlo noise of 40 datasets
      last = pt.detect;
    }
  // Certifying the absence of a 15 pp gap takes more examples than certifying 50 pp.
  EXPECT_TRUE(narrow.examples_to_certify == 0 ||
              narrow.examples_to_certify > wide.examples_to_certify);
  const std::string text = plan_text(narrow, 300);
  EXPECT_CONTAINS(text, "to detect the dip: ");
  EXPECT_CONTAINS(text, "prompt tokens");
  EXPECT_EQ(narrow.to_json()["modulus"], 8);
}

TEST(Plan, OptionsOutOfRangeNameTheFlag) {
  auto message = [](PlanRequest r) {
    try {
      validate(r);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  PlanRequest r = small(0.1);
  r.stride = 5;  // 2 x 5 > 8
  EXPECT_CONTAINS(message(r), "--stride 5 must lie in [2, --modulus / 2 = 4]");
  r = small(0.1);
  r.accuracy = 0.05;
  EXPECT_CONTAINS(message(r), "--accuracy 0.05");
  r = small(0.1);
  r.power = 1.0;
  EXPECT_CONTAINS(message(r), "--power");
  EXPECT_EQ(message(small(0.1)), "");
}

// A flat sweep of `examples` logical examples at M = 8 (stride 4), accuracy 0.8 everywhere.
PhaseSummary flat_sweep(int examples) {
  std::mt19937_64 rng(11);
  std::bernoulli_distribution correct(0.8);
  std::vector<PhaseOutcome> outcomes;
  for (int e = 0; e < examples; ++e)
    for (int r = 0; r < 8; ++r) outcomes.push_back({e, r, correct(rng), 8 * e + r});
  SummaryOptions o;
  o.bootstrap_reps = 0;
  o.period_bootstrap = 0;
  return summarize(outcomes, 8, 4, o);
}

// Ten examples cannot find a 30 pp dip reliably and do not rule it out: the verdict is
// "inconclusive", names the power and the examples that would do; the sensitivity survives
// summary.json. Four hundred examples rule out a 30 pp gap.
TEST(Plan, SensitivityMakesAnUnderpoweredNullInconclusive) {
  PhaseSummary few = flat_sweep(10);
  ASSERT_GE(few.period.p_value, 0.05);
  attach_sensitivity(few, 30.0, 2, 3);
  ASSERT_TRUE(few.sensitivity.has_value());
  const Sensitivity& v = *few.sensitivity;
  EXPECT_EQ(v.stride, 4);
  EXPECT_FALSE(v.stride_assumed);
  EXPECT_EQ(v.examples, 10);
  EXPECT_LT(v.power, 0.8);
  EXPECT_GT(v.power, 0.0);
  EXPECT_FALSE(v.ruled_out);
  EXPECT_GT(v.examples_needed, 10);
  EXPECT_LE(v.examples_needed, 640);
  const Verdict verdict = phase_verdict(few);
  EXPECT_EQ(verdict.kind, VerdictKind::kInconclusive);
  EXPECT_EQ(verdict.text().rfind("inconclusive at 30 pp: no period found (p = ", 0), 0u)
      << verdict.text();
  EXPECT_CONTAINS(verdict.detail,
                  fmt::format("about {} examples per phase would detect it", v.examples_needed))
      << verdict.text();
  const PhaseSummary back = PhaseSummary::from_json(few.to_json());
  ASSERT_TRUE(back.sensitivity.has_value());
  EXPECT_EQ(back.sensitivity->examples_needed, v.examples_needed);
  EXPECT_DOUBLE_EQ(back.sensitivity->power, v.power);

  PhaseSummary many = flat_sweep(400);
  attach_sensitivity(many, 30.0, 2, 3);
  ASSERT_TRUE(many.sensitivity.has_value());
  EXPECT_TRUE(many.sensitivity->ruled_out) << many.gap_ci_pp.hi;
  EXPECT_EQ(many.sensitivity->examples_needed, 0);  // not searched: the gap is ruled out
  EXPECT_EQ(phase_verdict(many).kind, VerdictKind::kNoPeriodDetected);
  // Off, and an unknown stride simulated at M/2.
  PhaseSummary off = flat_sweep(10);
  attach_sensitivity(off, 0.0, 2);
  EXPECT_FALSE(off.sensitivity.has_value());
  off.stride = 0;
  attach_sensitivity(off, 30.0, 2);
  EXPECT_TRUE(off.sensitivity->stride_assumed);
  EXPECT_EQ(off.sensitivity->stride, 4);
}

}  // namespace
}  // namespace phasekv
