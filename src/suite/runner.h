// Runs a suite (suite/suite.h) unattended and resumably. Each run is a sequence of steps, each
// one `phasekv` command in a child process (one libtorch thread each, so `--jobs N` runs N side
// by side), and each step leaves a marker when it succeeds:
//
//   OUT/suite.json                     the parsed suite (what `repro report` reads)
//   OUT/NAME/config.json               the run's resolved training config
//   OUT/NAME/model/                    `phasekv train` (checkpointed: an interrupted run resumes)
//   OUT/NAME/sweep-PADDING/            `phasekv sweep`, M = the suite's modulus (resumable)
//   OUT/NAME/depth-D/                  depth_grid runs: prefix sweeps with the target at depth D
//   OUT/NAME/*.log                     each step's output
//   OUT/NAME/run.done                  every step done: the CPU and wall time (JSON); what
//                                      scripts/keep-runs.sh keeps in git across machines
//
// A finished step is skipped on a rerun; a run directory whose config.json differs from the
// suite's resolved config is an error (the suite file changed: use another OUT).
#pragma once
#include <iosfwd>
#include <string>
#include <vector>

#include "suite/suite.h"

namespace phasekv {

struct SuiteOptions {
  std::string out_dir;
  std::string binary;  // the phasekv executable the steps run
  int jobs = 1;        // runs side by side
  std::vector<std::string> only;  // run names; empty = all
  std::ostream* progress = nullptr;
};

struct SuiteStep {
  std::string label;              // "train", "sweep-prefix", "depth-0.5" ...
  std::vector<std::string> argv;  // argv[0] = the binary
  std::string done_marker;        // exists when the step has finished
  std::string log;                // where its output goes
};

// The runs `--only` selects, in suite order (all when `only` is empty); an unknown name throws.
std::vector<const SuiteRun*> selected_runs(const Suite& suite, const std::vector<std::string>& only);

// OUT/NAME/run.done.
std::string run_done_path(const SuiteOptions& o, const SuiteRun& run);

// The steps of one run, in order (a train step carries --resume when a checkpoint exists).
std::vector<SuiteStep> run_steps(const Suite& suite, const SuiteRun& run, const SuiteOptions& o);

// Writes OUT/suite.json and each run's config.json (checking an existing one), then executes the
// pending steps; returns the number of runs that failed (their logs say why; the others go on).
int run_suite(const Suite& suite, const SuiteOptions& o);

// One self-contained shell command per run (`phasekv repro --suite FILE --out OUT --only NAME`),
// for an external scheduler (GNU parallel over ssh, a Slurm array).
std::vector<std::string> suite_commands(const Suite& suite, const SuiteOptions& o);

}  // namespace phasekv
