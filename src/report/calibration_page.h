// docs/STATISTICS.md and its charts, generated from `phasekv calibrate`'s results
// (eval/calibrate.h). Every number on the page, and every verdict sentence, comes from the
// results passed in; the prose around them explains the simulation and how to read a rate.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/calibrate.h"

namespace phasekv::calibrate {

struct PageInputs {
  std::vector<Result> results;
  Options options;
  bool quick = false;
  std::string command;  // the command line that regenerates the page
  std::string cpu;      // describe_cpu()
  std::string out;      // where calibration.json was written
  double seconds = 0.0;
};

// "Intel(R) Xeon(R) ... (AMX), 2 logical CPUs", from /proc/cpuinfo.
std::string describe_cpu();

// Every result, the options and the machine, as calibration.json holds them.
nlohmann::json results_json(const PageInputs& in);

// The page's Markdown (SVG file names relative to the page: statistics/NAME.svg).
std::string statistics_markdown(const PageInputs& in);

// Writes DIR/STATISTICS.md and DIR/statistics/*.svg.
void write_statistics_page(const std::string& dir, const PageInputs& in);

}  // namespace phasekv::calibrate
