// Bounds on thread counts from flags and config keys: a count far above the cores only costs
// (`--threads 100000` made thousands of threads, load 228 on 2 cores), a negative one is a typo.
#pragma once
#include <algorithm>
#include <cstdint>
#include <string>
#include <thread>

#include "util/error.h"

namespace phasekv {

// Most compute (libtorch) threads accepted: 8 per core, at most 1024.
inline int max_compute_threads() {
  const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::min(1024, 8 * cores);
}

// Most HTTP worker threads (`serve --threads`): mostly idle connection holders, so not tied to
// the cores.
inline constexpr int kMaxHttpThreads = 1024;

// "" when n is a valid compute thread count (0 = all cores), else why not.
inline std::string compute_threads_problem(int64_t n) {
  if (n >= 0 && n <= max_compute_threads()) return "";
  return std::to_string(n) + " is not an allowed thread count (allowed: 0.." +
         std::to_string(max_compute_threads()) + ", 0 = all cores; at most 8 per core)";
}

// Throws phasekv::Error naming `what` (a flag or config key) when n is not a valid count.
inline void check_compute_threads(int64_t n, const std::string& what) {
  const std::string p = compute_threads_problem(n);
  if (!p.empty()) throw Error(what + ": " + p);
}

}  // namespace phasekv
