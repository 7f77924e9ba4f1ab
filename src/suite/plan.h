// `phasekv repro --plan`: the projected wall time of a suite, from a few timed steps of each run
// (train/trainer.h, measure_step_cost) and the suite's own step counts and sweep sizes, for one
// two-thread job and for two one-thread jobs side by side. Pure arithmetic: the timing itself is
// done by the caller, so this file needs no tensors and is tested with made-up costs.
#pragma once
#include <string>
#include <vector>

#include "suite/suite.h"

namespace phasekv {

// Measured costs of one run at one thread count (seconds).
struct RunCost {
  double induction_step_s = 0, task_step_s = 0, eval_example_s = 0;
};

// Projected seconds of one run: training (warm-up steps, task steps, the trainer's periodic
// evaluations) and its sweeps (each padding, plus the depth grid of a depth_grid run; every sweep
// is `examples` logical examples at each of `modulus` phases).
struct RunProjection {
  std::string name;
  double train_s = 0, sweeps_s = 0;
  double total() const { return train_s + sweeps_s; }
};
RunProjection project_run(const Suite& suite, const SuiteRun& run, const RunCost& cost);

// Wall time of running jobs of these durations (each alone on the machine) in this order on `jobs`
// slots, each job taking the first free slot (what run_suite does). While two or more run at once
// each takes `slowdown` x its time alone (they share cores and memory: `repro --plan` measures
// it); a job left running alone runs at full speed, so one run is never slowed down.
double fifo_makespan(const std::vector<double>& durations, int jobs, double slowdown = 1.0);

}  // namespace phasekv
