// phasekv repro: run a reproduction suite (suite/suite.h, suite/runner.h) unattended and
// resumably, print one command per run for an external scheduler, or project its wall time.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "suite/plan.h"
#include "suite/report.h"
#include "suite/runner.h"
#include "suite/suite.h"
#include "train/trainer.h"
#include "util/cpu_info.h"
#include "util/duration.h"
#include "util/error.h"

namespace phasekv::cli {
namespace {

struct ReproArgs {
  std::string suite, out;
  // One one-thread job per core: `repro --plan` measured two one-thread jobs 1.5x faster than one
  // two-thread job on 2 cores (docs/PERFORMANCE.md, "Suite throughput").
  int jobs = std::min(256, static_cast<int>(std::max(1u, std::thread::hardware_concurrency())));
  std::vector<std::string> only;
  bool print_commands = false;
  bool plan = false;
  int plan_reps = 5;
};

std::string self_binary() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the phasekv executable (/proc/self/exe): " + ec.message());
  return p.string();
}

RunCost measured(const SuiteRun& r, const Suite& s, int threads, int reps) {
  TrainConfig cfg = train_config_from_json(r.config, s.path + ": run '" + r.name + "'", "");
  cfg.train.threads = threads;
  const StepCost c = measure_step_cost(cfg, /*warmup=*/2, reps);
  return {c.induction_s, c.task_s, c.eval_example_s};
}

// Times each run at one and at two threads, and two one-thread copies of the first run side by
// side (what --jobs 2 does to each job's speed), then projects the suite both ways.
void print_plan(const Suite& s, const std::vector<const SuiteRun*>& runs, int reps) {
  if (runs.empty()) throw Error("--plan: no run selected");
  std::cout << fmt::format("repro --plan {}: median of {} steps per run after 2 untimed, on {}\n",
                           s.name, reps, cpu_description());
  std::cout << fmt::format("{:<24} {:>13} {:>13} {:>13} {:>11} {:>11}\n", "run",
                           "warm-up ms/st", "task ms/step", "eval ms/ex", "1 thread", "2 threads");
  std::vector<double> one, two;
  for (const auto* r : runs) {
    const RunCost c1 = measured(*r, s, 1, reps), c2 = measured(*r, s, 2, reps);
    const RunProjection p1 = project_run(s, *r, c1), p2 = project_run(s, *r, c2);
    one.push_back(p1.total());
    two.push_back(p2.total());
    std::cout << fmt::format("{:<24} {:>13.1f} {:>13.1f} {:>13.3f} {:>11} {:>11}\n", r->name,
                             1e3 * c1.induction_step_s, 1e3 * c1.task_step_s,
                             1e3 * c1.eval_example_s, format_duration(p1.total()),
                             format_duration(p2.total()));
  }
  // Two one-thread jobs share the memory system: time that on the first run, in two threads of
  // this process (libtorch runs each one's ops inline at one thread).
  double side_by_side = 0;
  {
    std::vector<RunCost> pair(2);
    std::vector<std::thread> th;
    for (int i = 0; i < 2; ++i)
      th.emplace_back([&, i] { pair[i] = measured(*runs[0], s, 1, reps); });
    for (auto& t : th) t.join();
    const double solo = project_run(s, *runs[0], measured(*runs[0], s, 1, reps)).total();
    side_by_side = 0.5 * (project_run(s, *runs[0], pair[0]).total() +
                          project_run(s, *runs[0], pair[1]).total()) / solo;
  }
  for (double& d : one) d *= side_by_side;
  const double jobs2 = fifo_makespan(one, 2), jobs1 = fifo_makespan(two, 1);
  std::cout << fmt::format(
      "two one-thread jobs side by side: each runs x{:.2f} the time it takes alone ({})\n"
      "projected wall time of {} runs: --jobs 2 (one thread each) {}; one job at two threads {}"
      " -> {}\n",
      side_by_side, runs[0]->name, runs.size(), format_duration(jobs2), format_duration(jobs1),
      jobs2 <= jobs1 ? "--jobs 2 is faster" : "one two-thread job is faster");
}

void run_repro(const ReproArgs& a) {
  if (a.suite.empty()) throw Error("--suite FILE is required (or: phasekv repro report DIR)");
  if (a.out.empty()) throw Error("--out DIR is required");
  const Suite suite = load_suite(a.suite);
  SuiteOptions o;
  o.out_dir = a.out;
  o.binary = self_binary();
  o.jobs = a.jobs;
  o.only = a.only;
  o.progress = &std::cerr;
  if (a.plan) {
    print_plan(suite, selected_runs(suite, a.only), a.plan_reps);
    return;
  }
  if (a.print_commands) {
    for (const auto& c : suite_commands(suite, o)) std::cout << c << "\n";
    return;
  }
  const int failed = run_suite(suite, o);
  if (failed > 0)
    throw Error(std::to_string(failed) + " run(s) failed; their logs are in " + a.out +
                "/<run>/*.log; rerun the same command to retry them (finished steps are kept)");
}

}  // namespace

void register_repro(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "repro", "run a reproduction suite: train every run, then sweep it (resumable)");
  auto a = std::make_shared<ReproArgs>();
  cmd->add_option("--suite", a->suite, "suite file (TOML), e.g. configs/repro/study.toml");
  cmd->add_option("--out", a->out, "output directory (finished steps are skipped on a rerun)");
  cmd->add_option("--jobs", a->jobs, "runs side by side, one libtorch thread each (default: one per core)");
  cmd->add_option("--only", a->only, "run only these runs (by name; repeatable)");
  cmd->add_flag("--print-commands", a->print_commands,
                "print one self-contained command per run (for GNU parallel, Slurm ...)");
  cmd->add_flag("--plan", a->plan,
                "time a few training steps of each run and print the projected wall time of "
                "--jobs 2 (one thread each) and of one two-thread job; trains nothing");
  cmd->add_option("--plan-reps", a->plan_reps, "timed steps per run and thread count (>= 1)")
      ->check(CLI::PositiveNumber);
  // `repro report DIR` also completes `repro`: its own callback must then do nothing.
  cmd->callback([a, cmd] {
    if (!cmd->got_subcommand("report")) run_repro(*a);
  });

  auto* report = cmd->add_subcommand(
      "report", "write the suite's results page (Markdown + SVG figures) from its run directories");
  auto dir = std::make_shared<std::string>();
  auto md = std::make_shared<std::string>("docs/REPRODUCTION.md");
  report->add_option("dir", *dir, "the --out of `phasekv repro`")->required();
  report->add_option("--out", *md, "the page; figures go to a folder named after it");
  report->callback([dir, md] {
    ReproReportOptions o;
    o.suite_dir = *dir;
    o.out_md = *md;
    o.command = "phasekv repro report " + *dir + " --out " + *md;
    const int n = write_repro_report(o);
    std::cout << "wrote " << *md << " (" << n << " sweeps)\n";
  });
}

}  // namespace phasekv::cli
