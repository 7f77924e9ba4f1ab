// `phasekv theory sweep`: many gradient flows over a grid of heads m, stride S, vocabulary N,
// start radius rho and seeds, and the probability that the heads cover every non-final position.
#pragma once
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "theory/flow.h"

namespace phasekv::theory {

struct SweepConfig {
  ModelConfig base;  // every field but heads, stride, vocab, rho and seed
  FlowConfig flow;
  std::vector<int> heads, strides, vocabs;
  std::vector<double> rhos;
  int seeds = 16;  // runs per grid point; run i uses seed seed_for(base.seed, i)
  int jobs = 1;    // runs side by side, one thread each
};

// Throws phasekv::Error naming the flag and its allowed range.
void validate(const SweepConfig& s);

struct SweepRun {
  int heads = 0, stride = 0, vocab = 0, seed_index = 0;
  double rho = 0.0;
  uint64_t seed = 0;
  FlowResult result;  // without records
};

// One grid point (S, N, rho, m) over its seeds.
struct CoverageRow {
  int stride = 0, vocab = 0, heads = 0;
  double rho = 0.0;
  int runs = 0;
  int covered = 0;             // runs with every non-final position covered (by accuracy)
  double p = 0.0, ci_lo = 0.0, ci_hi = 1.0;  // covered / runs, Wilson 95 %
  double baseline = 0.0;       // random_cover_probability(m, S - 1)
  int concentrated = 0;        // runs with every head concentrated
  double mean_distinct = 0.0;  // distinct positions picked by concentrated heads
  double mean_weak = 0.0;      // uncovered non-final positions
  double mean_concentration_time = 0.0;  // over runs that concentrated; 0 when none did
};

struct SweepResult {
  SweepConfig config;
  std::vector<SweepRun> runs;
  std::vector<CoverageRow> rows;
  double seconds = 0.0;
};

// Runs the grid; `progress` (optional) gets one line per finished run.
SweepResult run_sweep(const SweepConfig& s, std::ostream* progress = nullptr);

// Groups runs by (S, N, rho, m) in grid order.
std::vector<CoverageRow> coverage_rows(const std::vector<SweepRun>& runs);

nlohmann::json to_json(const SweepResult& s);
std::string runs_csv(const SweepResult& s);
std::string coverage_csv(const std::vector<CoverageRow>& rows);

}  // namespace phasekv::theory
