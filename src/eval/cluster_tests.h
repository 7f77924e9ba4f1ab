// Tests of the phase profile that treat each logical example as one cluster (docs/STATISTICS.md).
//
// A sweep scores every example at every phase, so one example's outcomes are not independent: an
// easy example is easy everywhere, and under prefix padding phases r and r + S see nearly the same
// input (its outcomes there are near copies). Everything here works on per-example vectors:
//   e_i(r) = y_i(r) - mean of y_i over the phases in the test   (the example's own level removed)
// and asks whether their mean profile has structure. The null distribution comes from flipping
// the sign of whole vectors e_i (a wild cluster bootstrap): under "the population profile is flat"
// E[e_i] = 0 whatever the correlation between an example's phases, so the flips keep replicas,
// difficulty and every other within-example structure, which a permutation of phases within an
// example does not (it assumed exchangeable phases and over-rejected 26-85 % on replica data).
//
// Plain C++ (no libtorch), like stats.h.
#pragma once
#include <cstdint>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

// Phi^-1(p) for p in (0, 1); -inf / +inf at 0 / 1.
double normal_quantile(double p);
// The two-sided critical value that covers k estimates simultaneously at level `level` when
// they are independent (Sidak): Phi^-1(1 - (1 - level^(1/k)) / 2). For correlated normal
// estimates it is conservative (Sidak's inequality), so it needs no resampling.
double sidak_z(int k, double level = 0.95);

// The outcomes as an examples x phases table (mean of duplicates; NaN where an example lacks a
// phase), with each cell's key position when every outcome carries one consistent with its
// phase (key_pos mod M == phase); otherwise positions are the phases themselves.
struct ClusterTable {
  int modulus = 0;
  int64_t n = 0;             // examples, in ascending example_id
  std::vector<double> y;     // n * modulus, row-major
  std::vector<int64_t> pos;  // n * modulus: key position of the cell
  bool positions_known = false;
  double at(int64_t i, int r) const { return y[i * modulus + r]; }
};
ClusterTable cluster_table(const std::vector<PhaseOutcome>& outcomes, int modulus);

// The cells of a table grouped into G groups (a group per label; -1 = left out) and reduced to one
// centred value per example and group: z_i(g) = mean over the example's cells of group g of
// (value - the example's mean over its included cells). NaN where an example has no cell there.
struct Folded {
  int groups = 0;
  int64_t n = 0;
  std::vector<double> z;  // n * groups
  // Mean cells per example in each group, and the mean over included cells of the centred value
  // squared: a scale common to every fold of one table (sign flips leave it unchanged).
  std::vector<double> cells;
  double cell_var = 0.0;
  double at(int64_t i, int g) const { return z[i * groups + g]; }
};
// labels[cell] in [-1, groups); values: n * modulus (the table's y, or residuals).
Folded fold_cells(const std::vector<double>& values, int64_t n, int modulus,
                  const std::vector<int>& labels, int groups);
// Labels for "key position mod P" (every cell) and for "phase mod S restricted to `keep`".
std::vector<int> labels_mod(const ClusterTable& t, int period);
std::vector<int> labels_folded_subset(const ClusterTable& t, int stride,
                                      const std::vector<int>& keep);

// The group means of a Folded under example weights (bootstrap multiplicities, default 1) and
// signs (+-1, default +1), and the statistic comparing them:
//   T = sum_g n_g c_g (m_g - mean_g m_g)^2 / cell_var,
// c_g the cells per example in group g: the pooled chi-square of the cells, on one scale for
// every fold of a table, so that a fold that explains more of the profile scores higher (a
// fold's own within-group variance would reward folds whose groups mix unlike phases). Near
// chi-square(G - 1) for independent cells; its p-values here come from sign flips, so it only
// has to rank; -log10 of its chi-square tail makes folds with different G comparable (`score`).
// vbar: the mean within-group variance of z_i(g), for reference.
struct FoldStat {
  std::vector<double> mean;  // m_g (NaN for a group without examples)
  std::vector<double> n;     // weighted examples per group
  double vbar = 0.0;
  double t = 0.0;
  int df = 0;
  double score = 0.0;
};
FoldStat fold_stat(const Folded& f, const std::vector<double>* weights = nullptr,
                   const std::vector<int8_t>* signs = nullptr);

// Does fold P reduce to fold D (D divides P, both of one table)? Per example the residual
// d_i(g) = z_P,i(g) - z_D,i(g mod D); sum over g of n_g mean(d(g))^2 / var(d(g)), a cluster-level
// test on P - D degrees of freedom (chi-square tail). weights: bootstrap multiplicities.
double nested_p(const Folded& p, const Folded& d, const std::vector<double>* weights = nullptr);

// A sign-flip p-value for the maximum score over several Folded (one per candidate period; one
// Folded is a plain test). Flips run in batches of `flips`; after a batch the test stops once
// kEnoughExceedances flipped maxima reached the observed one or `max_flips` flips ran, so a small
// p is resolved (down to 1 / (1 + max_flips)) without paying for it on null data.
// p = (1 + k) / (1 + flips run), valid for any stopping rule of this kind up to its resolution.
// With 2^n <= max_flips (n examples) every sign pattern is enumerated instead: p is exact, and
// never below 2 / 2^n.
struct FlipTest {
  double statistic = 0.0;  // the observed max score
  double p_value = 1.0;
  int flips = 0;
};
constexpr int kEnoughExceedances = 10;
FlipTest sign_flip_test(const std::vector<Folded>& folds, int flips, int max_flips, uint64_t seed);

// Simultaneous 95 % bands for the phase profile and what follows from them for the gap:
// band_r = d_r +- z se_r with d_r the mean of e_i(r) (the profile with example levels removed),
// se_r^2 = max(var_i e_i(r), floor_r) / n_r and z = sidak_z(number of phases). At a phase scored
// 0 % or 100 % the floor is half the binomial variance at the Agresti-Coull estimate
// (s_r + 2) / (n_r + 4), so it still gets a band; elsewhere it is 0. Then with 95 % probability
// (Sidak, normal approximation)
//   max_{a,b} (lo_a - hi_b) <= true gap <= max_{a,b} (hi_a - lo_b),
// an interval that always contains the observed gap. The worst phase's accuracy gets the
// analogous Sidak-level Wilson bounds [min_r lo_r, min_r hi_r].
struct GapBands {
  Interval gap_pp{0.0, 0.0};
  Interval worst_acc{0.0, 0.0};
  double z = 0.0;
};
GapBands gap_bands(const ClusterTable& t, const std::vector<int>& phases);

// The gap a flat profile shows with these examples: max - min of the sign-flipped mean profile
// (same examples, same within-example structure, no phase effect), `flips` times.
struct NullGap {
  double mean_pp = 0.0;
  double q95_pp = 0.0;
};
NullGap null_gap(const ClusterTable& t, int flips, uint64_t seed);

}  // namespace phasekv
