// Wall-clock timing for the benchmarks: warm-up runs first (allocator, oneDNN kernel caches), then
// the median of the timed runs, which resists the other jobs sharing a small machine.
#pragma once
#include <functional>
#include <string>

namespace phasekv {

struct Timing {
  double median_s = 0, min_s = 0;
  int reps = 0;
};

// Runs fn `warmup` times untimed, then `reps` times (>= 1) timed.
Timing time_runs(const std::function<void()>& fn, int warmup, int reps);

// The 1-minute load average from /proc/loadavg (-1 if unreadable): printed beside every result so a
// reader can tell a contended machine.
double load_average();

}  // namespace phasekv
