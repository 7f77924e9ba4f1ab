// phasekv repro: run a reproduction suite (suite/suite.h, suite/runner.h) unattended and
// resumably, print one command per run for an external scheduler, or project its wall time.
#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <iostream>
#include <thread>

#include "cli/commands.h"
#include "cli/path_options.h"
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
  // One one-thread job per usable core: `repro --plan` measured two one-thread jobs 1.5x faster
  // than one two-thread job on 2 cores (docs/PERFORMANCE.md, "Suite throughput").
  int jobs = std::min(256, usable_cores());
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

// Times each run at one thread and at one thread per usable core, and the first run as `jobs`
// one-thread copies side by side (what --jobs does to each job's speed), then projects the suite
// both ways. Cores are the CPU affinity's (`taskset -c 1`: 1), not the machine's.
void print_plan(const Suite& s, const std::vector<const SuiteRun*>& runs, int jobs, int reps) {
  if (runs.empty()) throw Error("--plan: no run selected");
  const int cores = usable_cores();
  std::cout << fmt::format("repro --plan {}: median of {} steps per run after 2 untimed, on {}\n",
                           s.name, reps, cpu_description());
  const std::string many_header = cores >= 2 ? fmt::format("{} threads", cores) : "";
  std::cout << fmt::format("{:<24} {:>13} {:>13} {:>13} {:>11} {:>11}\n", "run", "warm-up ms/st",
                           "task ms/step", "eval ms/ex", "1 thread", many_header);
  std::vector<double> one, many;
  for (const auto* r : runs) {
    const RunCost c1 = measured(*r, s, 1, reps);
    const RunProjection p1 = project_run(s, *r, c1);
    one.push_back(p1.total());
    std::string many_text;
    if (cores >= 2) {
      many.push_back(project_run(s, *r, measured(*r, s, cores, reps)).total());
      many_text = format_duration(many.back());
    }
    std::cout << fmt::format("{:<24} {:>13.1f} {:>13.1f} {:>13.3f} {:>11} {:>11}\n", r->name,
                             1e3 * c1.induction_step_s, 1e3 * c1.task_step_s,
                             1e3 * c1.eval_example_s, format_duration(p1.total()), many_text);
  }
  // One-thread jobs side by side share the cores and the memory system: time that on the first
  // run, as that many threads of this process (libtorch runs each one's ops inline at one
  // thread). Only when two or more can run at once: a single run is never slowed down.
  const int side = std::min(jobs, static_cast<int>(runs.size()));
  double slowdown = 1;
  if (side >= 2) {
    std::vector<RunCost> costs(static_cast<size_t>(side));
    std::vector<std::thread> th;
    for (int i = 0; i < side; ++i)
      th.emplace_back([&, i] { costs[static_cast<size_t>(i)] = measured(*runs[0], s, 1, reps); });
    for (auto& t : th) t.join();
    const double solo = project_run(s, *runs[0], measured(*runs[0], s, 1, reps)).total();
    double together = 0;
    for (const RunCost& c : costs) together += project_run(s, *runs[0], c).total() / side;
    slowdown = together / solo;
    std::cout << fmt::format(
        "{} one-thread jobs side by side: each runs x{:.2f} the time it takes alone ({})\n", side,
        slowdown, runs[0]->name);
  }
  const double jobs_wall = fifo_makespan(one, jobs, slowdown);
  std::string line =
      fmt::format("projected wall time of {} run{}: --jobs {} (one thread each) {}", runs.size(),
                  runs.size() == 1 ? "" : "s", jobs, format_duration(jobs_wall));
  if (cores >= 2) {
    const double one_job = fifo_makespan(many, 1);
    line += fmt::format("; one job at {} threads {} -> {}", cores, format_duration(one_job),
                        jobs_wall <= one_job ? fmt::format("--jobs {} is faster", jobs)
                                             : fmt::format("one {}-thread job is faster", cores));
  } else {
    line += " (1 usable core: one thread at a time)";
  }
  std::cout << line << "\n";
}

void run_repro(const ReproArgs& a) {
  if (a.suite.empty()) throw Error("--suite FILE is required (or: phasekv repro report DIR)");
  if (a.out.empty()) throw Error("--out DIR is required");
  if (a.jobs < 1 || a.jobs > 256)  // --plan projects --jobs too
    throw Error("--jobs is " + std::to_string(a.jobs) + " (allowed: 1..256)");
  const Suite suite = load_suite(a.suite);
  SuiteOptions o;
  o.out_dir = a.out;
  o.binary = self_binary();
  o.jobs = a.jobs;
  o.only = a.only;
  o.progress = &std::cerr;
  if (a.plan) {
    print_plan(suite, selected_runs(suite, a.only), a.jobs, a.plan_reps);
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
  cmd->add_option("--suite", a->suite, "suite file (TOML), e.g. configs/repro/study.toml")
      ->transform(bundled_path());
  cmd->add_option("--out", a->out, "output directory (finished steps are skipped on a rerun)")
      ->check(output_dir());
  cmd->add_option("--jobs", a->jobs,
                  "runs side by side, one libtorch thread each (default: one per core this "
                  "process may use, its CPU affinity's)");
  cmd->add_option("--only", a->only, "run only these runs (by name; repeatable)");
  cmd->add_flag("--print-commands", a->print_commands,
                "print one self-contained command per run (for GNU parallel, Slurm ...)");
  cmd->add_flag("--plan", a->plan,
                "time a few training steps of each run and print the projected wall time of "
                "--jobs N (one thread each) and of one job at a thread per core; trains "
                "nothing");
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
  report->add_option("--out", *md, "the page; figures go to a folder named after it")
      ->check(output_file());
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
