// Statistics layer: known values for the closed-form pieces, seeded synthetic sweeps for the
// resampling ones (a period that must be found, a flat profile that must not produce one).
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "eval/stats.h"
#include "test_util.h"
#include "util/error.h"

namespace phasekv {
namespace {

const auto simulate = test::simulate_outcomes;

// Period-4 weak spot at phase 3 (mod 4), folded mod `modulus`.
std::vector<double> period4_profile(int modulus) {
  std::vector<double> p(modulus);
  for (int r = 0; r < modulus; ++r) p[r] = (r % 4 == 3) ? 0.60 : 0.95;
  return p;
}

TEST(Wilson, KnownValues) {
  const WilsonInterval a = wilson(8, 10);
  EXPECT_NEAR(a.lo, 0.4902, 1e-4);
  EXPECT_NEAR(a.hi, 0.9433, 1e-4);
  const WilsonInterval b = wilson(0, 10);
  EXPECT_DOUBLE_EQ(b.lo, 0.0);
  EXPECT_NEAR(b.hi, 0.2775, 1e-4);
  const WilsonInterval c = wilson(10, 10);
  EXPECT_NEAR(c.lo, 0.7225, 1e-4);
  EXPECT_DOUBLE_EQ(c.hi, 1.0);
  const WilsonInterval d = wilson(50, 100);  // symmetric around 0.5
  EXPECT_NEAR(d.lo, 0.4038, 1e-4);
  EXPECT_NEAR(d.hi, 0.5962, 1e-4);
  const WilsonInterval none = wilson(0, 0);
  EXPECT_DOUBLE_EQ(none.lo, 0.0);
  EXPECT_DOUBLE_EQ(none.hi, 1.0);
  EXPECT_THROW(wilson(11, 10), Error);
}

TEST(ChiSquare, SurvivalKnownValues) {
  EXPECT_NEAR(chi_square_sf(7.815, 3), 0.05, 1e-4);
  EXPECT_NEAR(chi_square_sf(3.841459, 1), 0.05, 1e-6);
  EXPECT_NEAR(chi_square_sf(4.0, 2), std::exp(-2.0), 1e-12);  // df 2: exp(-x/2)
  EXPECT_NEAR(chi_square_sf(0.5, 4), 0.97350098, 1e-7);       // series branch (x < a + 1)
  EXPECT_NEAR(chi_square_sf(18.307, 10), 0.05, 1e-4);
  EXPECT_DOUBLE_EQ(chi_square_sf(0.0, 5), 1.0);
  // Far tail: the log stays exact where the value underflows (df 2: log10 sf = -x / (2 ln 10)).
  EXPECT_NEAR(chi_square_log10_sf(4000.0, 2), -4000.0 / (2.0 * std::log(10.0)), 1e-6);
  EXPECT_EQ(chi_square_sf(4000.0, 2), 0.0);
}

TEST(ChiSquare, HomogeneityAgainstHandComputed) {
  // 2 x 2 table: 30/50 vs 20/50; pooled 0.5: X2 = 2 * 25 / 12.5 = 4, df 1.
  std::vector<PhaseRow> rows = {{0, 50, 30, 0.6, 0, 0}, {1, 50, 20, 0.4, 0, 0}};
  const ChiSquareTest t = chi_square_homogeneity(rows);
  EXPECT_NEAR(t.statistic, 4.0, 1e-12);
  EXPECT_EQ(t.df, 1);
  EXPECT_NEAR(t.p_value, 0.0455003, 1e-6);
  // No variation at all: statistic 0, p 1.
  rows = {{0, 10, 10, 1.0, 0, 0}, {1, 10, 10, 1.0, 0, 0}};
  EXPECT_DOUBLE_EQ(chi_square_homogeneity(rows).p_value, 1.0);
}

TEST(PhaseTable, CountsAndValidation) {
  const std::vector<PhaseOutcome> o = {{1, 0, true}, {1, 1, false}, {2, 0, true}, {2, 1, true}};
  const std::vector<PhaseRow> rows = phase_table(o, 2);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].n, 2);
  EXPECT_DOUBLE_EQ(rows[0].acc, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].acc, 0.5);
  EXPECT_NEAR(rows[1].ci_lo, wilson(1, 2).lo, 1e-15);
  EXPECT_THROW(phase_table({{1, 2, true}}, 2), Error);                    // phase out of range
  EXPECT_THROW(phase_table({{1, 0, true}}, 2), Error);                    // phase 1 missing
  EXPECT_THROW(summarize(simulate({0.5, 0.5, 0.5}, 5, 1), 3, 2), Error);  // stride !| modulus
}

TEST(PeriodicityCheck, Values) {
  const std::vector<double> a = {0.9, 0.9, 0.9, 0.6, 0.9, 0.9, 0.9, 0.6};
  EXPECT_NEAR(*periodicity_check(a, 4), 0.0, 1e-15);
  EXPECT_NEAR(*periodicity_check(a, 2), 0.15, 1e-12);  // r = 1, 3, 5 differ by 0.3, of 6
  EXPECT_FALSE(periodicity_check(a, 8).has_value());
  EXPECT_FALSE(periodicity_check(a, 0).has_value());
}

TEST(Summary, Period4SignalModulus8) {
  const auto outcomes = simulate(period4_profile(8), 300, 7);
  const PhaseSummary s = summarize(outcomes, 8, 4);
  EXPECT_EQ(s.period.detected, 4);
  EXPECT_LT(s.period.p_value, 0.01);
  EXPECT_EQ(s.examples, 300);
  EXPECT_EQ(s.outcomes, 2400);
  EXPECT_TRUE(s.worst_phase == 3 || s.worst_phase == 7);
  // True gap 35 pp; the cluster-bootstrap interval must be well away from 0 and cover it.
  EXPECT_GT(s.gap_ci_pp.lo, 20.0);
  EXPECT_LT(s.gap_ci_pp.lo, s.gap_pp);
  EXPECT_GT(s.gap_ci_pp.hi, s.gap_pp);
  EXPECT_LT(s.gap_ci_pp.lo, 35.0);
  EXPECT_GT(s.gap_ci_pp.hi, 35.0);
  EXPECT_LT(s.worst_acc_ci.lo, s.worst_acc);
  EXPECT_GT(s.worst_acc_ci.hi, s.worst_acc);
  EXPECT_LT(s.chi_square.p_value, 1e-10);
  EXPECT_EQ(s.chi_square.df, 7);
  // Stride split: boundary phases are 3 and 7, near 0.60; interior near 0.95 and nearly flat.
  ASSERT_TRUE(s.split.has_value());
  EXPECT_EQ(s.split->boundary_phases, (std::vector<int>{3, 7}));
  EXPECT_EQ(s.split->interior_phases, (std::vector<int>{0, 1, 2, 4, 5, 6}));
  EXPECT_NEAR(s.split->boundary_acc, 0.60, 0.05);
  EXPECT_NEAR(s.split->interior_mean_acc, 0.95, 0.02);
  EXPECT_LT(s.split->interior_gap_pp, 8.0);
  EXPECT_LE(s.split->interior_gap_ci_pp.lo, s.split->interior_gap_pp);
  EXPECT_GE(s.split->interior_gap_ci_pp.hi, s.split->interior_gap_pp);
  // The interior phases are flat here, and the profile folded mod the stride is not.
  EXPECT_GE(s.split->interior_test.p_value, 0.01);
  ASSERT_TRUE(s.stride_test.has_value());
  EXPECT_LT(s.stride_test->component.p_value, 0.001);
  // The profile repeats with the stride: A(r) vs A(r + 4) differ by sampling noise only.
  ASSERT_TRUE(s.periodicity_check_pp.has_value());
  EXPECT_LT(*s.periodicity_check_pp, 5.0);
}

TEST(Summary, SmallestPeriodWinsOverItsMultiples) {
  // Modulus 24 offers 8 and 12 as multiples of the true period 4.
  const PeriodDetection d4 = detect_period(simulate(period4_profile(24), 300, 11), 24, 200, 1);
  EXPECT_EQ(d4.detected, 4);
  EXPECT_LT(d4.p_value, 0.01);
  ASSERT_EQ(d4.by_period.size(), 6u);  // 2, 3, 4, 6, 8, 12
  EXPECT_EQ(d4.by_period[2].period, 4);
  EXPECT_EQ(d4.by_period[2].df, 3);

  const std::vector<double> shape6 = {0.90, 0.85, 0.80, 0.90, 0.95, 0.55};
  std::vector<double> profile6(24);
  for (int r = 0; r < 24; ++r) profile6[r] = shape6[r % 6];
  const PeriodDetection d6 = detect_period(simulate(profile6, 300, 5), 24, 200, 2);
  EXPECT_EQ(d6.detected, 6);
  EXPECT_LT(d6.p_value, 0.01);

  std::vector<double> profile2(8);
  for (int r = 0; r < 8; ++r) profile2[r] = r % 2 ? 0.7 : 0.9;
  EXPECT_EQ(detect_period(simulate(profile2, 300, 9), 8, 200, 3).detected, 2);
}

// M = 24: 90 % except phases r mod 8 == 3 (a) and 7 (b).
std::vector<double> mod8_profile(double a, double b) {
  std::vector<double> acc(24);
  for (int r = 0; r < 24; ++r) acc[r] = r % 8 == 3 ? a : r % 8 == 7 ? b : 0.9;
  return acc;
}

TEST(Summary, ParsimonyReducesToSmallestAdequatePeriod) {
  // 0.60 vs 0.58: period 8 may score as high as 4, but its extra structure over period 4 is not
  // significant, so the weak spot every 4 phases is reported as 4.
  const PeriodDetection weak = detect_period(simulate(mod8_profile(0.60, 0.58), 400, 3), 24, 0, 1);
  ASSERT_EQ(weak.by_period.size(), 6u);
  EXPECT_EQ(weak.by_period[4].period, 8);
  EXPECT_EQ(weak.detected, 4);
  // 0.60 vs 0.20: the difference between phases 3 and 7 mod 8 is real; period 8 stands.
  EXPECT_EQ(detect_period(simulate(mod8_profile(0.60, 0.20), 400, 4), 24, 0, 1).detected, 8);
}

TEST(Summary, FlatSignalIsNotSignificant) {
  const auto outcomes = simulate(std::vector<double>(8, 0.80), 300, 3);
  const PhaseSummary s = summarize(outcomes, 8, 4);
  EXPECT_GE(s.period.p_value, 0.05);
  EXPECT_GT(s.chi_square.p_value, 0.05);
  EXPECT_NEAR(s.mean_acc, 0.80, 0.03);
}

TEST(Summary, PermutationTestIsCalibratedUnderTheNull) {
  // 40 seeded null data sets: about 5 % should reach p < 0.05, and p should be spread over
  // [0, 1] (an overly conservative test would pile up near 1).
  constexpr int kSets = 40;
  int rejections = 0, below_half = 0;
  for (int seed = 0; seed < kSets; ++seed) {
    const auto outcomes = simulate(std::vector<double>(8, 0.80), 200, 1000 + seed);
    const double p = detect_period(outcomes, 8, 199, seed).p_value;
    rejections += p < 0.05;
    below_half += p < 0.5;
  }
  EXPECT_LE(rejections, kSets / 10);
  EXPECT_GE(below_half, kSets / 4);
  EXPECT_LE(below_half, 3 * kSets / 4);
}

TEST(Summary, ExampleDifficultyIsNotAPhaseEffect) {
  // Half the examples always right, half always wrong: within-example shuffles change nothing,
  // so every permutation reproduces the observed (zero) statistic and p = 1.
  std::vector<PhaseOutcome> outcomes;
  for (int e = 0; e < 50; ++e) {
    for (int r = 0; r < 8; ++r) outcomes.push_back({e, r, e % 2 == 0});
  }
  const PhaseSummary s = summarize(outcomes, 8, 0, {200, 200, 1});
  EXPECT_DOUBLE_EQ(s.period.p_value, 1.0);
  EXPECT_DOUBLE_EQ(s.gap_pp, 0.0);
  EXPECT_FALSE(s.split.has_value());
  // Resampled examples keep all their phases, so every replicate is flat too.
  EXPECT_DOUBLE_EQ(s.gap_ci_pp.lo, 0.0);
  EXPECT_DOUBLE_EQ(s.gap_ci_pp.hi, 0.0);
  // Example difficulty moves every phase together: the worst-phase interval reflects it.
  EXPECT_LT(s.worst_acc_ci.lo, 0.40);
  EXPECT_GT(s.worst_acc_ci.hi, 0.60);
}

TEST(Summary, SeededAndReproducible) {
  const auto outcomes = simulate(period4_profile(8), 100, 21);
  const SummaryOptions opt{300, 100, 99};
  const PhaseSummary a = summarize(outcomes, 8, 4, opt);
  const PhaseSummary b = summarize(outcomes, 8, 4, opt);
  EXPECT_EQ(a.gap_ci_pp.lo, b.gap_ci_pp.lo);
  EXPECT_EQ(a.gap_ci_pp.hi, b.gap_ci_pp.hi);
  EXPECT_EQ(a.period.p_value, b.period.p_value);
  EXPECT_EQ(a.gap_bc_pp, b.gap_bc_pp);
  EXPECT_EQ(a.null_gap_pp, b.null_gap_pp);
  const PhaseSummary c = summarize(outcomes, 8, 4, {300, 100, 100});
  EXPECT_NE(a.gap_bc_pp, c.gap_bc_pp);        // another seed: other bootstrap replicates
  EXPECT_EQ(a.gap_ci_pp.lo, c.gap_ci_pp.lo);  // the simultaneous bands need no resampling
}

TEST(Summary, JsonKeysAndRoundTrip) {
  const PhaseSummary s = summarize(simulate(period4_profile(8), 100, 4), 8, 4, {200, 100, 5});
  const nlohmann::json j = s.to_json();
  for (const char* key :
       {"mean_acc", "phases", "gap_pp", "gap_ci_pp", "worst_phase", "best_phase", "period",
        "modulus", "examples", "stride", "interior", "boundary", "periodicity_check", "chi_square",
        "gap_bc_pp", "null_gap_pp", "stride_test", "gap_ci_method"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_EQ(j["phases"].size(), 8u);
  EXPECT_EQ(j["phases"][3]["phase"], 3);
  for (const char* key : {"n", "acc", "ci_lo", "ci_hi"}) EXPECT_TRUE(j["phases"][0].contains(key));
  EXPECT_EQ(j["gap_ci_pp"].size(), 2u);
  EXPECT_EQ(j["period"]["detected"], 4);
  EXPECT_EQ(j["period"]["by_period"].size(), 2u);
  EXPECT_NEAR(j["gap_pp"].get<double>(), 100.0 * (s.best_acc - s.worst_acc), 1e-9);
  EXPECT_EQ(j["boundary"]["phases"], nlohmann::json::array({3, 7}));
  EXPECT_EQ(j["chi_square"]["df"], 7);

  const PhaseSummary back = PhaseSummary::from_json(nlohmann::json::parse(j.dump()));
  EXPECT_EQ(back.to_json(), j);

  const PhaseSummary unknown = summarize(simulate({0.5, 0.6}, 20, 1), 2, 0, {50, 50, 1});
  const nlohmann::json u = unknown.to_json();
  EXPECT_TRUE(u["stride"].is_null());
  EXPECT_TRUE(u["interior"].is_null());
  EXPECT_TRUE(u["periodicity_check"].is_null());
  EXPECT_TRUE(u["period"]["detected"].is_null());  // modulus 2: no candidate period
  EXPECT_EQ(PhaseSummary::from_json(u).to_json(), u);

  nlohmann::json broken = j;
  broken.erase("gap_ci_pp");
  EXPECT_THROW(PhaseSummary::from_json(broken), Error);
}

}  // namespace
}  // namespace phasekv
