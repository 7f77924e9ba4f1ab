// Least-squares power law y = c * x^k, fitted on (log x, log y): how a cost grows with size.
#pragma once
#include <vector>

namespace phasekv {

struct PowerFit {
  double exponent = 0;  // k
  double scale = 0;     // c
  double r2 = 0;        // of the log-log fit
};

// Needs >= 2 points with distinct x; every x and y must be > 0. Throws Error otherwise.
PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y);

}  // namespace phasekv
