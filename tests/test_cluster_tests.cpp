// The cluster-respecting tests (src/eval/cluster_tests.h) on simulated sweeps with known truth:
// the error rates they were built for (issue 42, docs/STATISTICS.md), in small versions.
#include <gtest/gtest.h>

#include "eval/calibrate.h"
#include "eval/cluster_tests.h"
#include "eval/stats.h"

namespace phasekv {
namespace {

calibrate::Setting setting(int M, int S, double replica, calibrate::Profile profile, double top,
                           double gap, int n) {
  calibrate::Setting s;
  s.modulus = M, s.stride = S, s.stride_given = M % S == 0 ? S : 0, s.replica = replica;
  s.profile = profile, s.top = top, s.gap = gap, s.examples = n;
  return s;
}

std::vector<PhaseOutcome> sweep(const calibrate::Setting& s, uint64_t seed) {
  return calibrate::simulate(s, calibrate::true_profile(s), seed);
}

TEST(ClusterTests, SidakCriticalValues) {
  EXPECT_NEAR(sidak_z(1), 1.959964, 1e-5);
  EXPECT_NEAR(sidak_z(24), 3.0708, 1e-3);  // 1 - 0.95^(1/24) = 0.002135 two-sided
  EXPECT_NEAR(normal_quantile(0.975), 1.959964, 1e-6);
}

TEST(ClusterTests, StridesThatDoNotDivideTheModulusAreFoundFromKeyPositions) {
  // Stride 5 and 7 at the blind audit's M = 24: with key positions every P in [2, 12] is a
  // candidate, and the detected period is the stride (the divisors-only search said 12).
  for (int S : {5, 7}) {
    const auto s = setting(24, S, 0.0, calibrate::Profile::boundary, 0.9, 0.5, 100);
    SummaryOptions o{0, 199, 3};
    o.period_bootstrap = 20;
    const PeriodDetection d = detect_period(sweep(s, 40 + S), 24, o);
    EXPECT_TRUE(d.positions_known);
    EXPECT_EQ(d.by_period.size(), 11u);  // 2..12
    EXPECT_EQ(d.detected, S);
    EXPECT_LT(d.p_value, 0.01);
    EXPECT_GT(d.detected_support(), 0.5);  // 20 resamples; a multiple (10, 14) takes the rest
  }
  // Without positions the same data can only be folded by divisors of 24.
  auto outcomes = sweep(setting(24, 5, 0.0, calibrate::Profile::boundary, 0.9, 0.5, 100), 45);
  for (auto& o : outcomes) o.key_pos = -1;
  const PeriodDetection blind = detect_period(outcomes, 24, 99, 1);
  EXPECT_FALSE(blind.positions_known);
  EXPECT_EQ(blind.by_period.size(), 6u);
}

TEST(ClusterTests, SmallPValuesAreResolvedByMoreFlips) {
  const auto s = setting(24, 8, 0.0, calibrate::Profile::boundary, 0.9, 0.5, 100);
  SummaryOptions o{0, 200, 5};
  o.max_permutations = 5000;
  o.period_bootstrap = 0;
  const PeriodDetection d = detect_period(sweep(s, 7), 24, o);
  EXPECT_EQ(d.permutations, 5000);  // no flip reached it: the flips went on to the cap
  EXPECT_NEAR(d.p_value, 1.0 / 5001, 1e-12);
  // A null dataset stops after the first batch (enough flips exceeded the statistic).
  const auto null = setting(24, 8, 0.0, calibrate::Profile::flat, 0.5, 0.0, 100);
  const PeriodDetection n = detect_period(sweep(null, 8), 24, o);
  if (n.p_value > 0.1) {
    EXPECT_EQ(n.permutations, 200);
  }
}

TEST(ClusterTests, GapIntervalContainsItsEstimateAndCoversTheTruth) {
  // A flat model (true gap 0) and a 20 pp boundary dip, 60 datasets each: the simultaneous
  // interval holds the observed gap every time and the true gap at least ~95 % of the time.
  for (double gap : {0.0, 0.2}) {
    const auto s =
        setting(24, 8, 0.0, gap > 0 ? calibrate::Profile::boundary : calibrate::Profile::flat,
                0.5 + gap / 2, gap, 100);
    int covered = 0;
    double observed = 0, corrected = 0, null = 0;
    for (uint64_t seed = 0; seed < 60; ++seed) {
      SummaryOptions o{100, 99, seed};
      o.max_permutations = 99;
      o.period_bootstrap = 0;
      const PhaseSummary sum = summarize(sweep(s, 500 + seed), 24, 8, o);
      EXPECT_LE(sum.gap_ci_pp.lo, sum.gap_pp + 1e-9);
      EXPECT_GE(sum.gap_ci_pp.hi, sum.gap_pp - 1e-9);
      covered += sum.gap_ci_pp.lo <= 100 * gap + 1e-9 && 100 * gap <= sum.gap_ci_pp.hi + 1e-9;
      observed += sum.gap_pp / 60, corrected += sum.gap_bc_pp / 60, null += sum.null_gap_pp / 60;
    }
    EXPECT_GE(covered, 55) << "true gap " << 100 * gap;
    // The bias correction moves the mean toward the truth; the null gap explains a flat model.
    EXPECT_LT(std::abs(corrected - 100 * gap), std::abs(observed - 100 * gap));
    if (gap == 0.0) {
      EXPECT_NEAR(null, observed, 0.2 * observed);
    }
  }
}

TEST(ClusterTests, APhaseAtCeilingStillGetsAnInterval) {
  // Every outcome correct: the gap is 0 but the data cannot exclude a phase at 97 %.
  std::vector<PhaseOutcome> outcomes;
  for (int e = 0; e < 100; ++e)
    for (int r = 0; r < 8; ++r) outcomes.push_back({e, r, true});
  const PhaseSummary s = summarize(outcomes, 8, 4, {50, 50, 1});
  EXPECT_DOUBLE_EQ(s.gap_pp, 0.0);
  EXPECT_DOUBLE_EQ(s.gap_ci_pp.lo, 0.0);
  EXPECT_GT(s.gap_ci_pp.hi, 1.0);
  EXPECT_LT(s.gap_ci_pp.hi, 10.0);
  EXPECT_LT(s.worst_acc_ci.lo, 0.98);
}

TEST(ClusterTests, PeriodEqualsStrideTestSeparatesStrideFromWidth) {
  // A period-4 profile at M = 24: "period = 4" is supported; "period = 3" is not (its fold is
  // flat or its residual is not).
  const auto s = setting(24, 4, 0.0, calibrate::Profile::boundary, 0.9, 0.4, 150);
  const auto outcomes = sweep(s, 77);
  SummaryOptions o{0, 199, 2};
  o.period_bootstrap = 0;
  const PhaseSummary four = summarize(outcomes, 24, 4, o);
  ASSERT_TRUE(four.stride_test.has_value());
  EXPECT_TRUE(four.stride_test->supported());
  const PhaseSummary three = summarize(outcomes, 24, 3, o);
  EXPECT_FALSE(three.stride_test->supported());
  EXPECT_LT(three.stride_test->residual.p_value, 0.05);
}

}  // namespace
}  // namespace phasekv
