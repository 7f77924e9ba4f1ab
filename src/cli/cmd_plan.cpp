// phasekv plan: the examples a sweep or audit needs to detect a gap, or to certify its absence
// with the SLA gate, by simulating the sweeps (eval/plan.h), and what they cost in items.
#include <fmt/format.h>

#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "eval/plan.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

struct PlanArgs {
  PlanRequest request;
  double min_gap_pp = 10.0;
  int64_t tokens_per_item = 0;
  std::string json_out;
};

void run_plan(PlanArgs& a) {
  a.request.min_gap = a.min_gap_pp / 100.0;
  const Plan p = plan_examples(a.request);
  std::cout << plan_text(p, a.tokens_per_item);
  if (!a.json_out.empty()) {
    write_file_atomic(a.json_out, p.to_json().dump(1) + "\n");
    std::cout << "wrote " << a.json_out << "\n";
  }
}

}  // namespace

void register_plan(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "plan",
      "examples per phase needed to detect a gap (period test) or to certify a flat model (SLA "
      "gate), by simulation (docs/STATISTICS.md)");
  auto a = std::make_shared<PlanArgs>();
  PlanRequest& r = a->request;
  cmd->add_option("--modulus", r.modulus, "M: phases per example");
  cmd->add_option("--stride", r.stride, "period of the weak spot to detect (2..M/2)");
  cmd->add_option("--min-gap", a->min_gap_pp, "smallest gap worth detecting, percentage points");
  cmd->add_option("--accuracy", r.accuracy, "accuracy of the strong phases (fraction)");
  cmd->add_option("--power", r.power, "wanted probability, e.g. 0.8");
  cmd->add_option("--icc", r.icc, "latent within-example correlation (0.5 as in calibrate)");
  cmd->add_option("--replica", r.replica,
                  "prefix-padding replicas: P(phase r + S copies phase r), 0 for in-sequence");
  cmd->add_option("--datasets", r.datasets, "simulated sweeps per grid point");
  cmd->add_option("--max-examples", r.max_examples, "largest examples per phase tried");
  cmd->add_option("--threads", r.threads, "worker threads (1..64)")->check(CLI::Range(1, 64));
  cmd->add_option("--seed", r.seed, "seed of the simulation")->check(non_negative());
  cmd->add_option("--tokens-per-item", a->tokens_per_item,
                  "prompt tokens per scored item, for the cost (an audit's --dry-run prints it)");
  cmd->add_option("--json", a->json_out, "also write the plan as JSON to this file");
  cmd->callback([a] { run_plan(*a); });
}

}  // namespace phasekv::cli
