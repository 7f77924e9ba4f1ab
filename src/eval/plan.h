// How many examples a sweep or an audit needs (`phasekv plan`, docs/STATISTICS.md "Planning").
//
// Two questions, answered by simulating the sweeps that would be run (eval/calibrate.h: examples
// as clusters, the same tests summarize() runs), on a doubling grid of examples per phase:
//  - detect: with a boundary dip of `min_gap` every `stride` phases, how often does the period
//    test reach p < 0.05? The smallest n where that is at least `power`.
//  - certify: with no phase effect at all, how often does the SLA gate pass `--max-gap min_gap`?
//    The smallest n where that is at least `power` (a flat model needs this many examples before
//    a release gate can vouch for it).
// Plain C++ (no libtorch).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

struct PlanRequest {
  int modulus = 24;
  int stride = 8;         // the weak spot's period in the simulated alternative
  double min_gap = 0.10;  // fraction: the smallest gap worth detecting
  double accuracy = 0.8;  // accuracy of the strong phases (the dip sits min_gap below)
  double power = 0.8;     // wanted probability of detecting / certifying
  double icc = 0.5;       // latent within-example correlation (eval/calibrate.h)
  double replica = 0.0;   // prefix-padding replicas (0: in-sequence-like independence)
  int datasets = 200;     // simulated sweeps per grid point
  int max_examples = 3200;
  int min_examples = 25;     // the grid doubles from here
  bool certify = true;       // false: only the detection curve
  bool stride_known = true;  // false: the sweeps are told no stride (a blind audit)
  int threads = 2;
  uint64_t seed = 42;
};

struct PlanPoint {
  int examples = 0;
  double detect = 0.0, detect_se = 0.0;    // P(period test p < 0.05) under the dip
  double certify = 0.0, certify_se = 0.0;  // P(--max-gap min_gap passes) with no phase effect
};

struct Plan {
  PlanRequest request;
  std::vector<PlanPoint> curve;  // ascending examples
  int examples_to_detect = 0;    // 0: not reached up to max_examples
  int examples_to_certify = 0;
  nlohmann::json to_json() const;
};

// Throws phasekv::Error naming the option when a value is out of range (a stride that does not
// fit twice in the modulus, a gap that leaves [0, 1], ...).
void validate(const PlanRequest& r);
Plan plan_examples(const PlanRequest& r);

// The request `sweep --plan` and `audit --plan` simulate: their modulus, their stride (0 or one
// outside [2, M/2]: unknown, so M/2 and no stride told to the tests) and --min-gap (pp).
PlanRequest plan_request_for(int modulus, int stride, double min_gap_pp, int threads = 2);

// With a smallest gap worth detecting (--min-gap, pp > 0): sets s.sensitivity from a simulation
// at s's modulus, examples and mean accuracy (a dip at the stride, or at M/2 when the stride is
// unknown: the period with the fewest dipped phases), and, when the power is below 80 % and the
// data do not rule the gap out, the examples per phase that would reach 80 %. Nothing when
// min_gap_pp <= 0 or M < 4. Throws phasekv::Error naming --min-gap outside (0, 100].
void attach_sensitivity(PhaseSummary& s, double min_gap_pp, int threads, uint64_t seed = 42);

// The plan as text: the curve, the two answers, and what they cost in items (examples x modulus)
// and prompt tokens when tokens_per_item > 0.
std::string plan_text(const Plan& p, int64_t tokens_per_item);

}  // namespace phasekv
