// Engine conformance (issue 41, section 2): the same sweep run through the model in process (the
// reference) and through a served engine under one condition (a micro-batch size, flash attention
// on or off, a split prompt ...), each an ordinary resumable sweep (eval/sweep.h), joined item by
// item. Per phase r: the largest, mean and median |log p_engine(target) - log p_reference(target)|,
// how many items deviate beyond the tolerance, how often the greedy answer changes, and how often
// the task's verdict (right or wrong) changes.
//
// The verdict tells three kinds of engine apart:
//   "conforms within X"    no item deviates by more than the tolerance, no greedy answer changes;
//   "phase-dependent deviation at r = ..."   a port bug tied to the block boundary (an entry
//                          visible a token early) moves every item of some phases: a phase is
//                          flagged when its median deviation exceeds the tolerance and is at least
//                          `phase_factor` times the median of the phases' medians;
//   "deviates at every phase"   engine noise (f16 paths, summation order). Items whose deviation
//                          exceeds the tolerance and `phase_factor` times the typical (median)
//                          deviation outside flagged phases are listed as isolated jumps: with a
//                          top-k indexer, noise that flips one entry's selection moves one item,
//                          not a phase.
// Medians, not maxima, decide the flags, so one jump does not make its phase "phase-dependent".
// Items of the reference without an engine outcome (errors, not yet scored) make the verdict
// "incomplete: N of T items missing; so far ...", never a whole one.
// Plain C++ (no libtorch).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/runner.h"

namespace phasekv {

struct ConformPhase {
  int r = 0;
  int64_t n = 0;       // items scored by both
  int64_t scored = 0;  // of them, with both target log-probabilities (max and mean are over these)
  double max_dlogprob = 0.0, mean_dlogprob = 0.0, median_dlogprob = 0.0;
  int64_t beyond_tolerance = 0;  // scored items deviating by more than the tolerance
  int64_t greedy_flips = 0, verdict_flips = 0;
};

struct ConformSummary {
  std::string condition;
  int modulus = 0;
  double tolerance = 0.0;
  std::vector<ConformPhase> phases;
  double max_dlogprob = 0.0;
  int64_t items = 0, greedy_flips = 0, verdict_flips = 0;
  int64_t missing = 0;  // reference items without an engine record (or either failed)
  // Items both scored whose target log-probability one of them could not give (outside a
  // server's top-n): their greedy answers and verdicts are compared, the deviation is unknown.
  int64_t censored = 0;
  std::vector<int> flagged;       // phases with a phase-dependent deviation
  double typical_dlogprob = 0.0;  // the median deviation over every scored item
  struct Jump {
    int64_t example = 0;
    int r = 0;
    double dlogprob = 0.0;
  };
  std::vector<Jump> jumps;  // isolated jumps outside flagged phases, largest first
  std::string verdict;
  nlohmann::json to_json() const;
};

struct ConformOptions {
  double tolerance = 1e-3;     // nats of target log-probability
  double phase_factor = 10.0;  // a flagged phase (a jump) deviates this many times the typical
};

// Joins the two runs' latest records of `modulus` phases on (example, phase): a failed or absent
// record counts as missing, one without a target log-probability as censored. Throws
// phasekv::Error when the runs share no scored item.
ConformSummary conform_summary(const RunResult& reference, const RunResult& engine,
                               const std::string& condition, int modulus,
                               const ConformOptions& o = {});

}  // namespace phasekv
