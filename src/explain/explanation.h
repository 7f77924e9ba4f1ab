// `phasekv explain report`: docs/EXPLANATION.md, generated from the output directories of
// `phasekv knockout`, `gates` and `gate-cycle` (their knockout.json, gates.json and
// gate_cycle.json). Every statement carries its figure and CI from those files, every figure
// names the command that measured it and the CPU; negative results are printed like positive
// ones. Rerunning the command regenerates the page.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace phasekv {

struct ExplanationOptions {
  std::vector<std::string> dirs;  // analysis output directories
  std::string out;                // the Markdown file
  std::string figures;            // where SVGs are copied; "" = <out without .md>/
  std::string notes;              // optional Markdown included verbatim
  std::string command;            // the command that generated the page
};

// One loaded analysis: which kind, its summary JSON, and the figures (file names in its dir).
struct LoadedAnalysis {
  std::string kind;  // "knockout" | "gates" | "gate_cycle"
  std::string dir;
  nlohmann::json summary;
  std::vector<std::string> figures;
};

// Reads the analysis in `dir`; throws phasekv::Error naming the directory when it holds none of
// knockout.json, gates.json, gate_cycle.json.
LoadedAnalysis load_analysis(const std::string& dir);

// The page. figure_links[i][k] is the link (relative to the page) of analyses[i].figures[k].
std::string explanation_markdown(const std::vector<LoadedAnalysis>& analyses,
                                 const std::vector<std::vector<std::string>>& figure_links,
                                 const std::string& notes, const std::string& command);

// Loads the directories, copies the figures, writes the page (atomically).
void write_explanation(const ExplanationOptions& o);

}  // namespace phasekv
