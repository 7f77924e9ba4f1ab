#include "suite/plan.h"

#include <algorithm>

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

double fifo_makespan(const std::vector<double>& durations, int jobs, double slowdown) {
  if (jobs < 1) throw Error("fifo_makespan: jobs " + std::to_string(jobs) + " (allowed: >= 1)");
  if (!(slowdown > 0))
    throw Error("fifo_makespan: slowdown " + std::to_string(slowdown) + " (allowed: > 0)");
  // Event by event: the work left of each running job (in seconds alone) shrinks at the rate the
  // number of running jobs allows, until the next one ends and a waiting job takes its slot.
  std::vector<double> running;
  size_t next = 0;
  double now = 0;
  while (next < durations.size() || !running.empty()) {
    while (running.size() < static_cast<size_t>(jobs) && next < durations.size())
      running.push_back(durations[next++]);
    const double rate = running.size() >= 2 ? 1.0 / slowdown : 1.0;
    const double work = *std::min_element(running.begin(), running.end());
    now += work / rate;
    for (double& left : running) left -= work;  // the shortest becomes exactly 0
    running.erase(std::remove_if(running.begin(), running.end(), [](double l) { return l <= 0; }),
                  running.end());
  }
  return now;
}

}  // namespace phasekv
