// phasekv repro: run a reproduction suite (suite/suite.h, suite/runner.h) unattended and
// resumably, or print one command per run for an external scheduler.
#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "suite/report.h"
#include "suite/runner.h"
#include "suite/suite.h"
#include "util/error.h"

namespace phasekv::cli {
namespace {

struct ReproArgs {
  std::string suite, out;
  int jobs = 1;
  std::vector<std::string> only;
  bool print_commands = false;
};

std::string self_binary() {
  std::error_code ec;
  auto p = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw Error("cannot find the phasekv executable (/proc/self/exe): " + ec.message());
  return p.string();
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
  cmd->add_option("--jobs", a->jobs, "runs side by side, one libtorch thread each");
  cmd->add_option("--only", a->only, "run only these runs (by name; repeatable)");
  cmd->add_flag("--print-commands", a->print_commands,
                "print one self-contained command per run (for GNU parallel, Slurm ...)");
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
