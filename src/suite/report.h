// `phasekv repro report DIR`: the suite's results as a Markdown page with SVG figures, generated
// from the run directories (never typed): one table row per run and padding with the study's
// figure beside it, accuracy-by-phase charts for every run, the depth x phase heatmap, and each
// of the study's findings marked reproduced / partly / not reproduced / not tested, with the rule
// that decided it and its evidence.
#pragma once
#include <string>

namespace phasekv {

struct ReproReportOptions {
  std::string suite_dir;  // what `phasekv repro --out` wrote
  std::string out_md;     // e.g. docs/REPRODUCTION.md; figures go to <out_md without .md>/
  std::string command;    // the command line that regenerates the page (shown in it)
};

// Writes the page and its figures (atomically); runs without results yet are listed as pending.
// Returns the number of (run, padding) sweeps found.
int write_repro_report(const ReproReportOptions& o);

}  // namespace phasekv
