#include "perf/fit.h"

#include <cmath>

#include "util/error.h"

namespace phasekv {

PowerFit fit_power_law(const std::vector<double>& x, const std::vector<double>& y) {
  if (x.size() != y.size() || x.size() < 2)
    throw Error("fit_power_law: need >= 2 (x, y) pairs of equal count, got " +
                std::to_string(x.size()) + " and " + std::to_string(y.size()));
  const double n = double(x.size());
  double sx = 0, sy = 0;
  std::vector<double> lx, ly;
  for (size_t i = 0; i < x.size(); ++i) {
    if (!(x[i] > 0) || !(y[i] > 0)) throw Error("fit_power_law: x and y must be > 0");
    lx.push_back(std::log(x[i]));
    ly.push_back(std::log(y[i]));
    sx += lx.back();
    sy += ly.back();
  }
  const double mx = sx / n, my = sy / n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t i = 0; i < lx.size(); ++i) {
    sxx += (lx[i] - mx) * (lx[i] - mx);
    sxy += (lx[i] - mx) * (ly[i] - my);
    syy += (ly[i] - my) * (ly[i] - my);
  }
  if (sxx == 0) throw Error("fit_power_law: all x are equal");
  PowerFit f;
  f.exponent = sxy / sxx;
  f.scale = std::exp(my - f.exponent * mx);
  f.r2 = syy > 0 ? sxy * sxy / (sxx * syy) : 1.0;
  return f;
}

}  // namespace phasekv
