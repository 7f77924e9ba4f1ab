// Renderers for phase summaries: CSV, SVG chart, self-contained HTML report and terminal text.
//
// Every renderer returns a string so the CLI decides where it goes; write_sweep_outputs is the
// one function that touches the file system. Nothing here loads external resources (no fonts,
// scripts or stylesheets from the network): a report must open on an offline machine and stay
// readable when archived next to its results.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

// Several labelled summaries shown together (`phasekv compare`, or one series for a sweep).
using PhaseSeries = std::vector<std::pair<std::string, PhaseSummary>>;

// Header `r,n,acc,ci_lo,ci_hi`, one row per phase, accuracies as fractions.
std::string phase_csv(const PhaseSummary& summary);

// Per-phase accuracy with Wilson error bars, a dashed mean line per series, window boundaries
// (dotted, at multiples of the stride when known) and a legend when there are several series.
// A standalone SVG document; throws phasekv::Error on an empty series list.
std::string phase_svg(const PhaseSeries& series, const std::string& title);

// Self-contained HTML: meta, summary table, chart, per-phase and period-detection tables.
// `meta` is free-form (model, backend, config hash ...); an object is shown key by key.
std::string report_html(const PhaseSeries& series, const std::string& title,
                        const nlohmann::json& meta);
std::string report_html(const std::string& label, const PhaseSummary& summary,
                        const nlohmann::json& meta);

// Compact text for a terminal: per-phase n / acc / CI with a bar, then mean, best, worst, gap
// with CI, interior / boundary, period with p-value and the chi-square test.
std::string terminal_table(const PhaseSummary& summary, const std::string& label);

// One row per series: label, M, S, examples, mean, worst, gap with CI, period and p.
std::string compare_table(const PhaseSeries& series);

// Writes summary.json (to_json() plus "label" and "meta"), phase.csv, phase.svg and report.html
// into `dir` (created if missing), each atomically.
void write_sweep_outputs(const std::string& dir, const std::string& label,
                         const PhaseSummary& summary, const nlohmann::json& meta);

// Text pieces shared by the renderers (and handy for CLI messages).
std::string xml_escape(std::string_view text);
std::string format_p(double p);                    // "0.042", "3.1e-12"
std::string format_gap(const PhaseSummary& s);     // "35.2 pp [29.0, 41.3]"
std::string format_period(const PhaseSummary& s);  // "4 (p = 0.001)", "2 (p = 0.80, n.s.)"

}  // namespace phasekv
