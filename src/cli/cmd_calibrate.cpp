// phasekv calibrate: the false-positive rates, power and interval coverage of phasekv's tests on
// simulated sweeps (eval/calibrate.h), written as JSON and, with --docs, as docs/STATISTICS.md.
#include <fmt/format.h>

#include <chrono>
#include <iostream>
#include <memory>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "eval/calibrate.h"
#include "report/calibration_page.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

struct CalibrateArgs {
  calibrate::Options options;
  bool quick = false;
  std::string out = "runs/calibrate";
  std::string docs;
  bool quiet = false;
};

void run_calibrate(const CalibrateArgs& a) {
  const auto settings = calibrate::default_settings(a.quick);
  calibrate::PageInputs page;
  page.options = a.options;
  page.quick = a.quick;
  page.out = a.out;
  page.command = fmt::format("phasekv calibrate{} --threads {} --seed {} --out {}{}",
                             a.quick ? " --quick" : "", a.options.threads, a.options.seed, a.out,
                             a.docs.empty() ? "" : " --docs " + a.docs);
  const auto start = std::chrono::steady_clock::now();
  for (size_t i = 0; i < settings.size(); ++i) {
    page.results.push_back(calibrate::run_setting(settings[i], a.options, static_cast<int>(i)));
    const auto& r = page.results.back();
    if (!a.quiet)
      std::cerr << fmt::format(
          "[{}/{}] {} M={} S={} given={} gap={:.0f}pp n={} replica={}: period {:.3f}, chi2 "
          "{:.3f}, interior {:.3f}, gap {:.1f} pp ({:.1f} s)\n",
          i + 1, settings.size(), r.setting.group, r.setting.modulus, r.setting.stride,
          r.setting.stride_given, 100 * r.setting.gap, r.setting.examples, r.setting.replica,
          r.period_reject.value(), r.chi_reject.value(), r.interior_reject.value(), r.gap_mean_pp,
          r.seconds);
  }
  page.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  page.cpu = calibrate::describe_cpu();
  ensure_directory(a.out);
  write_file_atomic(a.out + "/calibration.json", calibrate::results_json(page).dump(1) + "\n");
  std::cout << fmt::format("{} settings in {:.0f} s: {}/calibration.json\n", settings.size(),
                           page.seconds, a.out);
  if (!a.docs.empty()) {
    calibrate::write_statistics_page(a.docs, page);
    std::cout << fmt::format("{}/STATISTICS.md, {}/statistics/*.svg\n", a.docs, a.docs);
  }
}

}  // namespace

void register_calibrate(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "calibrate",
      "false-positive rates, power and interval coverage of phasekv's tests on simulated sweeps "
      "(docs/STATISTICS.md)");
  auto a = std::make_shared<CalibrateArgs>();
  cmd->add_flag("--quick", a->quick, "a few small settings (seconds), for tests");
  cmd->add_option("--permutations", a->options.permutations,
                  "permutations per period test inside the simulation")
      ->check(CLI::Range(19, 100000));
  cmd->add_option("--bootstrap-reps", a->options.bootstrap_reps,
                  "bootstrap replicates per summary inside the simulation")
      ->check(CLI::Range(19, 100000));
  cmd->add_option("--threads", a->options.threads, "worker threads (1..64)")
      ->check(CLI::Range(1, 64));
  cmd->add_option("--seed", a->options.seed, "seed of the simulation")->check(non_negative());
  cmd->add_option("--out", a->out, "output directory (calibration.json)")->check(output_dir());
  cmd->add_option("--docs", a->docs,
                  "also write DOCS/STATISTICS.md and DOCS/statistics/*.svg (e.g. docs)");
  cmd->add_flag("--quiet", a->quiet, "no progress lines");
  cmd->callback([a] { run_calibrate(*a); });
}

}  // namespace phasekv::cli
