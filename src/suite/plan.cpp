#include "suite/plan.h"

#include <algorithm>
#include <functional>
#include <queue>

#include "util/error.h"

namespace phasekv {

RunProjection project_run(const Suite& s, const SuiteRun& r, const RunCost& c) {
  const auto& t = r.config.at("train");
  const int steps = t.value("steps", 1000), warm = std::min(steps, t.value("induction_steps", 0));
  const int eval_every = std::max(1, t.value("eval_every", 500));
  // The trainer evaluates every eval_every steps and once more at the end when that is off-grid.
  const int evals = steps / eval_every + (steps % eval_every != 0 ? 1 : 0);
  RunProjection p;
  p.name = r.name;
  p.train_s = warm * c.induction_step_s + (steps - warm) * c.task_step_s +
              evals * t.value("eval_examples", 256) * c.eval_example_s;
  const size_t sweeps = s.paddings.size() + (r.depth_grid ? s.depths.size() : 0);
  p.sweeps_s = static_cast<double>(sweeps) * s.examples * s.modulus * c.eval_example_s;
  return p;
}

double fifo_makespan(const std::vector<double>& durations, int jobs) {
  if (jobs < 1) throw Error("fifo_makespan: jobs " + std::to_string(jobs) + " (allowed: >= 1)");
  // Each slot's finishing time; the next job goes to the slot that frees first.
  std::priority_queue<double, std::vector<double>, std::greater<>> slots;
  for (int i = 0; i < jobs; ++i) slots.push(0.0);
  double end = 0;
  for (double d : durations) {
    const double start = slots.top();
    slots.pop();
    slots.push(start + d);
    end = std::max(end, start + d);
  }
  return end;
}

}  // namespace phasekv
