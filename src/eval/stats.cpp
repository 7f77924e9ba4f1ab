#include "eval/stats.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <numeric>
#include <random>

#include "eval/cluster_tests.h"
#include "util/error.h"
#include "util/rng.h"

namespace phasekv {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// Significance level of the nested test that reduces a detected period to a divisor.
constexpr double kNestedAlpha = 0.05;

// ---------------------------------------------------------------------------------------------
// Incomplete gamma function (Numerical Recipes 6.2), in log space for the upper tail so that
// chi-square statistics in the thousands keep a finite, comparable log p-value.

constexpr int kGammaMaxIter = 10000;
constexpr double kGammaEps = 1e-15;

// Regularized lower P(a, x) by its power series; converges quickly for x < a + 1.
double gamma_p_series(double a, double x) {
  double ap = a;
  double del = 1.0 / a;
  double sum = del;
  for (int i = 0; i < kGammaMaxIter && std::abs(del) > std::abs(sum) * kGammaEps; ++i) {
    ap += 1.0;
    del *= x / ap;
    sum += del;
  }
  return sum * std::exp(-x + a * std::log(x) - std::lgamma(a));
}

// log of the regularized upper Q(a, x) by Lentz's continued fraction; converges for x >= a + 1.
double log_gamma_q_continued_fraction(double a, double x) {
  constexpr double kTiny = 1e-300;
  double b = x + 1.0 - a;
  double c = 1.0 / kTiny;
  double d = 1.0 / b;
  double h = d;
  for (int i = 1; i <= kGammaMaxIter; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < kTiny) d = kTiny;
    c = b + an / c;
    if (std::abs(c) < kTiny) c = kTiny;
    d = 1.0 / d;
    const double del = d * c;
    h *= del;
    if (std::abs(del - 1.0) < kGammaEps) break;
  }
  return -x + a * std::log(x) - std::lgamma(a) + std::log(h);
}

double log_gamma_q(double a, double x) {
  if (x <= 0.0) return 0.0;
  if (x < a + 1.0) return std::log1p(-gamma_p_series(a, x));
  return log_gamma_q_continued_fraction(a, x);
}

// ---------------------------------------------------------------------------------------------
// Outcomes grouped by logical example: the unit that the bootstrap resamples and within which
// the permutation test shuffles.

struct Example {
  std::vector<int> phases;
  std::vector<uint8_t> correct;
};

std::vector<Example> group_by_example(const std::vector<PhaseOutcome>& outcomes) {
  std::map<int64_t, size_t> index;  // ordered: results do not depend on hash iteration order
  std::vector<Example> examples;
  for (const PhaseOutcome& o : outcomes) {
    auto [it, inserted] = index.try_emplace(o.example_id, examples.size());
    if (inserted) examples.emplace_back();
    examples[it->second].phases.push_back(o.phase);
    examples[it->second].correct.push_back(o.correct ? 1 : 0);
  }
  return examples;
}

void check_phases(const std::vector<PhaseOutcome>& outcomes, int modulus) {
  if (modulus < 1) throw Error(fmt::format("phase modulus must be >= 1, got {}", modulus));
  if (outcomes.empty()) throw Error("no outcomes to summarise");
  for (const PhaseOutcome& o : outcomes) {
    if (o.phase < 0 || o.phase >= modulus) {
      throw Error(fmt::format("outcome of example {} has phase {}, outside [0, {})", o.example_id,
                              o.phase, modulus));
    }
  }
}

void check_stride(int modulus, int stride) {
  if (stride < 0) throw Error(fmt::format("stride must be >= 0 (0: unknown), got {}", stride));
  if (stride > 0 && modulus % stride != 0) {
    throw Error(fmt::format(
        "stride S={} must divide the phase modulus M={}: r = p mod M only determines p mod S then",
        stride, modulus));
  }
}

// Per-phase successes and trials; the accuracy of a phase without trials is NaN.
struct Counts {
  std::vector<int64_t> successes;
  std::vector<int64_t> trials;
  explicit Counts(int modulus) : successes(modulus, 0), trials(modulus, 0) {}
  void add(const Example& e) {
    for (size_t i = 0; i < e.phases.size(); ++i) {
      successes[e.phases[i]] += e.correct[i];
      trials[e.phases[i]] += 1;
    }
  }
  std::vector<double> accuracies() const {
    std::vector<double> acc(trials.size(), kNaN);
    for (size_t r = 0; r < trials.size(); ++r) {
      if (trials[r] > 0) acc[r] = static_cast<double>(successes[r]) / trials[r];
    }
    return acc;
  }
};

// ---------------------------------------------------------------------------------------------
// Best / worst over a subset of phases, skipping phases without data. Ties go to the lowest r so
// the result does not depend on floating-point noise in an otherwise symmetric profile.

struct Extremes {
  int best = -1;
  int worst = -1;
  double best_acc = kNaN;
  double worst_acc = kNaN;
  double gap() const { return best_acc - worst_acc; }
};

Extremes extremes(const std::vector<double>& acc, const std::vector<int>& phases) {
  Extremes e;
  for (int r : phases) {
    if (std::isnan(acc[r])) continue;
    if (e.best < 0 || acc[r] > e.best_acc) {
      e.best = r;
      e.best_acc = acc[r];
    }
    if (e.worst < 0 || acc[r] < e.worst_acc) {
      e.worst = r;
      e.worst_acc = acc[r];
    }
  }
  return e;
}

double mean_over(const std::vector<double>& acc, const std::vector<int>& phases) {
  double sum = 0.0;
  for (int r : phases) sum += acc[r];
  return phases.empty() ? kNaN : sum / static_cast<double>(phases.size());
}

std::vector<int> all_phases(int modulus) {
  std::vector<int> phases(modulus);
  std::iota(phases.begin(), phases.end(), 0);
  return phases;
}

// ---------------------------------------------------------------------------------------------
// Cluster bootstrap: resample whole examples with replacement so that the interval reflects
// between-example variation, which the phases of one example share.

// Percentile by linear interpolation between order statistics (R's type 7).
double quantile_sorted(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return kNaN;
  const double pos = q * static_cast<double>(sorted.size() - 1);
  const size_t lo = static_cast<size_t>(std::floor(pos));
  const size_t hi = std::min(lo + 1, sorted.size() - 1);
  return sorted[lo] + (pos - static_cast<double>(lo)) * (sorted[hi] - sorted[lo]);
}

Interval percentile_interval(std::vector<double> values, double scale = 1.0) {
  std::erase_if(values, [](double v) { return std::isnan(v); });
  std::sort(values.begin(), values.end());
  return {scale * quantile_sorted(values, 0.025), scale * quantile_sorted(values, 0.975)};
}

// The mean over example resamples of the gap: the bootstrap's estimate of E[gap], whose excess
// over the observed gap estimates the gap's upward bias (a max minus a min of noisy phases).
double mean_bootstrap_gap(const std::vector<Example>& examples, int modulus, int reps,
                          uint64_t seed) {
  if (reps <= 0) return kNaN;
  const std::vector<int> phases = all_phases(modulus);
  double sum = 0.0;
  int counted = 0;
  std::mt19937_64 rng(seed);
  for (int rep = 0; rep < reps; ++rep) {
    Counts counts(modulus);
    for (size_t i = 0; i < examples.size(); ++i)
      counts.add(examples[draw_below(rng, examples.size())]);
    const double gap = extremes(counts.accuracies(), phases).gap();
    if (!std::isnan(gap)) sum += gap, ++counted;
  }
  return counted ? sum / counted : kNaN;
}

// ---------------------------------------------------------------------------------------------
// Period detection: one Folded (cluster_tests.h) per candidate period, scored by fold_stat.

struct PeriodFolds {
  std::vector<int> periods;
  std::vector<Folded> folds;
};

PeriodFolds period_folds(const ClusterTable& t) {
  PeriodFolds out;
  out.periods = candidate_periods(t.modulus, t.positions_known);
  for (int P : out.periods)
    out.folds.push_back(fold_cells(t.y, t.n, t.modulus, labels_mod(t, P), P));
  return out;
}

// The argmax period, reduced to its smallest divisor whose fold is not significantly worse.
int parsimonious_period(const PeriodFolds& pf, const std::vector<FoldStat>& stats,
                        const std::vector<double>* weights = nullptr) {
  size_t best = 0;
  for (size_t k = 0; k < stats.size(); ++k)
    if (stats[k].score > stats[best].score) best = k;
  for (size_t k = 0; k < best; ++k) {  // ascending period: the first adequate divisor wins
    if (pf.periods[best] % pf.periods[k] != 0) continue;
    if (nested_p(pf.folds[best], pf.folds[k], weights) >= kNestedAlpha) return pf.periods[k];
  }
  return pf.periods[best];
}

int detected_with(const PeriodFolds& pf, const std::vector<double>* weights) {
  std::vector<FoldStat> stats;
  for (const Folded& f : pf.folds) stats.push_back(fold_stat(f, weights));
  return parsimonious_period(pf, stats, weights);
}

// How often an example resample detects each period.
std::map<int, double> period_support(const PeriodFolds& pf, int64_t n, int reps, uint64_t seed) {
  std::map<int, double> support;
  if (reps <= 0 || n == 0) return support;
  Rng rng(seed_for(seed, 0x5u));
  std::vector<double> weights(n);
  for (int rep = 0; rep < reps; ++rep) {
    std::fill(weights.begin(), weights.end(), 0.0);
    for (int64_t i = 0; i < n; ++i) weights[draw_below(rng, static_cast<uint64_t>(n))] += 1.0;
    support[detected_with(pf, &weights)] += 1.0 / reps;
  }
  return support;
}

PeriodDetection detect_period_table(const ClusterTable& t, const SummaryOptions& o) {
  PeriodDetection d;
  d.positions_known = t.positions_known;
  const PeriodFolds pf = period_folds(t);
  if (pf.periods.empty()) return d;
  std::vector<FoldStat> stats;
  for (size_t k = 0; k < pf.folds.size(); ++k) {
    stats.push_back(fold_stat(pf.folds[k]));
    d.by_period.push_back({pf.periods[k], stats.back().t, stats.back().df, stats.back().score});
  }
  d.detected = parsimonious_period(pf, stats);
  const FlipTest flips = sign_flip_test(pf.folds, o.permutations, o.max_permutations, o.seed);
  d.statistic = flips.statistic;
  d.p_value = flips.p_value;
  d.permutations = flips.flips;
  d.support = period_support(pf, t.n, o.period_bootstrap, o.seed);
  return d;
}

FlipResult flip_result(const FlipTest& f) {
  return {f.statistic, f.p_value, f.flips};
}

// The two tests of "the period is S" (stats.h StrideTest).
StrideTest stride_test(const ClusterTable& t, int S, const SummaryOptions& o) {
  StrideTest st;
  st.stride = S;
  const std::vector<int> labels = labels_mod(t, S);
  const Folded folded = fold_cells(t.y, t.n, t.modulus, labels, S);
  st.component = flip_result(
      sign_flip_test({folded}, o.permutations, o.max_permutations, seed_for(o.seed, 0x51u)));
  // Residuals from each example's own S-periodic fit: y - level - z(r mod S).
  std::vector<double> residual(t.y.size(), kNaN);
  std::vector<int> by_phase(t.y.size());
  for (int64_t i = 0; i < t.n; ++i) {
    double level = 0.0, cells = 0.0;
    for (int r = 0; r < t.modulus; ++r)
      if (!std::isnan(t.at(i, r))) level += t.at(i, r), cells += 1.0;
    for (int r = 0; r < t.modulus; ++r) {
      const size_t c = static_cast<size_t>(i) * t.modulus + r;
      by_phase[c] = r;
      const double z = folded.at(i, labels[c]);
      if (!std::isnan(t.y[c]) && !std::isnan(z)) residual[c] = t.y[c] - level / cells - z;
    }
  }
  const Folded rest = fold_cells(residual, t.n, t.modulus, by_phase, t.modulus);
  st.residual = flip_result(
      sign_flip_test({rest}, o.permutations, o.max_permutations, seed_for(o.seed, 0x52u)));
  return st;
}

FlipResult interior_test(const ClusterTable& t, int S, const SummaryOptions& o) {
  std::vector<int> keep(S - 1);
  std::iota(keep.begin(), keep.end(), 0);
  if (keep.size() < 2) return {};
  const Folded f = fold_cells(t.y, t.n, t.modulus, labels_folded_subset(t, S, keep), S - 1);
  return flip_result(
      sign_flip_test({f}, o.permutations, o.max_permutations, seed_for(o.seed, 0x1u)));
}

Counts count_outcomes(const std::vector<Example>& examples, int modulus) {
  Counts counts(modulus);
  for (const Example& e : examples) counts.add(e);
  return counts;
}

// ---------------------------------------------------------------------------------------------
// Summary pieces.

StrideSplit split_by_stride(const std::vector<double>& acc, int stride) {
  StrideSplit split;
  for (int r = 0; r < static_cast<int>(acc.size()); ++r) {
    (r % stride == stride - 1 ? split.boundary_phases : split.interior_phases).push_back(r);
  }
  const Extremes interior = extremes(acc, split.interior_phases);
  split.interior_mean_acc = mean_over(acc, split.interior_phases);
  split.interior_best_phase = interior.best;
  split.interior_worst_phase = interior.worst;
  split.interior_worst_acc = interior.worst_acc;
  split.interior_gap_pp = 100.0 * interior.gap();
  const Extremes boundary = extremes(acc, split.boundary_phases);
  split.boundary_acc = mean_over(acc, split.boundary_phases);
  split.boundary_worst_phase = boundary.worst;
  split.boundary_worst_acc = boundary.worst_acc;
  return split;
}

// ---------------------------------------------------------------------------------------------
// JSON helpers. NaN (e.g. a bootstrap that was switched off) is written as null by nlohmann and
// read back as NaN.

nlohmann::json interval_json(const Interval& i) {
  return nlohmann::json::array({i.lo, i.hi});
}

double number_or_nan(const nlohmann::json& j) {
  return j.is_null() ? kNaN : j.get<double>();
}

Interval interval_from(const nlohmann::json& j) {
  if (!j.is_array() || j.size() != 2) throw Error("expected [lo, hi], got " + j.dump());
  return {number_or_nan(j[0]), number_or_nan(j[1])};
}

const nlohmann::json& field(const nlohmann::json& j, const char* key) {
  if (!j.is_object() || !j.contains(key)) throw Error(fmt::format("missing key '{}'", key));
  return j[key];
}

nlohmann::json phases_json(const std::vector<PhaseRow>& rows) {
  nlohmann::json out = nlohmann::json::array();
  for (const PhaseRow& p : rows) {
    out.push_back({{"phase", p.r},
                   {"n", p.n},
                   {"successes", p.successes},
                   {"acc", p.acc},
                   {"ci_lo", p.ci_lo},
                   {"ci_hi", p.ci_hi}});
  }
  return out;
}

std::vector<PhaseRow> phases_from(const nlohmann::json& j) {
  std::vector<PhaseRow> rows;
  for (const nlohmann::json& p : j) {
    PhaseRow row;
    // "r" is how summaries written before the key was named "phase" spell it.
    row.r = field(p, p.contains("phase") ? "phase" : "r").get<int>();
    row.n = field(p, "n").get<int64_t>();
    row.acc = number_or_nan(field(p, "acc"));
    // Older or hand-written files may lack successes; it is implied by n and acc.
    row.successes = p.contains("successes") ? p["successes"].get<int64_t>()
                                            : std::llround(row.acc * static_cast<double>(row.n));
    row.ci_lo = number_or_nan(field(p, "ci_lo"));
    row.ci_hi = number_or_nan(field(p, "ci_hi"));
    rows.push_back(row);
  }
  return rows;
}

nlohmann::json period_json(const PeriodDetection& d) {
  nlohmann::json by_period = nlohmann::json::array();
  for (const PeriodScore& s : d.by_period) {
    by_period.push_back(
        {{"period", s.period}, {"statistic", s.statistic}, {"df", s.df}, {"score", s.score}});
  }
  nlohmann::json support = nlohmann::json::object();
  for (const auto& [period, share] : d.support) support[std::to_string(period)] = share;
  return {{"detected", d.detected > 0 ? nlohmann::json(d.detected) : nlohmann::json(nullptr)},
          {"p_value", d.p_value},
          {"significant", d.detected > 0 && d.p_value < 0.05},
          {"statistic", d.statistic},
          {"method", "fold_sign_flip_max_score"},
          {"permutations", d.permutations},
          {"positions", d.positions_known ? "key_pos" : "phase"},
          {"support", support},
          {"by_period", by_period}};
}

nlohmann::json flip_json(const FlipResult& f) {
  return {{"statistic", f.statistic}, {"p_value", f.p_value}, {"flips", f.flips}};
}

FlipResult flip_from(const nlohmann::json& j) {
  return {number_or_nan(field(j, "statistic")), number_or_nan(field(j, "p_value")),
          field(j, "flips").get<int>()};
}

PeriodDetection period_from(const nlohmann::json& j) {
  PeriodDetection d;
  const nlohmann::json& detected = field(j, "detected");
  d.detected = detected.is_null() ? 0 : detected.get<int>();
  d.p_value = number_or_nan(field(j, "p_value"));
  d.statistic = number_or_nan(field(j, "statistic"));
  d.permutations = field(j, "permutations").get<int>();
  d.positions_known = j.value("positions", "phase") == "key_pos";
  for (const nlohmann::json& s : field(j, "by_period")) {
    // "g2": files written before the sign-flip test (the statistic was a G2 then).
    const char* stat = s.contains("statistic") ? "statistic" : "g2";
    d.by_period.push_back({field(s, "period").get<int>(), number_or_nan(field(s, stat)),
                           field(s, "df").get<int>(), number_or_nan(field(s, "score"))});
  }
  if (j.contains("support"))
    for (const auto& [period, share] : j["support"].items())
      d.support[std::stoi(period)] = number_or_nan(share);
  return d;
}

nlohmann::json split_interior_json(const StrideSplit& s) {
  return {
      {"phases", s.interior_phases},
      {"mean_acc", s.interior_mean_acc},
      {"best_phase", s.interior_best_phase},
      {"worst_phase", s.interior_worst_phase},
      {"worst_acc", s.interior_worst_acc},
      {"gap_pp", s.interior_gap_pp},
      {"gap_ci_pp", interval_json(s.interior_gap_ci_pp)},
      {"test", s.interior_test.flips > 0 ? flip_json(s.interior_test) : nlohmann::json(nullptr)}};
}

nlohmann::json split_boundary_json(const StrideSplit& s) {
  return {{"phases", s.boundary_phases},
          {"acc", s.boundary_acc},
          {"worst_phase", s.boundary_worst_phase},
          {"worst_acc", s.boundary_worst_acc}};
}

StrideSplit split_from(const nlohmann::json& interior, const nlohmann::json& boundary) {
  StrideSplit s;
  s.interior_phases = field(interior, "phases").get<std::vector<int>>();
  s.interior_mean_acc = number_or_nan(field(interior, "mean_acc"));
  s.interior_best_phase = field(interior, "best_phase").get<int>();
  s.interior_worst_phase = field(interior, "worst_phase").get<int>();
  s.interior_worst_acc = number_or_nan(field(interior, "worst_acc"));
  s.interior_gap_pp = number_or_nan(field(interior, "gap_pp"));
  s.interior_gap_ci_pp = interval_from(field(interior, "gap_ci_pp"));
  if (interior.contains("test") && !interior["test"].is_null())
    s.interior_test = flip_from(interior["test"]);
  s.boundary_phases = field(boundary, "phases").get<std::vector<int>>();
  s.boundary_acc = number_or_nan(field(boundary, "acc"));
  s.boundary_worst_phase = field(boundary, "worst_phase").get<int>();
  s.boundary_worst_acc = number_or_nan(field(boundary, "worst_acc"));
  return s;
}

}  // namespace

// -------------------------------------------------------------------------------------------------
// Public functions.

WilsonInterval wilson(int64_t successes, int64_t n, double z) {
  if (n < 0 || successes < 0 || successes > n) {
    throw Error(fmt::format("wilson: need 0 <= successes <= n, got {} of {}", successes, n));
  }
  if (n == 0) return {0.0, 1.0};
  const double nn = static_cast<double>(n);
  const double p = static_cast<double>(successes) / nn;
  const double z2 = z * z;
  const double denom = 1.0 + z2 / nn;
  const double center = (p + z2 / (2.0 * nn)) / denom;
  const double half = z * std::sqrt(p * (1.0 - p) / nn + z2 / (4.0 * nn * nn)) / denom;
  // Clamp: at p = 0 or 1 the bound equals 0 or 1 exactly, up to rounding.
  return {std::max(0.0, center - half), std::min(1.0, center + half)};
}

double chi_square_sf(double x, double df) {
  if (df <= 0.0) throw Error(fmt::format("chi-square degrees of freedom must be > 0, got {}", df));
  return std::exp(log_gamma_q(0.5 * df, 0.5 * x));
}

double chi_square_log10_sf(double x, double df) {
  if (df <= 0.0) throw Error(fmt::format("chi-square degrees of freedom must be > 0, got {}", df));
  return log_gamma_q(0.5 * df, 0.5 * x) / std::log(10.0);
}

std::vector<PhaseRow> phase_table(const std::vector<PhaseOutcome>& outcomes, int modulus) {
  check_phases(outcomes, modulus);
  Counts counts(modulus);
  for (const PhaseOutcome& o : outcomes) {
    counts.successes[o.phase] += o.correct ? 1 : 0;
    counts.trials[o.phase] += 1;
  }
  std::vector<PhaseRow> rows;
  for (int r = 0; r < modulus; ++r) {
    if (counts.trials[r] == 0) {
      throw Error(
          fmt::format("phase {} has no outcomes; every phase in [0, {}) needs some", r, modulus));
    }
    const WilsonInterval ci = wilson(counts.successes[r], counts.trials[r]);
    rows.push_back({r, counts.trials[r], counts.successes[r],
                    static_cast<double>(counts.successes[r]) / counts.trials[r], ci.lo, ci.hi});
  }
  return rows;
}

ChiSquareTest chi_square_homogeneity(const std::vector<PhaseRow>& rows) {
  ChiSquareTest t;
  t.df = static_cast<int>(rows.size()) - 1;
  double s = 0.0, n = 0.0;
  for (const PhaseRow& row : rows) {
    s += static_cast<double>(row.successes);
    n += static_cast<double>(row.n);
  }
  const double p = n > 0.0 ? s / n : 0.0;
  // All right or all wrong: no variation to test.
  if (t.df < 1 || p <= 0.0 || p >= 1.0) return t;
  for (const PhaseRow& row : rows) {
    const double expected = row.n * p;
    const double diff = row.successes - expected;
    t.statistic += diff * diff / (expected * (1.0 - p));
  }
  t.p_value = chi_square_sf(t.statistic, t.df);
  return t;
}

std::optional<double> periodicity_check(const std::vector<double>& acc, int period) {
  const int m = static_cast<int>(acc.size());
  if (period <= 0 || period >= m) return std::nullopt;
  double sum = 0.0;
  for (int r = 0; r + period < m; ++r) sum += std::abs(acc[r] - acc[r + period]);
  return sum / (m - period);
}

PeriodDetection detect_period(const std::vector<PhaseOutcome>& outcomes, int modulus,
                              const SummaryOptions& options) {
  check_phases(outcomes, modulus);
  return detect_period_table(cluster_table(outcomes, modulus), options);
}

PeriodDetection detect_period(const std::vector<PhaseOutcome>& outcomes, int modulus,
                              int permutations, uint64_t seed) {
  SummaryOptions o;
  o.permutations = permutations;
  o.max_permutations = permutations;
  o.period_bootstrap = 0;
  o.seed = seed;
  return detect_period(outcomes, modulus, o);
}

std::vector<int> candidate_periods(int modulus, bool positions_known) {
  std::vector<int> periods;
  for (int p = 2; p <= modulus / 2; ++p)
    if (positions_known || modulus % p == 0) periods.push_back(p);
  return periods;
}

double PeriodDetection::detected_support() const {
  const auto it = support.find(detected);
  return it == support.end() ? 0.0 : it->second;
}

PhaseSummary summarize(const std::vector<PhaseOutcome>& outcomes, int modulus, int stride,
                       const SummaryOptions& options) {
  PhaseSummary s;
  s.phases = phase_table(outcomes, modulus);  // validates phases
  check_stride(modulus, stride);
  s.modulus = modulus;
  s.stride = stride;
  s.options = options;
  const std::vector<Example> examples = group_by_example(outcomes);
  const Counts counts = count_outcomes(examples, modulus);
  s.examples = static_cast<int64_t>(examples.size());
  s.outcomes = static_cast<int64_t>(outcomes.size());

  const std::vector<double> acc = counts.accuracies();
  const Extremes all = extremes(acc, all_phases(modulus));
  s.mean_acc = mean_over(acc, all_phases(modulus));
  s.best_phase = all.best;
  s.best_acc = all.best_acc;
  s.worst_phase = all.worst;
  s.worst_acc = all.worst_acc;
  s.gap_pp = 100.0 * all.gap();
  if (stride >= 2) s.split = split_by_stride(acc, stride);
  if (auto check = periodicity_check(acc, stride)) s.periodicity_check_pp = 100.0 * *check;

  const ClusterTable table = cluster_table(outcomes, modulus);
  const GapBands bands = gap_bands(table, all_phases(modulus));
  s.gap_ci_pp = bands.gap_pp;
  s.worst_acc_ci = bands.worst_acc;
  const double boot = mean_bootstrap_gap(examples, modulus, options.bootstrap_reps, options.seed);
  s.gap_bc_pp = std::isnan(boot) ? kNaN : std::max(0.0, 2.0 * s.gap_pp - 100.0 * boot);
  const NullGap null = null_gap(table, options.permutations, seed_for(options.seed, 0x9u));
  s.null_gap_pp = null.mean_pp;
  s.null_gap_q95_pp = null.q95_pp;
  if (s.split) {
    s.split->interior_gap_ci_pp = gap_bands(table, s.split->interior_phases).gap_pp;
    s.split->interior_test = interior_test(table, stride, options);
  }
  if (stride >= 2 && 2 * stride <= modulus) s.stride_test = stride_test(table, stride, options);

  s.chi_square = chi_square_homogeneity(s.phases);
  s.period = detect_period_table(table, options);
  return s;
}

nlohmann::json PhaseSummary::to_json() const {
  using nlohmann::json;
  json j;
  j["modulus"] = modulus;
  j["stride"] = stride > 0 ? json(stride) : json(nullptr);
  j["examples"] = examples;
  j["outcomes"] = outcomes;
  j["mean_acc"] = mean_acc;
  j["phases"] = phases_json(phases);
  j["best_phase"] = best_phase;
  j["best_acc"] = best_acc;
  j["worst_phase"] = worst_phase;
  j["worst_acc"] = worst_acc;
  j["worst_acc_ci"] = interval_json(worst_acc_ci);
  j["gap_pp"] = gap_pp;
  j["gap_ci_pp"] = interval_json(gap_ci_pp);
  j["gap_ci_method"] = "simultaneous_sidak";
  j["gap_bc_pp"] = gap_bc_pp;
  j["null_gap_pp"] = {{"mean", null_gap_pp}, {"q95", null_gap_q95_pp}};
  j["interior"] = split ? split_interior_json(*split) : json(nullptr);
  j["boundary"] = split ? split_boundary_json(*split) : json(nullptr);
  j["periodicity_check"] =
      periodicity_check_pp ? json{{"period", stride}, {"mean_abs_diff_pp", *periodicity_check_pp}}
                           : json(nullptr);
  j["chi_square"] = {
      {"statistic", chi_square.statistic}, {"df", chi_square.df}, {"p_value", chi_square.p_value}};
  j["period"] = period_json(period);
  j["stride_test"] = stride_test ? json{{"stride", stride_test->stride},
                                        {"component", flip_json(stride_test->component)},
                                        {"residual", flip_json(stride_test->residual)},
                                        {"supported", stride_test->supported()}}
                                 : json(nullptr);
  j["options"] = {{"bootstrap_reps", options.bootstrap_reps},
                  {"permutations", options.permutations},
                  {"max_permutations", options.max_permutations},
                  {"period_bootstrap", options.period_bootstrap},
                  {"seed", options.seed},
                  {"resampling_unit", "example_id"}};
  j["planned_outcomes"] = planned_outcomes > 0 ? json(planned_outcomes) : json(nullptr);
  j["complete"] = complete();
  j["shortcut_ceiling"] = shortcut ? json(*shortcut) : json(nullptr);
  j["at_or_below_shortcut"] = at_or_below_shortcut();
  j["sensitivity"] = sensitivity ? sensitivity->to_json() : json(nullptr);
  return j;
}

nlohmann::json Sensitivity::to_json() const {
  using nlohmann::json;
  return {{"min_gap_pp", min_gap_pp},
          {"stride", stride},
          {"stride_assumed", stride_assumed},
          {"accuracy", accuracy},
          {"icc", icc},
          {"examples", examples},
          {"power", power},
          {"power_se", power_se},
          {"datasets", datasets},
          {"examples_needed", examples_needed > 0 ? json(examples_needed) : json(nullptr)},
          {"ruled_out", ruled_out}};
}

Sensitivity Sensitivity::from_json(const nlohmann::json& j) {
  Sensitivity s;
  s.min_gap_pp = number_or_nan(field(j, "min_gap_pp"));
  s.stride = field(j, "stride").get<int>();
  s.stride_assumed = field(j, "stride_assumed").get<bool>();
  s.accuracy = number_or_nan(field(j, "accuracy"));
  s.icc = number_or_nan(field(j, "icc"));
  s.examples = field(j, "examples").get<int64_t>();
  s.power = number_or_nan(field(j, "power"));
  s.power_se = number_or_nan(field(j, "power_se"));
  s.datasets = field(j, "datasets").get<int>();
  const nlohmann::json& needed = field(j, "examples_needed");
  s.examples_needed = needed.is_null() ? 0 : needed.get<int>();
  s.ruled_out = field(j, "ruled_out").get<bool>();
  return s;
}

std::vector<double> holm_adjust(const std::vector<double>& p) {
  std::vector<size_t> order;
  for (size_t i = 0; i < p.size(); ++i)
    if (!std::isnan(p[i])) order.push_back(i);
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return p[a] < p[b]; });
  std::vector<double> out(p.size(), kNaN);
  double running = 0.0;  // adjusted p-values are monotone in the raw ones
  const double m = static_cast<double>(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    running = std::max(running, std::min(1.0, (m - static_cast<double>(k)) * p[order[k]]));
    out[order[k]] = running;
  }
  return out;
}

bool PhaseSummary::at_or_below_shortcut() const {
  if (!shortcut || phases.empty()) return false;
  for (const PhaseRow& p : phases)
    if (p.ci_lo > *shortcut) return false;
  return true;
}

PhaseSummary PhaseSummary::from_json(const nlohmann::json& j) {
  try {
    PhaseSummary s;
    s.modulus = field(j, "modulus").get<int>();
    const nlohmann::json& stride = field(j, "stride");
    s.stride = stride.is_null() ? 0 : stride.get<int>();
    s.examples = field(j, "examples").get<int64_t>();
    s.outcomes = field(j, "outcomes").get<int64_t>();
    s.mean_acc = number_or_nan(field(j, "mean_acc"));
    s.phases = phases_from(field(j, "phases"));
    s.best_phase = field(j, "best_phase").get<int>();
    s.best_acc = number_or_nan(field(j, "best_acc"));
    s.worst_phase = field(j, "worst_phase").get<int>();
    s.worst_acc = number_or_nan(field(j, "worst_acc"));
    s.worst_acc_ci = interval_from(field(j, "worst_acc_ci"));
    s.gap_pp = number_or_nan(field(j, "gap_pp"));
    s.gap_ci_pp = interval_from(field(j, "gap_ci_pp"));
    // Written since the corrected statistics (issue 42); older files lack them (NaN).
    s.gap_bc_pp = j.contains("gap_bc_pp") ? number_or_nan(j["gap_bc_pp"]) : kNaN;
    s.null_gap_pp = s.null_gap_q95_pp = kNaN;
    if (j.contains("null_gap_pp") && j["null_gap_pp"].is_object()) {
      s.null_gap_pp = number_or_nan(field(j["null_gap_pp"], "mean"));
      s.null_gap_q95_pp = number_or_nan(field(j["null_gap_pp"], "q95"));
    }
    if (j.contains("stride_test") && !j["stride_test"].is_null()) {
      const nlohmann::json& t = j["stride_test"];
      s.stride_test = StrideTest{field(t, "stride").get<int>(), flip_from(field(t, "component")),
                                 flip_from(field(t, "residual"))};
    }
    const nlohmann::json& interior = field(j, "interior");
    if (!interior.is_null()) s.split = split_from(interior, field(j, "boundary"));
    const nlohmann::json& check = field(j, "periodicity_check");
    if (!check.is_null()) s.periodicity_check_pp = number_or_nan(field(check, "mean_abs_diff_pp"));
    const nlohmann::json& chi = field(j, "chi_square");
    s.chi_square = {number_or_nan(field(chi, "statistic")), field(chi, "df").get<int>(),
                    number_or_nan(field(chi, "p_value"))};
    s.period = period_from(field(j, "period"));
    const nlohmann::json& options = field(j, "options");
    s.options.bootstrap_reps = field(options, "bootstrap_reps").get<int>();
    s.options.permutations = field(options, "permutations").get<int>();
    s.options.seed = field(options, "seed").get<uint64_t>();
    s.options.max_permutations = options.value("max_permutations", s.options.permutations);
    s.options.period_bootstrap = options.value("period_bootstrap", 0);
    // Written since the verdict knew about incomplete runs and the shortcut; older files lack them.
    if (j.contains("planned_outcomes") && !j["planned_outcomes"].is_null())
      s.planned_outcomes = j["planned_outcomes"].get<int64_t>();
    if (j.contains("shortcut_ceiling") && !j["shortcut_ceiling"].is_null())
      s.shortcut = number_or_nan(j["shortcut_ceiling"]);
    if (j.contains("sensitivity") && !j["sensitivity"].is_null())
      s.sensitivity = Sensitivity::from_json(j["sensitivity"]);
    return s;
  } catch (const nlohmann::json::exception& e) {
    throw Error(std::string("summary JSON: ") + e.what());
  } catch (const Error& e) {
    throw Error(std::string("summary JSON: ") + e.what());
  }
}

// -------------------------------------------------------------------------------------------------
// Paired comparisons (knockouts, gate cycling).

namespace {

// One logical example's pairs: the unit the paired bootstrap resamples and within which the
// specialisation test shuffles.
struct PairedExample {
  std::vector<int> phases;
  std::vector<uint8_t> reference, variant;
};

struct PairedCounts {
  std::vector<int64_t> n, reference, variant;
  explicit PairedCounts(int modulus) : n(modulus, 0), reference(modulus, 0), variant(modulus, 0) {}
  void add(const PairedExample& e, const std::vector<size_t>* order = nullptr) {
    for (size_t i = 0; i < e.phases.size(); ++i) {
      const size_t j = order ? (*order)[i] : i;  // pair j lands on phase i
      n[e.phases[i]] += 1;
      reference[e.phases[i]] += e.reference[j];
      variant[e.phases[i]] += e.variant[j];
    }
  }
};

std::vector<PairedExample> group_pairs(const std::vector<PairedOutcome>& pairs, int modulus) {
  if (pairs.empty()) throw Error("no paired outcomes to summarise");
  std::map<int64_t, size_t> index;
  std::vector<PairedExample> examples;
  for (const PairedOutcome& o : pairs) {
    if (o.phase < 0 || o.phase >= modulus)
      throw Error(fmt::format("paired outcome of example {} has phase {}, outside [0, {})",
                              o.example_id, o.phase, modulus));
    auto [it, inserted] = index.try_emplace(o.example_id, examples.size());
    if (inserted) examples.emplace_back();
    PairedExample& e = examples[it->second];
    e.phases.push_back(o.phase);
    e.reference.push_back(o.reference ? 1 : 0);
    e.variant.push_back(o.variant ? 1 : 0);
  }
  return examples;
}

// Relative loss per phase folded mod `fold` (see Specialisation).
std::vector<double> folded_loss(const PairedCounts& c, int fold) {
  std::vector<int64_t> ref(fold, 0), var(fold, 0);
  for (size_t r = 0; r < c.n.size(); ++r) {
    ref[r % fold] += c.reference[r];
    var[r % fold] += c.variant[r];
  }
  std::vector<double> loss(fold, 0.0);
  for (int q = 0; q < fold; ++q)
    if (ref[q] > 0) loss[q] = std::max(0.0, 1.0 - static_cast<double>(var[q]) / ref[q]);
  return loss;
}

struct IndexValue {
  double share = kNaN, index = kNaN;
  std::vector<int> worst;
};

IndexValue specialisation_index(const std::vector<double>& loss, int k) {
  IndexValue v;
  const int fold = static_cast<int>(loss.size());
  std::vector<int> order(fold);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return loss[a] > loss[b]; });
  v.worst.assign(order.begin(), order.begin() + k);
  double total = 0.0, top = 0.0;
  for (int q = 0; q < fold; ++q) total += loss[q];
  for (int i = 0; i < k; ++i) top += loss[order[i]];
  if (total <= 0.0) return v;
  const double agnostic = static_cast<double>(k) / fold;
  v.share = top / total;
  v.index = (v.share - agnostic) / (1.0 - agnostic);
  return v;
}

double mean_drop(const PairedCounts& c) {
  double sum = 0.0;
  for (size_t r = 0; r < c.n.size(); ++r)
    sum += static_cast<double>(c.reference[r] - c.variant[r]) / static_cast<double>(c.n[r]);
  return sum / static_cast<double>(c.n.size());
}

nlohmann::json number_or_null(double v) {
  return std::isnan(v) ? nlohmann::json(nullptr) : nlohmann::json(v);
}

}  // namespace

PairedSummary summarize_paired(const std::vector<PairedOutcome>& pairs, int modulus, int fold,
                               const SummaryOptions& options) {
  if (modulus < 1) throw Error(fmt::format("phase modulus must be >= 1, got {}", modulus));
  if (fold == 0) fold = modulus;
  if (fold < 1 || modulus % fold != 0)
    throw Error(fmt::format("fold {} must divide the phase modulus {}", fold, modulus));
  const std::vector<PairedExample> examples = group_pairs(pairs, modulus);
  PairedCounts counts(modulus);
  for (const auto& e : examples) counts.add(e);
  for (int r = 0; r < modulus; ++r)
    if (counts.n[r] == 0) throw Error(fmt::format("phase {} has no paired outcome", r));

  PairedSummary s;
  s.modulus = modulus;
  s.fold = fold;
  s.examples = static_cast<int64_t>(examples.size());
  s.mean_drop_pp = 100.0 * mean_drop(counts);
  for (int r = 0; r < modulus; ++r) {
    PairedPhaseRow row;
    row.r = r;
    row.n = counts.n[r];
    row.acc_reference = static_cast<double>(counts.reference[r]) / row.n;
    row.acc_variant = static_cast<double>(counts.variant[r]) / row.n;
    row.change_pp = 100.0 * (row.acc_variant - row.acc_reference);
    if (counts.reference[r] > 0)
      row.rel_change_pct = 100.0 * static_cast<double>(counts.variant[r] - counts.reference[r]) /
                           counts.reference[r];
    s.phases.push_back(row);
  }
  Specialisation& sp = s.spec;
  sp.fold = fold;
  sp.k = std::max(1, std::min(2, fold - 1));
  sp.agnostic = static_cast<double>(sp.k) / fold;
  sp.loss = folded_loss(counts, fold);
  const IndexValue observed = specialisation_index(sp.loss, sp.k);
  sp.share = observed.share;
  sp.index = observed.index;
  sp.worst_phases = observed.worst;

  // Paired cluster bootstrap.
  std::vector<std::vector<double>> change(modulus), rel(modulus);
  std::vector<double> drops, indices;
  Rng rng(options.seed);
  for (int rep = 0; rep < options.bootstrap_reps; ++rep) {
    PairedCounts c(modulus);
    for (size_t i = 0; i < examples.size(); ++i) c.add(examples[draw_below(rng, examples.size())]);
    bool complete = true;
    for (int r = 0; r < modulus; ++r) complete = complete && c.n[r] > 0;
    if (!complete) continue;  // a phase drawn empty (only with ragged inputs)
    for (int r = 0; r < modulus; ++r) {
      change[r].push_back(100.0 * static_cast<double>(c.variant[r] - c.reference[r]) / c.n[r]);
      rel[r].push_back(c.reference[r] > 0
                           ? 100.0 * static_cast<double>(c.variant[r] - c.reference[r]) /
                                 c.reference[r]
                           : kNaN);
    }
    drops.push_back(100.0 * mean_drop(c));
    indices.push_back(specialisation_index(folded_loss(c, fold), sp.k).index);
  }
  for (int r = 0; r < modulus; ++r) {
    s.phases[r].change_ci_pp = percentile_interval(change[r]);
    s.phases[r].rel_change_ci_pct = percentile_interval(rel[r]);
  }
  s.mean_drop_ci_pp = percentile_interval(drops);
  sp.index_ci = percentile_interval(indices);

  // Permutation test: each example's pairs shuffled together across its phases.
  sp.permutations = std::max(0, options.permutations);
  if (!std::isnan(sp.index)) {
    const double threshold = sp.index - 1e-12;
    int at_least = 0;
    Rng prng(options.seed ^ 0x5eedULL);
    std::vector<size_t> order;
    for (int i = 0; i < sp.permutations; ++i) {
      PairedCounts c(modulus);
      for (const auto& e : examples) {
        order.resize(e.phases.size());
        std::iota(order.begin(), order.end(), size_t{0});
        shuffle_in_place(order, prng);
        c.add(e, &order);
      }
      const double v = specialisation_index(folded_loss(c, fold), sp.k).index;
      if (!std::isnan(v) && v >= threshold) ++at_least;
    }
    sp.p_value = (1.0 + at_least) / (1.0 + sp.permutations);
  }
  const bool effect = !std::isnan(s.mean_drop_ci_pp.lo) && s.mean_drop_ci_pp.lo > 0.0;
  const bool specific = sp.permutations > 0 && sp.p_value < 0.05 && !std::isnan(sp.index) &&
                        sp.index >= kSpecificIndex;
  sp.verdict = !effect ? "no effect" : specific ? "phase-specific" : "phase-agnostic";
  return s;
}

nlohmann::json PairedSummary::to_json() const {
  using nlohmann::json;
  json rows = json::array();
  for (const PairedPhaseRow& p : phases)
    rows.push_back({{"phase", p.r},
                    {"n", p.n},
                    {"acc_reference", p.acc_reference},
                    {"acc_variant", p.acc_variant},
                    {"change_pp", p.change_pp},
                    {"change_ci_pp", interval_json(p.change_ci_pp)},
                    {"rel_change_pct", p.rel_change_pct ? json(*p.rel_change_pct) : json(nullptr)},
                    {"rel_change_ci_pct", interval_json(p.rel_change_ci_pct)}});
  return {{"modulus", modulus},
          {"stride", fold},
          {"examples", examples},
          {"phases", rows},
          {"mean_drop_pp", mean_drop_pp},
          {"mean_drop_ci_pp", interval_json(mean_drop_ci_pp)},
          {"specialisation",
           {{"stride", spec.fold},
            {"k", spec.k},
            {"loss_by_folded_phase", spec.loss},
            {"share", number_or_null(spec.share)},
            {"agnostic_share", spec.agnostic},
            {"index", number_or_null(spec.index)},
            {"index_ci", interval_json(spec.index_ci)},
            {"worst_phases", spec.worst_phases},
            {"p_value", spec.p_value},
            {"permutations", spec.permutations},
            {"verdict", spec.verdict}}}};
}

double r_squared(const std::vector<double>& observed, const std::vector<double>& predicted) {
  if (observed.size() != predicted.size() || observed.size() < 2) return kNaN;
  double mean = 0.0;
  for (double y : observed) mean += y;
  mean /= static_cast<double>(observed.size());
  double res = 0.0, tot = 0.0;
  for (size_t i = 0; i < observed.size(); ++i) {
    res += (observed[i] - predicted[i]) * (observed[i] - predicted[i]);
    tot += (observed[i] - mean) * (observed[i] - mean);
  }
  return tot > 0.0 ? 1.0 - res / tot : kNaN;
}

namespace {

// Per example: successes and trials per (condition, folded phase); condition 0 is the reference.
struct CycleExample {
  std::vector<int64_t> succ, trials;  // [conditions * stride]
};

std::vector<std::vector<double>> cycle_accuracies(const std::vector<const CycleExample*>& draw,
                                                  int conditions, int stride) {
  std::vector<int64_t> succ(static_cast<size_t>(conditions * stride), 0), trials(succ.size(), 0);
  for (const CycleExample* e : draw)
    for (size_t i = 0; i < succ.size(); ++i) {
      succ[i] += e->succ[i];
      trials[i] += e->trials[i];
    }
  std::vector<std::vector<double>> acc(conditions, std::vector<double>(stride, kNaN));
  for (int c = 0; c < conditions; ++c)
    for (int q = 0; q < stride; ++q) {
      const size_t i = static_cast<size_t>(c * stride + q);
      if (trials[i] > 0) acc[c][q] = static_cast<double>(succ[i]) / trials[i];
    }
  return acc;
}

// The points of a fit from per-condition folded accuracies (condition c + 1 = deltas[c]).
std::vector<CyclePoint> cycle_points(const std::vector<std::vector<double>>& acc,
                                     const std::vector<int>& deltas, int stride) {
  std::vector<CyclePoint> points;
  for (size_t c = 0; c < deltas.size(); ++c)
    for (int r = 0; r < stride; ++r) {
      CyclePoint p;
      p.delta = deltas[c];
      p.r = r;
      const int src = ((r - p.delta) % stride + stride) % stride;
      p.reference_acc = acc[0][r];
      p.observed_acc = acc[c + 1][r];
      p.predicted_acc = acc[0][src];
      p.observed_change = p.observed_acc - p.reference_acc;
      p.predicted_change = p.predicted_acc - p.reference_acc;
      p.boundary = r == stride - 1;
      points.push_back(p);
    }
  return points;
}

double points_r2(const std::vector<CyclePoint>& points, bool interior_only,
                 std::optional<int> delta = std::nullopt) {
  std::vector<double> y, yhat;
  for (const CyclePoint& p : points) {
    if ((interior_only && p.boundary) || (delta && p.delta != *delta)) continue;
    if (std::isnan(p.observed_change) || std::isnan(p.predicted_change)) return kNaN;
    y.push_back(p.observed_change);
    yhat.push_back(p.predicted_change);
  }
  return r_squared(y, yhat);
}

}  // namespace

CycleFit fit_cycle(const std::vector<PhaseOutcome>& reference,
                   const std::map<int, std::vector<PhaseOutcome>>& shifted, int modulus, int stride,
                   const SummaryOptions& options) {
  if (stride < 2) throw Error(fmt::format("gate cycling needs a stride >= 2, got {}", stride));
  check_stride(modulus, stride);
  if (reference.empty()) throw Error("gate cycling: no unshifted outcomes");
  if (shifted.empty()) throw Error("gate cycling: no shifted outcomes");
  CycleFit fit;
  fit.stride = stride;
  for (const auto& [d, outcomes] : shifted) fit.deltas.push_back(d);
  const int conditions = 1 + static_cast<int>(fit.deltas.size());
  std::map<int64_t, CycleExample> by_example;
  auto add = [&](const std::vector<PhaseOutcome>& outcomes, int c) {
    check_phases(outcomes, modulus);
    for (const PhaseOutcome& o : outcomes) {
      CycleExample& e = by_example[o.example_id];
      if (e.succ.empty()) {
        e.succ.assign(static_cast<size_t>(conditions * stride), 0);
        e.trials.assign(e.succ.size(), 0);
      }
      const size_t i = static_cast<size_t>(c * stride + o.phase % stride);
      e.succ[i] += o.correct ? 1 : 0;
      e.trials[i] += 1;
    }
  };
  add(reference, 0);
  for (size_t c = 0; c < fit.deltas.size(); ++c)
    add(shifted.at(fit.deltas[c]), 1 + static_cast<int>(c));
  std::vector<const CycleExample*> all;
  for (const auto& [id, e] : by_example) all.push_back(&e);
  fit.examples = static_cast<int64_t>(all.size());

  const auto acc = cycle_accuracies(all, conditions, stride);
  for (int c = 0; c < conditions; ++c)
    for (int q = 0; q < stride; ++q)
      if (std::isnan(acc[c][q]))
        throw Error(fmt::format("gate cycling: folded phase {} of {} has no outcome", q,
                                c == 0 ? std::string("the unshifted model")
                                       : fmt::format("shift {}", fit.deltas[c - 1])));
  fit.reference_acc = acc[0];
  fit.points = cycle_points(acc, fit.deltas, stride);
  fit.r2_interior = points_r2(fit.points, true);
  fit.r2_all = points_r2(fit.points, false);
  for (const CyclePoint& p : fit.points) fit.n_interior += p.boundary ? 0 : 1;
  for (int d : fit.deltas) fit.r2_interior_by_delta[d] = points_r2(fit.points, true, d);
  fit.boundary_acc[0] = acc[0][stride - 1];
  for (size_t c = 0; c < fit.deltas.size(); ++c)
    fit.boundary_acc[fit.deltas[c]] = acc[c + 1][stride - 1];

  std::vector<double> r2i, r2a;
  Rng rng(options.seed);
  std::vector<const CycleExample*> draw(all.size());
  for (int rep = 0; rep < options.bootstrap_reps; ++rep) {
    for (auto& d : draw) d = all[draw_below(rng, all.size())];
    const auto points =
        cycle_points(cycle_accuracies(draw, conditions, stride), fit.deltas, stride);
    r2i.push_back(points_r2(points, true));
    r2a.push_back(points_r2(points, false));
  }
  fit.r2_interior_ci = percentile_interval(r2i);
  fit.r2_all_ci = percentile_interval(r2a);
  return fit;
}

nlohmann::json CycleFit::to_json() const {
  using nlohmann::json;
  json pts = json::array();
  for (const CyclePoint& p : points)
    pts.push_back({{"delta", p.delta},
                   {"phase", p.r},
                   {"reference_acc", p.reference_acc},
                   {"observed_acc", p.observed_acc},
                   {"predicted_acc", p.predicted_acc},
                   {"observed_change", p.observed_change},
                   {"predicted_change", p.predicted_change},
                   {"boundary", p.boundary}});
  json by_delta = json::object(), boundary = json::object();
  for (const auto& [d, v] : r2_interior_by_delta) by_delta[std::to_string(d)] = number_or_null(v);
  for (const auto& [d, v] : boundary_acc) boundary[std::to_string(d)] = v;
  return {{"stride", stride},
          {"examples", examples},
          {"deltas", deltas},
          {"reference_acc", reference_acc},
          {"points", pts},
          {"r2_interior", number_or_null(r2_interior)},
          {"r2_interior_ci", interval_json(r2_interior_ci)},
          {"n_interior", n_interior},
          {"r2_all", number_or_null(r2_all)},
          {"r2_all_ci", interval_json(r2_all_ci)},
          {"r2_interior_by_delta", by_delta},
          {"boundary_acc_by_delta", boundary}};
}

}  // namespace phasekv
