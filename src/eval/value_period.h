// Period detection for a real-valued profile: the counterpart of stats.h's detect_period (which
// takes right/wrong outcomes) for measurements such as the probe's P(correct) - P(wrong) against
// the filler length L, observed in several series (filler families) at integer positions.
//
// For each candidate period P, a one-way analysis of variance of the values on the groups
// (series, position mod P), every series centred on its own mean (a family that is easier
// throughout is not a period): F = (between / df_between) / (within / df_within). The detected
// period is the candidate with the largest F; an exact fit (within = 0, F = inf) and ties go to
// the smallest P, so a period-4 profile, which also fits P = 8 exactly, reports 4.
//
// The p-value permutes each series' values across its positions (valid under the null that the
// position does not matter, whatever the values' distribution) and compares the largest F over
// all candidates, so trying several periods does not inflate it:
// p = (1 + #{permutations with max F >= observed max F}) / (1 + permutations).
//
// Plain C++, no libtorch, like stats.h.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <vector>

namespace phasekv {

struct ValueSeries {
  std::vector<int> positions;  // e.g. filler lengths L (need not be contiguous)
  std::vector<double> values;  // one per position, finite
};

struct ValuePeriodScore {
  int period = 0;
  double f = 0.0;  // +inf for an exact fit with some between-group variance
  int df_between = 0, df_within = 0;
};

struct ValuePeriodDetection {
  int detected = 0;        // 0: no candidate period (too few positions)
  double statistic = 0.0;  // max F over the candidates
  double p_value = 1.0;
  int permutations = 0;
  std::vector<ValuePeriodScore> by_period;  // ascending period
  nlohmann::json to_json() const;
};

// Candidates P in [2, max_period] such that every series with values has at least 2P positions
// (two cycles). Throws phasekv::Error on a series whose positions and values differ in length, a
// non-finite value, or max_period < 2.
ValuePeriodDetection detect_value_period(const std::vector<ValueSeries>& series, int max_period,
                                         int permutations = 1000, uint64_t seed = 12345);

}  // namespace phasekv
