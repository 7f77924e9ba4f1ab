// phasekv mitigations: issue 19's comparison of the weak spot's mitigations on a reproduction
// suite (suite/mitigations.h). `report` writes docs/MITIGATIONS.md's generated section and the
// Pareto chart; `commands` prints the inference sweeps the report still lacks.
#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "cli/commands.h"
#include "cli/path_options.h"
#include "config/model_config.h"
#include "perf/model_cost.h"
#include "suite/mitigations.h"
#include "util/cpu_info.h"
#include "util/error.h"

namespace phasekv::cli {
namespace {

// The engine's accounting for one model config (what `phasekv info` and `phasekv bench` use).
ModelCost engine_cost(const nlohmann::json& model, const std::string& where) {
  const ModelConfig m = model_config_from_json(model, where);
  return {cache_bytes_per_token(m, 4096), cache_bytes_per_token(m, 131072),
          forward_flops_per_token(m, 4096)};
}

// The commands are printed for a shell: refuse paths it would split or expand.
void check_plain_path(const std::string& flag, const std::string& path) {
  for (char ch : path)
    if (!(std::isalnum(static_cast<unsigned char>(ch)) || std::string("._/-+").find(ch) != std::string::npos))
      throw Error(fmt::format("{} {}: only letters, digits and ._/-+ are allowed in the printed "
                              "commands' paths",
                              flag, path));
}

}  // namespace

void register_mitigations(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "mitigations", "issue 19: compare the weak spot's mitigations on a reproduction suite");
  cmd->require_subcommand(1);

  struct ReportArgs {
    std::string suite = "runs/repro/study", inference = "runs/mitigations-study";
    std::string out = "docs/MITIGATIONS.md", svg = "docs/mitigations/pareto.svg";
    std::vector<std::string> candidates, only;
  };
  auto r = std::make_shared<ReportArgs>();
  auto* report = cmd->add_subcommand(
      "report", "write the comparison (a generated section of --out) and the Pareto chart");
  report->add_option("--suite", r->suite, "the --out of `phasekv repro` (suite.json, run dirs)");
  report->add_option("--inference", r->inference,
                     "the inference sweeps: DIR/RUN/PADDING/SETTING and DIR/timing/ROUND/SETTING");
  report
      ->add_option("--out", r->out,
                   "Markdown page: the text between its generated-section markers is replaced "
                   "(a new file holds only the section)")
      ->check(output_file());
  report->add_option("--svg", r->svg, "the Pareto chart")->check(output_file());
  report->add_option("--candidates", r->candidates,
                     "the --out of another `phasekv repro` suite whose runs are architecture "
                     "candidates on the baseline's seeds (e.g. configs/repro/mitigations.toml's); "
                     "repeatable");
  report->add_option("--only", r->only,
                     "keep only these candidates' rows besides the baseline (names as in the "
                     "page; repeatable), for a page about a few candidates");
  report->callback([r] {
    MitigationsReportOptions o;
    o.suite_dir = r->suite;
    o.inference_dir = r->inference;
    o.candidate_dirs = r->candidates;
    o.out_md = r->out;
    o.out_svg = r->svg;
    o.command = fmt::format("phasekv mitigations report --suite {} --inference {} --out {} --svg {}",
                            r->suite, r->inference, r->out, r->svg);
    for (const auto& d : r->candidates) o.command += " --candidates " + d;
    for (const auto& n : r->only) o.command += " --only " + n;
    o.only = r->only;
    o.cpu = cpu_description();
    const Comparison c = write_mitigations_report(o, engine_cost);
    int with = 0;
    for (const auto& x : c.candidates) with += !x.sweeps.empty();
    std::cout << fmt::format("wrote {} and {}: {} of {} candidates with results\n", r->out, r->svg,
                             with, c.candidates.size());
  });

  struct CommandArgs {
    std::string suite = "runs/repro/study", inference = "runs/mitigations-study", binary;
    int repeats = 3;
  };
  auto a = std::make_shared<CommandArgs>();
  auto* commands = cmd->add_subcommand(
      "commands", "print the inference sweeps `mitigations report` lacks, one shell command a line");
  commands->add_option("--suite", a->suite, "the --out of `phasekv repro`");
  commands->add_option("--inference", a->inference, "where the sweeps go");
  commands->add_option("--repeats", a->repeats, "timing rounds")->check(CLI::Range(1, 20));
  commands->add_option("--binary", a->binary, "the phasekv in the commands (default: this one)");
  commands->callback([a] {
    std::string binary = a->binary;
    if (binary.empty()) binary = std::filesystem::read_symlink("/proc/self/exe").string();
    check_plain_path("--suite", a->suite);
    check_plain_path("--inference", a->inference);
    check_plain_path("--binary", binary);
    const SuiteResults suite = load_suite_results(a->suite);
    for (const auto& line : inference_sweep_commands(suite, a->suite, a->inference, binary, a->repeats))
      std::cout << line << "\n";
  });
}

}  // namespace phasekv::cli
