// Phase statistics: per-phase accuracy, gaps, periodicity and their uncertainty.
//
// A phase sweep evaluates every logical example at every phase r in [0, M) (M = the modulus, a
// multiple of the stride S). The outcomes of one example are therefore correlated (an easy example
// is easy at every phase), so every resampling procedure here works on whole examples: the
// bootstrap resamples examples, the permutation test shuffles phase labels within an example.
// Accuracies are fractions in [0, 1]; fields and keys ending in _pp are percentage points.
//
// Plain C++20 + nlohmann::json on purpose: no libtorch, so this layer compiles in seconds and the
// CLI can summarise results without loading a model.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

namespace phasekv {

// One scored evaluation: logical example `example_id` evaluated with its target at phase `phase`.
struct PhaseOutcome {
  int64_t example_id;
  int phase;  // in [0, modulus)
  bool correct;
};

struct Interval {
  double lo = 0.0;
  double hi = 0.0;
};
using WilsonInterval = Interval;

// Wilson score interval for a binomial proportion (z = 1.959964: 95 %). n == 0 gives [0, 1].
WilsonInterval wilson(int64_t successes, int64_t n, double z = 1.959964);

// P(X >= x) for X ~ chi-square(df), via the regularized upper incomplete gamma Q(df/2, x/2).
double chi_square_sf(double x, double df);
// log10 of chi_square_sf, finite even where the survival function underflows a double
// (strong phase effects give statistics in the thousands).
double chi_square_log10_sf(double x, double df);

struct PhaseRow {
  int r = 0;
  int64_t n = 0;
  int64_t successes = 0;
  double acc = 0.0;
  double ci_lo = 0.0;  // Wilson 95 %
  double ci_hi = 0.0;
};

// Per-phase counts, accuracy and Wilson interval for r in [0, modulus). Throws phasekv::Error on a
// phase outside [0, modulus) or a phase without any outcome.
std::vector<PhaseRow> phase_table(const std::vector<PhaseOutcome>& outcomes, int modulus);

struct ChiSquareTest {
  double statistic = 0.0;
  int df = 0;
  double p_value = 1.0;
};

// Pearson chi-square test of homogeneity of accuracy across the rows (a 2 x M table). It treats
// outcomes as independent, which the same-example design violates (usually making it
// conservative); the permutation p-value of detect_period is the one to trust.
ChiSquareTest chi_square_homogeneity(const std::vector<PhaseRow>& rows);

// Mean over r in [0, M - period) of |A(r) - A(r + period)| (a fraction). Near zero when the
// profile repeats with that period. nullopt unless 0 < period < M.
std::optional<double> periodicity_check(const std::vector<double>& acc, int period);

// Evidence for one candidate period P (a divisor of M): outcomes pooled by r mod P and tested
// for homogeneity with the likelihood-ratio statistic G2 on P - 1 degrees of freedom.
struct PeriodScore {
  int period = 0;
  double g2 = 0.0;
  int df = 0;
  double score = 0.0;  // -log10 of the chi-square p-value of g2: comparable across df
};

struct PeriodDetection {
  int detected = 0;        // 0: no candidate period (M has no divisor in [2, M/2])
  double statistic = 0.0;  // max score over candidates, the permutation test's statistic
  double p_value = 1.0;    // permutation p-value of `statistic`
  int permutations = 0;
  std::vector<PeriodScore> by_period;  // ascending period
};

// Blind period detection over candidates P in [2, M/2] that divide M (a phase r = p mod M only
// determines p mod P when P divides M). The highest-scoring period is reduced to its smallest
// divisor that fits not significantly worse (nested G2 test, alpha 0.05): a period-4 profile is
// also periodic with period 8, and the report should say 4. The p-value comes from permuting
// each example's outcomes across its phases (valid under the null of no phase effect even
// though outcomes within an example are correlated): p = (1 + #{perm >= obs}) / (1 + n_perm).
PeriodDetection detect_period(const std::vector<PhaseOutcome>& outcomes, int modulus,
                              int permutations = 1000, uint64_t seed = 12345);

struct SummaryOptions {
  int bootstrap_reps = 2000;
  int permutations = 1000;
  uint64_t seed = 12345;
};

// Phases split by the stride S: a target at r mod S == S - 1 has its value token in the next
// compressed entry (boundary); the others are interior. The study stresses that interior phases
// still differ, so the interior gap is reported on its own.
struct StrideSplit {
  std::vector<int> interior_phases;
  std::vector<int> boundary_phases;
  double interior_mean_acc = 0.0;
  int interior_best_phase = 0;
  int interior_worst_phase = 0;
  double interior_worst_acc = 0.0;
  double interior_gap_pp = 0.0;
  Interval interior_gap_ci_pp;
  double boundary_acc = 0.0;  // mean over boundary phases
  int boundary_worst_phase = 0;
  double boundary_worst_acc = 0.0;
};

struct PhaseSummary {
  int modulus = 0;
  int stride = 0;  // 0: unknown
  int64_t examples = 0;
  int64_t outcomes = 0;
  std::vector<PhaseRow> phases;
  double mean_acc = 0.0;  // unweighted mean over phases
  int best_phase = 0;     // lowest r among ties
  double best_acc = 0.0;
  int worst_phase = 0;  // lowest r among ties
  double worst_acc = 0.0;
  Interval worst_acc_ci;                       // cluster bootstrap, fraction
  double gap_pp = 0.0;                         // best_acc - worst_acc
  Interval gap_ci_pp;                          // cluster bootstrap, percentile
  std::optional<StrideSplit> split;            // stride >= 2
  std::optional<double> periodicity_check_pp;  // with period = stride, 0 < stride < modulus
  ChiSquareTest chi_square;
  PeriodDetection period;
  SummaryOptions options;

  nlohmann::json to_json() const;
  // Reads what to_json wrote (e.g. summary.json files for `phasekv compare`). Throws
  // phasekv::Error naming the missing or mistyped key.
  static PhaseSummary from_json(const nlohmann::json& j);
};

// Everything above for one sweep. stride = 0 when unknown (no interior/boundary split). Throws
// phasekv::Error on empty input, a phase outside [0, modulus), a phase without outcomes, or a
// stride that does not divide the modulus.
PhaseSummary summarize(const std::vector<PhaseOutcome>& outcomes, int modulus, int stride,
                       const SummaryOptions& options = {});

}  // namespace phasekv
