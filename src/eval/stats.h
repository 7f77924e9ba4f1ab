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
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace phasekv {

// One scored evaluation: logical example `example_id` evaluated with its target at phase `phase`.
struct PhaseOutcome {
  int64_t example_id;
  int phase;  // in [0, modulus)
  bool correct;
  // Absolute position of the target key (key_pos mod M == phase), -1 when unknown. With every
  // outcome's position known, periods that do not divide M can be tested (position mod P).
  int64_t key_pos = -1;
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

// Evidence for one candidate period P: each example's outcomes, less its own mean, averaged by
// key position mod P, and the P means compared (cluster_tests.h fold_stat: a chi-square-like
// statistic on P - 1 degrees of freedom).
struct PeriodScore {
  int period = 0;
  double statistic = 0.0;
  int df = 0;
  double score = 0.0;  // -log10 of the chi-square tail of `statistic`: comparable across df
};

struct PeriodDetection {
  int detected = 0;        // 0: no candidate period (M < 4)
  double statistic = 0.0;  // max score over candidates, the sign-flip test's statistic
  double p_value = 1.0;    // sign-flip p-value of `statistic` (adaptive: cluster_tests.h)
  int permutations = 0;    // sign flips run
  // Candidates are every P in [2, M/2] when all key positions are known (position mod P is
  // then known for any P); otherwise only the divisors of M (r = p mod M fixes p mod P only
  // when P divides M).
  bool positions_known = false;
  std::vector<PeriodScore> by_period;  // ascending period
  // Cluster-bootstrap support: the share of example resamples whose detected period is P
  // (empty when the bootstrap was off). How sure the data are of `detected`.
  std::map<int, double> support;
  double detected_support() const;
};

// The periods a design can tell apart: every P in [2, M/2] (two repetitions within one
// example's M phases) with key positions, the divisors of M in that range without.
std::vector<int> candidate_periods(int modulus, bool positions_known);

// Blind period detection over candidate_periods. The highest-scoring period is reduced to its
// smallest divisor that fits not significantly worse (nested test, alpha 0.05): a period-4
// profile is also periodic with period 8, and the report should say 4. The p-value comes from
// flipping the sign of whole examples' centred outcome vectors (cluster_tests.h), valid under
// "the population profile is flat" whatever the correlation between an example's phases:
// p = (1 + #{flip >= obs}) / (1 + flips), with more flips while p is small (up to
// max_permutations). period_bootstrap example resamples give `support`.
struct SummaryOptions {
  int bootstrap_reps = 2000;
  int permutations = 1000;
  uint64_t seed = 12345;
  int max_permutations = 20000;  // adaptive flips stop here (p >= 1 / 20001)
  int period_bootstrap = 200;    // resamples for PeriodDetection::support (0: off)
};
PeriodDetection detect_period(const std::vector<PhaseOutcome>& outcomes, int modulus,
                              const SummaryOptions& options);
// The same with fixed `permutations` flips and no support bootstrap.
PeriodDetection detect_period(const std::vector<PhaseOutcome>& outcomes, int modulus,
                              int permutations = 1000, uint64_t seed = 12345);

// A sign-flip test's result, as summary.json stores it.
struct FlipResult {
  double statistic = 0.0;
  double p_value = 1.0;
  int flips = 0;
};

// "The period is the stride S" (S known, 2 <= S <= M/2), as two sign-flip tests:
//  component: the profile folded mod S is not flat (there is S-periodic structure);
//  residual:  the profile deviates from its own S-periodic fit (structure that period S does
//             not explain).
// supported = component p < 0.05 and residual p >= 0.05.
struct StrideTest {
  int stride = 0;
  FlipResult component, residual;
  bool supported() const { return component.p_value < 0.05 && residual.p_value >= 0.05; }
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
  Interval interior_gap_ci_pp;  // simultaneous (Sidak) bands over the interior phases
  // Do the interior phases differ? Phases folded mod S, the boundary residue left out, tested by
  // sign flips of whole examples (respects clusters: an example's copies at r, r + S, ... are one
  // vector, not M/S independent outcomes). flips = 0: not tested (fewer than 2 interior residues).
  FlipResult interior_test;
  double boundary_acc = 0.0;  // mean over boundary phases
  int boundary_worst_phase = 0;
  double boundary_worst_acc = 0.0;
};

// What the examples of a sweep can detect, for the smallest gap the user names (--min-gap;
// eval/plan.h attach_sensitivity): the simulated power of the period test against a dip of
// min_gap_pp at the entry boundary every `stride` phases with this many examples, and whether the
// data rule such a gap out (the gap's simultaneous 95 % upper bound below it).
struct Sensitivity {
  double min_gap_pp = 0.0;
  int stride = 0;               // of the simulated dip
  bool stride_assumed = false;  // the sweep's stride is unknown: M/2, the hardest period to find
  double accuracy = 0.0;        // of the strong phases in the simulation (the observed mean)
  double icc = 0.0;             // within-example correlation assumed by the simulation
  int64_t examples = 0;         // per phase, as in the sweep
  double power = 0.0, power_se = 0.0;
  int datasets = 0;         // simulated sweeps behind `power`
  int examples_needed = 0;  // smallest examples per phase with power >= 0.8; 0: not reached
  bool ruled_out = false;   // gap_ci_pp.hi < min_gap_pp
  nlohmann::json to_json() const;
  static Sensitivity from_json(const nlohmann::json& j);
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
  Interval worst_acc_ci;  // Sidak-level Wilson bounds over the phases, fraction
  double gap_pp = 0.0;    // best_acc - worst_acc: biased upward (a max minus a min)
  // 95 % interval from simultaneous bands on the phase profile (cluster_tests.h gap_bands):
  // contains gap_pp by construction, covers the true gap at least 95 % (normal approximation).
  Interval gap_ci_pp;
  // Bootstrap bias-corrected gap: max(0, 2 gap - mean of the cluster-bootstrap gaps).
  double gap_bc_pp = 0.0;
  // The gap a flat profile shows with these examples (sign flips): mean and 95th percentile.
  // An observed gap near null_gap_pp is what no phase effect looks like.
  double null_gap_pp = 0.0;
  double null_gap_q95_pp = 0.0;
  std::optional<StrideSplit> split;            // stride >= 2
  std::optional<double> periodicity_check_pp;  // with period = stride, 0 < stride < modulus
  ChiSquareTest chi_square;
  PeriodDetection period;
  std::optional<StrideTest> stride_test;  // 2 <= stride <= modulus / 2
  SummaryOptions options;
  // Set by the command after summarize(), for the verdict (report.h phase_verdict) and the SLA
  // gate: what the outcomes alone cannot tell.
  //  planned_outcomes: the outcomes the run planned (items); more than `outcomes` means items
  //    failed or were never scored, and no verdict is given from the rest. 0: not known.
  //  shortcut: the accuracy reachable without reading keys (the task's shortcut ceiling); a
  //    model not above it at any phase does not do the task, and its phases say nothing.
  //  sensitivity: with --min-gap, what these examples can detect (the verdict says when a
  //    sweep that found nothing could not have found a gap of that size).
  int64_t planned_outcomes = 0;
  std::optional<double> shortcut;
  std::optional<Sensitivity> sensitivity;
  bool complete() const { return planned_outcomes <= outcomes; }
  // No phase's Wilson interval lies above the shortcut: the model is not shown to do the task.
  bool at_or_below_shortcut() const;

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

// Holm's step-down adjustment of a family of p-values (same order as given): controls the
// family-wise error rate at alpha when every adjusted p < alpha is called significant, under any
// dependence between the tests. NaN entries are left out of the family and stay NaN.
std::vector<double> holm_adjust(const std::vector<double>& p);

// ---------------------------------------------------------------------------------------------
// Paired comparisons, for the explanation analyses (src/explain): the same logical examples are
// scored at the same phases in a reference condition (the clean model, the unshifted gates) and
// in variants (a knockout, a gate shift). Every interval resamples whole logical examples, and
// the reference and the variant of one example are resampled together (a paired cluster
// bootstrap), so the shared difficulty of an example cancels out of the differences.

// One (example, phase) scored in the reference condition and in one variant.
struct PairedOutcome {
  int64_t example_id;
  int phase;  // in [0, modulus)
  bool reference;
  bool variant;
};

struct PairedPhaseRow {
  int r = 0;
  int64_t n = 0;
  double acc_reference = 0.0;
  double acc_variant = 0.0;
  double change_pp = 0.0;  // 100 (acc_variant - acc_reference)
  Interval change_ci_pp;
  // 100 (acc_variant - acc_reference) / acc_reference: the study's relative change. nullopt
  // (null in JSON) when the reference accuracy is 0.
  std::optional<double> rel_change_pct;
  Interval rel_change_ci_pct;  // replicates with a zero reference accuracy are left out
};

// How a variant's (knockout's) loss spreads over the phases folded mod `fold` (the stride S).
// The loss of folded phase q is its relative drop max(0, 1 - acc_variant(q) / acc_reference(q))
// (0 where acc_reference(q) = 0: nothing to lose); relative, so that a head that removes
// retrieval at every phase is phase-agnostic even where the clean model was already weak.
//   share    = (sum of the k largest losses) / (sum of all losses), k = min(2, fold - 1);
//              a phase-agnostic loss gives k / fold (`agnostic`), a loss at one phase 1.
//   index    = (share - agnostic) / (1 - agnostic), in [0, 1]: 0 agnostic, 1 one phase.
//   p_value  = permutation test of "the loss does not depend on the phase": each example's
//              (reference, variant) pairs are shuffled together across its phases;
//              p = (1 + #{index_perm >= index}) / (1 + permutations). This is the test to trust:
//              noise alone concentrates the positive parts of small drops, and the bootstrap
//              interval of the index shares that bias.
//   verdict  = "no effect" unless the mean drop's interval lies above 0; then "phase-specific"
//              when p < 0.05 and index >= kSpecificIndex, else "phase-agnostic". The size
//              threshold matters: a knockout that drops every phase to the same floor (chance)
//              loses relatively less where the clean model was weak, which the permutation test
//              detects with a tiny index (0.02 on the bundled model) that is no specialisation.
constexpr double kSpecificIndex = 0.25;  // S = 4: the two worst phases carry >= 62.5 %
struct Specialisation {
  int fold = 0;
  int k = 0;
  std::vector<double> loss;  // per folded phase, fractions
  double share = 0.0;        // NaN when no folded phase loses anything
  double agnostic = 0.0;
  double index = 0.0;  // NaN with share
  Interval index_ci;
  std::vector<int> worst_phases;  // the k folded phases with the largest loss, largest first
  double p_value = 1.0;
  int permutations = 0;
  std::string verdict;
};

struct PairedSummary {
  int modulus = 0;
  int fold = 0;
  int64_t examples = 0;
  std::vector<PairedPhaseRow> phases;
  double mean_drop_pp = 0.0;  // mean over phases of 100 (acc_reference - acc_variant)
  Interval mean_drop_ci_pp;
  Specialisation spec;
  nlohmann::json to_json() const;
};

// Throws phasekv::Error on empty input, a phase outside [0, modulus), a phase without pairs, or
// a fold that does not divide the modulus (fold = 0: the modulus).
PairedSummary summarize_paired(const std::vector<PairedOutcome>& pairs, int modulus, int fold,
                               const SummaryOptions& options = {});

// Gate cycling (W = S): the prediction A_D(r) = A_0((r - D) mod S), tested on accuracies folded
// mod S. Point (D, r) compares the observed change A_D(r) - A_0(r) with the predicted change
// A_0((r - D) mod S) - A_0(r). The headline R^2 leaves out the boundary phase r = S-1 (as the
// study does): its key and value sit in two entries, which no gate shift can mend, so it stays
// weak under every shift whatever the prediction says. A point whose prediction comes FROM the
// boundary (r = (S-1+D) mod S) stays in: it asks whether the boundary's weakness moves with the
// gates. R^2 over all points is reported beside it.
struct CyclePoint {
  int delta = 0;
  int r = 0;
  double reference_acc = 0.0;  // A_0(r)
  double observed_acc = 0.0;   // A_D(r)
  double predicted_acc = 0.0;  // A_0((r - D) mod S)
  double observed_change = 0.0, predicted_change = 0.0;
  bool boundary = false;  // r = S-1
};

struct CycleFit {
  int stride = 0;
  int64_t examples = 0;
  std::vector<int> deltas;
  std::vector<double> reference_acc;  // A_0 per folded phase
  std::vector<CyclePoint> points;     // delta-major, r ascending
  // 1 - SS_res / SS_tot over the points (NaN when the observed changes do not vary).
  double r2_interior = 0.0;
  Interval r2_interior_ci;
  int n_interior = 0;
  double r2_all = 0.0;
  Interval r2_all_ci;
  std::map<int, double> r2_interior_by_delta;  // NaN where a delta has < 2 interior points
  // Accuracy of the boundary phase S-1 for each delta (0 = unshifted): does it stay weak?
  std::map<int, double> boundary_acc;
  nlohmann::json to_json() const;
};

// reference: the unshifted outcomes; shifted[D]: the same examples and phases with the gates
// cycled by D. Throws phasekv::Error on empty input, a stride < 2 or one that does not divide the
// modulus, or a folded phase without outcomes.
CycleFit fit_cycle(const std::vector<PhaseOutcome>& reference,
                   const std::map<int, std::vector<PhaseOutcome>>& shifted, int modulus, int stride,
                   const SummaryOptions& options = {});

// 1 - sum (y - yhat)^2 / sum (y - mean y)^2; NaN with fewer than 2 points or no variation.
double r_squared(const std::vector<double>& observed, const std::vector<double>& predicted);

}  // namespace phasekv
