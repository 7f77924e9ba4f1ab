// Files of `phasekv theory` and `phasekv theory sweep`: JSON, CSV and SVG, each written atomically.
#pragma once
#include <string>
#include <vector>

#include "theory/flow.h"
#include "theory/sweep.h"

namespace phasekv::theory {

// The charts of one flow: each head's mean key weight on its final position r_h and value weight
// on r_h + 1 (gates.svg), the effective numbers of offsets exp(H) of the static key and value
// profiles (concentration.svg), and the per-position accuracy (accuracy.svg), against flow time.
std::string gates_svg(const FlowResult& r);
std::string concentration_svg(const FlowResult& r);
std::string accuracy_svg(const FlowResult& r);

// P(all S - 1 non-final positions covered) against m, one series per (S, N, rho) with Wilson
// intervals, and a dashed line per S for heads that pick positions uniformly and independently.
std::string coverage_svg(const SweepResult& s);

// theory.json, gates.csv, concentration.csv, accuracy.csv and the three charts; returns the paths.
std::vector<std::string> write_flow_outputs(const std::string& dir, const FlowResult& r);
// sweep.json, runs.csv, coverage.csv, coverage.svg; returns the paths.
std::vector<std::string> write_sweep_outputs(const std::string& dir, const SweepResult& s);

}  // namespace phasekv::theory
