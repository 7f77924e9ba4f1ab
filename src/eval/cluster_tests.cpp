#include "eval/cluster_tests.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>

#include "util/rng.h"

namespace phasekv {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
constexpr double kMinVariance = 1e-6;

double normal_cdf(double x) {
  return 0.5 * std::erfc(-x / std::sqrt(2.0));
}

// Flips of n examples: one bit of a 64-bit draw per example, so a seed names the same flips
// everywhere.
void draw_signs(Rng& rng, std::vector<int8_t>& signs) {
  uint64_t bits = 0;
  for (size_t i = 0; i < signs.size(); ++i) {
    if (i % 64 == 0) bits = rng();
    signs[i] = (bits >> (i % 64)) & 1 ? 1 : -1;
  }
}

double max_score(const std::vector<Folded>& folds, const std::vector<int8_t>* signs) {
  double best = 0.0;
  for (const Folded& f : folds) best = std::max(best, fold_stat(f, nullptr, signs).score);
  return best;
}

// Wilson bounds at critical value z.
Interval wilson_z(double successes, double n, double z) {
  if (n <= 0) return {0.0, 1.0};
  const double p = successes / n, z2 = z * z;
  const double centre = (p + z2 / (2 * n)) / (1 + z2 / n);
  const double half = z * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / (1 + z2 / n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

}  // namespace

double normal_quantile(double p) {
  if (p <= 0.0) return -INFINITY;
  if (p >= 1.0) return INFINITY;
  double lo = -40.0, hi = 40.0;  // bisection: called a few times per summary, exactness wins
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (normal_cdf(mid) < p ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

double sidak_z(int k, double level) {
  const double per = std::pow(level, 1.0 / std::max(1, k));
  return normal_quantile(1.0 - (1.0 - per) / 2.0);
}

ClusterTable cluster_table(const std::vector<PhaseOutcome>& outcomes, int modulus) {
  ClusterTable t;
  t.modulus = modulus;
  std::map<int64_t, int64_t> row;  // ordered: rows in ascending example_id
  for (const PhaseOutcome& o : outcomes) row.try_emplace(o.example_id, 0);
  int64_t next = 0;
  for (auto& [id, i] : row) i = next++;
  t.n = next;
  const size_t cells = static_cast<size_t>(t.n) * modulus;
  std::vector<double> sum(cells, 0.0), count(cells, 0.0);
  t.pos.assign(cells, -1);
  t.positions_known = true;
  for (const PhaseOutcome& o : outcomes) {
    const size_t c = static_cast<size_t>(row[o.example_id]) * modulus + o.phase;
    sum[c] += o.correct ? 1.0 : 0.0;
    count[c] += 1.0;
    if (o.key_pos < 0 || o.key_pos % modulus != o.phase) t.positions_known = false;
    t.pos[c] = o.key_pos;
  }
  t.y.assign(cells, kNaN);
  for (size_t c = 0; c < cells; ++c) {
    if (count[c] > 0) t.y[c] = sum[c] / count[c];
    if (!t.positions_known || t.pos[c] < 0) t.pos[c] = static_cast<int64_t>(c % modulus);
  }
  if (!t.positions_known)  // one unusable position makes every residue mod P a guess
    for (size_t c = 0; c < cells; ++c) t.pos[c] = static_cast<int64_t>(c % modulus);
  return t;
}

Folded fold_cells(const std::vector<double>& values, int64_t n, int modulus,
                  const std::vector<int>& labels, int groups) {
  Folded f;
  f.groups = groups;
  f.n = n;
  f.z.assign(static_cast<size_t>(n) * groups, kNaN);
  f.cells.assign(groups, 0.0);
  std::vector<double> sum(groups), count(groups), examples(groups, 0.0);
  double sq = 0.0, all_cells = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    std::fill(sum.begin(), sum.end(), 0.0);
    std::fill(count.begin(), count.end(), 0.0);
    double total = 0.0, cells = 0.0;
    for (int r = 0; r < modulus; ++r) {
      const size_t c = static_cast<size_t>(i) * modulus + r;
      if (labels[c] < 0 || std::isnan(values[c])) continue;
      sum[labels[c]] += values[c];
      count[labels[c]] += 1.0;
      total += values[c];
      cells += 1.0;
    }
    if (cells == 0) continue;
    const double level = total / cells;
    for (int g = 0; g < groups; ++g)
      if (count[g] > 0) {
        f.z[i * groups + g] = sum[g] / count[g] - level;
        f.cells[g] += count[g];
        examples[g] += 1.0;
      }
    for (int r = 0; r < modulus; ++r) {
      const size_t c = static_cast<size_t>(i) * modulus + r;
      if (labels[c] < 0 || std::isnan(values[c])) continue;
      sq += (values[c] - level) * (values[c] - level);
      all_cells += 1.0;
    }
  }
  for (int g = 0; g < groups; ++g)
    if (examples[g] > 0) f.cells[g] /= examples[g];
  f.cell_var = all_cells > 0 ? sq / all_cells : 0.0;
  return f;
}

std::vector<int> labels_mod(const ClusterTable& t, int period) {
  std::vector<int> labels(t.pos.size());
  for (size_t c = 0; c < t.pos.size(); ++c) labels[c] = static_cast<int>(t.pos[c] % period);
  return labels;
}

std::vector<int> labels_folded_subset(const ClusterTable& t, int stride,
                                      const std::vector<int>& keep) {
  std::vector<int> group_of(stride, -1);
  for (size_t k = 0; k < keep.size(); ++k) group_of[keep[k]] = static_cast<int>(k);
  std::vector<int> labels(t.pos.size());
  for (size_t c = 0; c < t.pos.size(); ++c) labels[c] = group_of[(c % t.modulus) % stride];
  return labels;
}

FoldStat fold_stat(const Folded& f, const std::vector<double>* weights,
                   const std::vector<int8_t>* signs) {
  FoldStat s;
  const int G = f.groups;
  std::vector<double> sum(G, 0.0), sum2(G, 0.0);
  s.n.assign(G, 0.0);
  for (int64_t i = 0; i < f.n; ++i) {
    const double w = weights ? (*weights)[i] : 1.0;
    if (w == 0.0) continue;
    const double sign = signs ? (*signs)[i] : 1.0;
    for (int g = 0; g < G; ++g) {
      const double z = f.z[i * G + g];
      if (std::isnan(z)) continue;
      sum[g] += w * sign * z;
      sum2[g] += w * z * z;
      s.n[g] += w;
    }
  }
  s.mean.assign(G, kNaN);
  double centre = 0.0, var_sum = 0.0;
  int present = 0;
  for (int g = 0; g < G; ++g) {
    if (s.n[g] <= 0) continue;
    s.mean[g] = sum[g] / s.n[g];
    centre += s.mean[g];
    if (s.n[g] > 1)
      var_sum += std::max(0.0, sum2[g] - s.n[g] * s.mean[g] * s.mean[g]) / (s.n[g] - 1);
    ++present;
  }
  s.df = present - 1;
  if (present < 2) return s;
  centre /= present;
  // A floor for data without spread (every example with the same profile, as a deterministic
  // server gives): T stays proportional to the between-group sum of squares, so the period that
  // explains more of the profile still scores higher, instead of every candidate hitting a cap.
  s.vbar = var_sum / present;
  double between = 0.0;
  for (int g = 0; g < G; ++g)
    if (s.n[g] > 0) between += s.n[g] * f.cells[g] * (s.mean[g] - centre) * (s.mean[g] - centre);
  // The floor keeps T finite for data without spread (a deterministic server).
  s.t = between / std::max(f.cell_var, kMinVariance);
  s.score = -chi_square_log10_sf(s.t, s.df);
  return s;
}

double nested_p(const Folded& p, const Folded& d, const std::vector<double>* weights) {
  const int P = p.groups, D = d.groups;
  double t = 0.0;
  for (int g = 0; g < P; ++g) {
    double n = 0.0, sum = 0.0, sum2 = 0.0;
    for (int64_t i = 0; i < p.n; ++i) {
      const double w = weights ? (*weights)[i] : 1.0;
      const double zp = p.at(i, g), zd = d.at(i, g % D);
      if (w == 0.0 || std::isnan(zp) || std::isnan(zd)) continue;
      n += w, sum += w * (zp - zd), sum2 += w * (zp - zd) * (zp - zd);
    }
    if (n < 2) continue;
    const double mean = sum / n;
    const double var = std::max(0.0, sum2 - n * mean * mean) / (n - 1);
    t += n * mean * mean / std::max(var, kMinVariance);
  }
  return chi_square_sf(t, P - D);
}

FlipTest sign_flip_test(const std::vector<Folded>& folds, int flips, int max_flips, uint64_t seed) {
  FlipTest out;
  if (folds.empty() || flips <= 0) return out;
  out.statistic = max_score(folds, nullptr);
  // Relative slack: a flip that reproduces the observed profile counts as ">=" despite rounding.
  const double threshold = out.statistic - 1e-9 * std::max(1.0, out.statistic);
  const int64_t n = folds.front().n;
  std::vector<int8_t> signs(n);
  int at_least = 0;
  max_flips = std::max(max_flips, flips);
  // Few examples: every sign pattern once, an exact p-value (its smallest value is 2 / 2^n, as
  // a pattern and its negation give the same statistic: 5 examples can never reach p < 0.05).
  if (n < 31 && (int64_t{1} << n) <= max_flips) {
    const int64_t patterns = int64_t{1} << n;
    for (int64_t bits = 0; bits < patterns; ++bits) {
      for (int64_t i = 0; i < n; ++i) signs[i] = (bits >> i) & 1 ? -1 : 1;
      if (max_score(folds, &signs) >= threshold) ++at_least;
    }
    out.flips = static_cast<int>(patterns);
    out.p_value = static_cast<double>(at_least) / static_cast<double>(patterns);
    return out;
  }
  Rng rng(seed);
  while (out.flips < max_flips) {
    const int batch = std::min(flips, max_flips - out.flips);
    for (int b = 0; b < batch; ++b) {
      draw_signs(rng, signs);
      if (max_score(folds, &signs) >= threshold) ++at_least;
    }
    out.flips += batch;
    if (at_least >= kEnoughExceedances) break;
  }
  out.p_value = (1.0 + at_least) / (1.0 + out.flips);
  return out;
}

GapBands gap_bands(const ClusterTable& t, const std::vector<int>& phases) {
  GapBands b;
  b.z = sidak_z(static_cast<int>(phases.size()));
  std::vector<int> labels(t.y.size());
  for (size_t c = 0; c < labels.size(); ++c) labels[c] = static_cast<int>(c % t.modulus);
  const Folded f = fold_cells(t.y, t.n, t.modulus, labels, t.modulus);
  double max_hi = -INFINITY, min_lo = INFINITY, max_lo = -INFINITY, min_hi = INFINITY;
  double worst_lo = INFINITY, worst_hi = INFINITY;
  for (int r : phases) {
    double n = 0, s = 0, sum = 0, sum2 = 0;
    for (int64_t i = 0; i < t.n; ++i) {
      const double y = t.at(i, r), z = f.at(i, r);
      if (std::isnan(y) || std::isnan(z)) continue;
      n += 1;
      s += y;
      sum += z;
      sum2 += z * z;
    }
    if (n == 0) continue;
    const double mean = sum / n;
    const double var = n > 1 ? std::max(0.0, sum2 - n * mean * mean) / (n - 1) : 0.25;
    // A phase at 0 % or 100 % has no spread of its own to measure; it still has binomial
    // uncertainty (it could be 97 %), which the floor restores.
    const double p = (s + 2) / (n + 4);
    const double floor = s == 0 || s == n ? p * (1 - p) / 2 : 0.0;
    const double se = std::sqrt(std::max(var, floor) / n);
    max_hi = std::max(max_hi, mean + b.z * se);
    min_lo = std::min(min_lo, mean - b.z * se);
    max_lo = std::max(max_lo, mean - b.z * se);
    min_hi = std::min(min_hi, mean + b.z * se);
    const Interval w = wilson_z(s, n, b.z);
    worst_lo = std::min(worst_lo, w.lo);
    worst_hi = std::min(worst_hi, w.hi);
  }
  if (!std::isfinite(max_hi)) return b;
  // Accuracies lie in [0, 1], so no gap exceeds 100 pp whatever the bands say.
  b.gap_pp = {100.0 * std::clamp(max_lo - min_hi, 0.0, 1.0),
              100.0 * std::min(1.0, max_hi - min_lo)};
  b.worst_acc = {worst_lo, worst_hi};
  return b;
}

NullGap null_gap(const ClusterTable& t, int flips, uint64_t seed) {
  NullGap out;
  if (flips <= 0 || t.n == 0) return out;
  std::vector<int> labels(t.y.size());
  for (size_t c = 0; c < labels.size(); ++c) labels[c] = static_cast<int>(c % t.modulus);
  const Folded f = fold_cells(t.y, t.n, t.modulus, labels, t.modulus);
  Rng rng(seed);
  std::vector<int8_t> signs(t.n);
  std::vector<double> gaps;
  gaps.reserve(flips);
  for (int k = 0; k < flips; ++k) {
    draw_signs(rng, signs);
    const FoldStat s = fold_stat(f, nullptr, &signs);
    double hi = -INFINITY, lo = INFINITY;
    for (double m : s.mean)
      if (!std::isnan(m)) hi = std::max(hi, m), lo = std::min(lo, m);
    if (std::isfinite(hi)) gaps.push_back(100.0 * (hi - lo));
  }
  if (gaps.empty()) return out;
  double sum = 0;
  for (double g : gaps) sum += g;
  out.mean_pp = sum / gaps.size();
  std::sort(gaps.begin(), gaps.end());
  out.q95_pp = gaps[std::min(gaps.size() - 1, static_cast<size_t>(0.95 * gaps.size()))];
  return out;
}

}  // namespace phasekv
