#include "perf/timing.h"

#include <algorithm>
#include <chrono>
#include <fstream>
#include <vector>

namespace phasekv {

Timing time_runs(const std::function<void()>& fn, int warmup, int reps) {
  for (int i = 0; i < warmup; ++i) fn();
  std::vector<double> s;
  for (int i = 0; i < std::max(reps, 1); ++i) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(s.begin(), s.end());
  return {s[s.size() / 2], s.front(), static_cast<int>(s.size())};
}

double load_average() {
  std::ifstream f("/proc/loadavg");
  double l = -1;
  return (f >> l) ? l : -1;
}

}  // namespace phasekv
