// The calibration study (eval/calibrate.h, docs/STATISTICS.md) in small: the period test's
// false-positive rate on exchangeable null data and under prefix-padding replicas (issue 42).
#include <gtest/gtest.h>

#include <cmath>

#include "eval/calibrate.h"
#include "report/calibration_page.h"
#include "test_util.h"

namespace phasekv::calibrate {
namespace {

Setting null_setting(double replica, int datasets) {
  Setting s;
  s.group = "null";
  s.modulus = 24, s.stride = 8, s.stride_given = 8;
  s.examples = 40, s.datasets = datasets;
  s.replica = replica;
  return s;
}

Options small_options() {
  Options o;
  o.permutations = 199;
  o.bootstrap_reps = 50;
  o.threads = 2;
  return o;
}

TEST(Calibration, ProfileAndSimulationHaveTheAskedMarginals) {
  Setting s = null_setting(0.95, 1);
  s.profile = Profile::boundary, s.top = 0.8, s.gap = 0.3, s.examples = 4000;
  const auto acc = true_profile(s);
  ASSERT_EQ(acc.size(), 24u);
  EXPECT_DOUBLE_EQ(acc[7], 0.5);
  EXPECT_DOUBLE_EQ(acc[8], 0.8);
  const auto out = simulate(s, acc, 7);
  ASSERT_EQ(out.size(), 24u * 4000u);
  std::vector<int> hits(24, 0);
  for (const auto& o : out) hits[o.phase] += o.correct;
  for (int r = 0; r < 24; ++r)  // 4000 draws: SE <= 0.008; 5 SE
    EXPECT_NEAR(hits[r] / 4000.0, acc[r], 0.04) << "phase " << r;
}

// Outcomes independent given the example are exchangeable across phases, so the permutation
// test is exact there: its rate must lie in the binomial 99.9 % band around 5 %.
TEST(Calibration, PeriodTestHoldsItsRateOnExchangeableNullData) {
  const int N = 300;
  const Result r = run_setting(null_setting(0.0, N), small_options(), 0);
  const double se = std::sqrt(0.05 * 0.95 / N);
  EXPECT_GT(r.period_reject.value(), 0.05 - 3.29 * se);
  EXPECT_LT(r.period_reject.value(), 0.05 + 3.29 * se);
}

// Under replicas (phase r + 8 copies phase r with probability 0.95) there is no population phase
// effect, but an example's outcomes depend on r mod 8. Tests that count those copies as
// independent (the folded chi-square) or treat phases as exchangeable (a within-example
// permutation) rejected 36-53 % of such datasets at M = 24; the sign flips of whole examples
// must hold the same 99.9 % binomial band as on exchangeable data.
TEST(Calibration, PeriodAndInteriorTestsHoldTheirRateUnderReplicas) {
  const int N = 300;
  const Result rep = run_setting(null_setting(0.95, N), small_options(), 1);
  const double se = std::sqrt(0.05 * 0.95 / N);
  ASSERT_EQ(rep.interior_reject.n, N);
  EXPECT_LT(rep.interior_reject.value(), 0.05 + 3.29 * se);
  EXPECT_LT(rep.period_reject.value(), 0.05 + 3.29 * se);
  EXPECT_GT(rep.period_reject.value(), 0.05 - 3.29 * se);
}

TEST(Calibration, QuickRunWritesAPage) {
  PageInputs in;
  in.options = small_options();
  in.quick = true;
  in.command = "phasekv calibrate --quick";
  in.out = "runs/calibrate";
  in.cpu = describe_cpu();
  int i = 0;
  for (auto s : default_settings(true)) {
    s.datasets = std::min(s.datasets, 40);
    in.results.push_back(run_setting(s, in.options, i++));
  }
  const std::string md = statistics_markdown(in);
  EXPECT_CONTAINS(md, "## Verdicts");
  EXPECT_CONTAINS(md, "| 5 | 24 | no |");
  EXPECT_EQ(results_json(in)["results"].size(), in.results.size());
}

}  // namespace
}  // namespace phasekv::calibrate
