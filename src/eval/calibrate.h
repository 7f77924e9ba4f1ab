// Calibration of phasekv's statistics on simulated sweeps (`phasekv calibrate`, issue 42,
// docs/STATISTICS.md).
//
// A test is only as good as its error rates on data shaped like the data it meets. Real sweeps
// score every example at every phase, so an example is a cluster: an easy example is easy at
// every phase, and under prefix padding phases r and r + S of one example are near copies (the
// W8S8 profile repeats within 0.5 pp every 8 phases). This file simulates such sweeps with known
// per-phase accuracies and runs the very functions a sweep runs (stats.h summarize, detect_period,
// chi_square_homogeneity, sla_gate.h evaluate_sla) on them; nothing here re-implements a test.
//
// The outcome model is a liability-threshold (probit) model, so that the per-phase marginal
// accuracy is exactly the one asked for whatever the within-example correlation:
//   example i: difficulty u_i ~ N(0, icc); outcome at phase r: correct iff
//   u_i + e_ir < Phi^-1(A(r)), e_ir ~ N(0, 1 - icc) independent.
// icc is the latent within-example correlation. With `replica` > 0 (prefix-padding replicas of
// stride S), the outcome at phase r >= S is, with probability `replica`, a copy of the outcome at
// r - S; otherwise it is drawn as above. A copy keeps the marginal accuracy whenever A is
// periodic in S (every profile here with replicas is), but makes an example's outcomes depend on
// r mod S: no population phase effect, yet outcomes that are not exchangeable across phases.
//
// Torch-free and deterministic: dataset k of setting j draws from its own seed, so results do
// not depend on the number of threads.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/stats.h"

namespace phasekv::calibrate {

enum class Profile {
  flat,      // A(r) = top at every phase: the null
  boundary,  // A(r) = top - gap where r mod S == S - 1
  interior,  // A(r) = top - gap where r mod S == 1 (one interior phase)
};

struct Setting {
  std::string group;  // the table it belongs to: "null", "power", "stride", "null-n"
  int modulus = 24;
  int stride = 8;        // the true S (profile and replicas)
  int stride_given = 8;  // what summarize() is told: S, or 0 (unknown)
  Profile profile = Profile::flat;
  double top = 0.5;  // accuracy of the strong phases
  double gap = 0.0;  // fraction
  double icc = 0.5;
  double replica = 0.0;  // P(outcome at r copies r - S)
  int examples = 100;
  int datasets = 1000;
};

struct Options {
  int permutations = 199;     // per detect_period call (p < 0.05 <=> at most 8 of 199 exceed)
  int bootstrap_reps = 200;   // per summarize call (bias-corrected gap)
  int period_bootstrap = 50;  // example resamples for the detected period's support ("stride")
  int threads = 2;
  uint64_t seed = 42;
  std::vector<double> sla_max_gap_pp = {3, 5, 10};
};

// A rate over datasets with its Monte-Carlo standard error sqrt(p (1 - p) / N).
struct Rate {
  int64_t hits = 0, n = 0;
  double value() const { return n ? static_cast<double>(hits) / n : NAN; }
  double se() const;
};

struct Result {
  Setting setting;
  std::vector<double> true_acc;         // A(r), r in [0, M)
  double true_gap_pp = 0.0;             // max - min of A, pp
  Rate period_reject;                   // detect_period p < 0.05
  Rate period_is_stride;                // p < 0.05 and detected == stride
  std::vector<int64_t> detected_count;  // index P: datasets with p < 0.05 and detected == P
  Rate chi_reject;                      // chi_square_homogeneity p < 0.05 (all M phases)
  Rate interior_reject;           // the interior sign-flip test (summary); n = 0: not applicable
  Rate stride_component_reject;   // "period = S": the S-fold is not flat (p < 0.05)
  Rate stride_supported;          // ... and the residual test does not reject
  double gap_bc_mean_pp = 0.0;    // mean bias-corrected gap
  double null_gap_mean_pp = 0.0;  // mean of the summaries' null gap
  double mean_support = 0.0;      // mean bootstrap support of the detected period
  std::vector<Rate> sla_fail;     // per Options::sla_max_gap_pp: evaluate_sla fails
  double gap_mean_pp = 0.0, gap_se_pp = 0.0;  // observed gap (summary.gap_pp)
  Rate gap_covered;                           // gap_ci_pp contains true_gap_pp
  Rate gap_ci_excludes_point;                 // gap_pp outside its own interval
  double seconds = 0.0;
  nlohmann::json to_json(const Options& o) const;
};

// Per-phase accuracies of a setting's profile.
std::vector<double> true_profile(const Setting& s);

// One simulated sweep: every example at every phase, (example, phase)-ordered.
std::vector<PhaseOutcome> simulate(const Setting& s, const std::vector<double>& acc, uint64_t seed);

// Runs one setting: `datasets` simulated sweeps, each summarised as `phasekv sweep` does.
Result run_setting(const Setting& s, const Options& o, int index);

// The study's settings. quick: a few small settings for tests (seconds).
std::vector<Setting> default_settings(bool quick);

}  // namespace phasekv::calibrate
