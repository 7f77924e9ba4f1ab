#include "eval/value_period.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <string>

#include "util/error.h"
#include "util/rng.h"

namespace phasekv {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

// F of the grouping (series, position mod P), each series centred on its own mean.
ValuePeriodScore score(const std::vector<ValueSeries>& series, int period) {
  ValuePeriodScore s;
  s.period = period;
  double between = 0, within = 0, total = 0;
  int n = 0, groups = 0, nonempty_series = 0;
  for (const ValueSeries& v : series) {
    if (v.values.empty()) continue;
    ++nonempty_series;
    double mean = 0;
    for (double x : v.values) mean += x;
    mean /= static_cast<double>(v.values.size());
    std::vector<double> sum(static_cast<size_t>(period), 0.0);
    std::vector<int> count(static_cast<size_t>(period), 0);
    for (size_t i = 0; i < v.values.size(); ++i) {
      const int r = ((v.positions[i] % period) + period) % period;
      sum[static_cast<size_t>(r)] += v.values[i];
      ++count[static_cast<size_t>(r)];
      total += (v.values[i] - mean) * (v.values[i] - mean);
    }
    for (int r = 0; r < period; ++r) {
      if (count[static_cast<size_t>(r)] == 0) continue;
      ++groups;
      const double m = sum[static_cast<size_t>(r)] / count[static_cast<size_t>(r)];
      between += count[static_cast<size_t>(r)] * (m - mean) * (m - mean);
    }
    n += static_cast<int>(v.values.size());
  }
  within = std::max(0.0, total - between);
  s.df_between = groups - nonempty_series;
  s.df_within = n - groups;
  if (s.df_between <= 0 || s.df_within <= 0) return s;
  // Rounding: a within-group sum this small against the total is an exact fit.
  if (within <= 1e-12 * std::max(total, 1e-300))
    s.f = between > 0 ? kInf : 0.0;
  else
    s.f = (between / s.df_between) / (within / s.df_within);
  return s;
}

std::vector<ValuePeriodScore> score_all(const std::vector<ValueSeries>& series,
                                        const std::vector<int>& periods) {
  std::vector<ValuePeriodScore> out;
  for (int p : periods) out.push_back(score(series, p));
  return out;
}

double max_f(const std::vector<ValuePeriodScore>& scores) {
  double m = 0;
  for (const auto& s : scores) m = std::max(m, s.f);
  return m;
}

}  // namespace

nlohmann::json ValuePeriodDetection::to_json() const {
  nlohmann::json by = nlohmann::json::array();
  // F = inf (an exact fit) is written as the string "inf": JSON has no infinity.
  auto number = [](double x) -> nlohmann::json {
    if (std::isinf(x)) return "inf";
    return x;
  };
  for (const auto& s : by_period)
    by.push_back({{"period", s.period},
                  {"f", number(s.f)},
                  {"df_between", s.df_between},
                  {"df_within", s.df_within}});
  return {{"detected", detected == 0 ? nlohmann::json() : nlohmann::json(detected)},
          {"statistic", number(statistic)},
          {"p_value", p_value},
          {"permutations", permutations},
          {"test", "max over periods of the one-way ANOVA F of (series, position mod P), each "
                   "series centred; values permuted across positions within each series"},
          {"by_period", by}};
}

ValuePeriodDetection detect_value_period(const std::vector<ValueSeries>& series, int max_period,
                                         int permutations, uint64_t seed) {
  if (max_period < 2)
    throw Error("period detection: the largest candidate period is " + std::to_string(max_period) +
                " (allowed: >= 2)");
  size_t shortest = std::numeric_limits<size_t>::max();
  for (size_t i = 0; i < series.size(); ++i) {
    const ValueSeries& v = series[i];
    if (v.positions.size() != v.values.size())
      throw Error("period detection: series " + std::to_string(i) + " has " +
                  std::to_string(v.positions.size()) + " positions and " +
                  std::to_string(v.values.size()) + " values (allowed: one value per position)");
    for (double x : v.values)
      if (!std::isfinite(x))
        throw Error("period detection: series " + std::to_string(i) +
                    " holds a non-finite value (allowed: finite numbers)");
    if (!v.values.empty()) shortest = std::min(shortest, v.values.size());
  }
  ValuePeriodDetection d;
  if (shortest == std::numeric_limits<size_t>::max()) return d;
  std::vector<int> periods;
  for (int p = 2; p <= max_period && static_cast<size_t>(2 * p) <= shortest; ++p)
    periods.push_back(p);
  if (periods.empty()) return d;
  d.by_period = score_all(series, periods);
  d.statistic = max_f(d.by_period);
  d.detected = d.by_period.front().period;
  double best = d.by_period.front().f;
  for (const auto& s : d.by_period)
    if (s.f > best) best = s.f, d.detected = s.period;  // strict: ties keep the smaller period
  d.permutations = std::max(0, permutations);
  const double threshold =
      std::isinf(d.statistic) ? d.statistic : d.statistic - 1e-9 * std::max(1.0, d.statistic);
  std::mt19937_64 rng(seed);
  std::vector<ValueSeries> shuffled = series;
  int at_least = 0;
  for (int i = 0; i < d.permutations; ++i) {
    for (auto& v : shuffled) shuffle_in_place(v.values, rng);
    if (max_f(score_all(shuffled, periods)) >= threshold) ++at_least;
  }
  d.p_value = (1.0 + at_least) / (1.0 + d.permutations);
  return d;
}

}  // namespace phasekv
