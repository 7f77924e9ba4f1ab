// Renderers for phase summaries: CSV, SVG chart, self-contained HTML report and terminal text.
//
// Every renderer returns a string so the CLI decides where it goes; write_sweep_outputs is the
// one function that touches the file system. Nothing here loads external resources (no fonts,
// scripts or stylesheets from the network): a report must open on an offline machine and stay
// readable when archived next to its results.
#pragma once
#include <cmath>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "eval/stats.h"

namespace phasekv {

// Several labelled summaries shown together (`phasekv compare`, or one series for a sweep).
using PhaseSeries = std::vector<std::pair<std::string, PhaseSummary>>;

// Header `phase,n,acc,ci_lo,ci_hi`, one row per phase, accuracies as fractions.
std::string phase_csv(const PhaseSummary& summary);

// Per-phase accuracy with Wilson error bars, a dashed mean line per series, entry boundaries
// (dotted, at multiples of the stride S when known: phases kS - 1 and kS fall in different
// compressed entries) and a legend when there are several series.
// A standalone SVG document; throws phasekv::Error on an empty series list.
std::string phase_svg(const PhaseSeries& series, const std::string& title);

// Self-contained HTML, in reading order: the verdict (one line per series), the chart, the
// per-phase table, the summary statistics, then period detection and the run metadata in
// collapsible sections. `meta` is free-form (model, backend, config hash ...): objects and arrays
// are shown as nested key/value lists. Laid out to fit a 1280 px viewport: long values wrap, wide
// tables scroll inside their own box, the chart scales down.
std::string report_html(const PhaseSeries& series, const std::string& title,
                        const nlohmann::json& meta);
std::string report_html(const std::string& label, const PhaseSummary& summary,
                        const nlohmann::json& meta);

// The one-line answer a report opens with, decided by the sign-flip test of the period
// detection (stats.h; the gap is biased upward when phases are close, so it is reported beside
// its null level, not used to decide):
//  - kPhaseSensitive: a period was detected with p < 0.05. "phase-sensitive: period 4
//    (p = 0.001); worst phase r = 7 (entry boundary) at 0.507 vs best 1.000; the mean 0.869 hides
//    a 49.3 pp gap (95 % CI [45.1, 53.0])".
//  - kNoPeriodDetected: p >= 0.05. "no periodic weak spot detected: period test p = 0.140;
//    accuracy 0.998 ± 0.004 across phases (worst phase r = 3 at 0.994 vs best 1.000; gap 0.6 pp,
//    95 % CI [0.0, 2.1])", where ± is the largest distance of a phase's accuracy from the mean.
//  - kInconclusive: p >= 0.05, but with --min-gap G the examples were too few to find a G pp dip
//    (simulated power below 80 %) and the gap's interval reaches G: "inconclusive at 10 pp: no
//    period found (p = 0.310), but 40 examples per phase detect a 10 pp dip every 8 phases with
//    probability 34 % (simulated), and the data do not rule it out: about 160 examples per phase
//    would detect it (...); accuracy ...". With G ruled out or found with >= 80 % power, the
//    kNoPeriodDetected line says so at its end.
//  - kNotTested: no permutation test (M has no divisor in [2, M/2], or 0 permutations); the
//    accuracy part reads as for kNoPeriodDetected.
// Two kinds come first and withhold the answer (the SLA gate fails both):
//  - kIncomplete: fewer outcomes than the run planned (PhaseSummary::planned_outcomes): "no
//    verdict, incomplete: 642 of 2400 outcomes (1758 items failed or were not scored) ...".
//  - kUninformative: no phase above the task's shortcut (PhaseSummary::at_or_below_shortcut): a
//    model that does not do the task has no weak spot to find, whatever its flat profile says.
enum class VerdictKind {
  kPhaseSensitive,
  kNoPeriodDetected,
  kInconclusive,
  kNotTested,
  kIncomplete,
  kUninformative
};
struct Verdict {
  VerdictKind kind = VerdictKind::kNotTested;
  std::string headline;  // "phase-sensitive", "no periodic weak spot detected", ...
  std::string detail;    // the evidence after the colon
  std::string text() const { return headline + ": " + detail; }
};
Verdict phase_verdict(const PhaseSummary& summary);

// Compact text for a terminal: per-phase n / acc / CI with a bar, then mean, best, worst, gap
// with CI, interior / boundary, period with p-value and the chi-square test.
std::string terminal_table(const PhaseSummary& summary, const std::string& label);

// One row per series: label, M, S, examples, mean, worst, gap with CI, period and p.
std::string compare_table(const PhaseSeries& series);

// Writes summary.json (to_json() plus "label" and "meta"), phase.csv, phase.svg and report.html
// into `dir` (created if missing), each atomically.
void write_sweep_outputs(const std::string& dir, const std::string& label,
                         const PhaseSummary& summary, const nlohmann::json& meta);

// ---------------------------------------------------------------------------------------------
// Charts of the explanation analyses (src/explain): standalone SVG documents, like phase_svg.

// A grid of coloured cells on a diverging scale: `center` white, red below it, blue above it,
// saturating at center -/+ limit; a NaN cell is grey and shows "-". Each cell prints its value
// with `decimals` decimals and carries a tooltip. Columns in `shaded_cols` get a grey header
// (e.g. the boundary phases). Throws phasekv::Error when values is not rows x cols or empty.
struct Heatmap {
  std::string title, caption;
  std::string x_label, y_label, unit;  // unit: appended to values in tooltips and the scale
  std::vector<std::string> rows, cols;
  std::vector<std::vector<double>> values;  // [row][col]
  double center = 0.0, limit = 1.0;
  int decimals = 0;
  std::vector<int> shaded_cols;
};
std::string heatmap_svg(const Heatmap& h);

// Points (optionally joined in order, with an arrow-like last marker) in the square [lo, hi]^2,
// with the diagonal y = x. One Okabe-Ito colour per series and a legend; a hollow point is
// drawn as a ring (e.g. a boundary point left out of a fit).
struct PlanePoint {
  double x = 0.0, y = 0.0;
  bool hollow = false;
  std::string tip;  // tooltip
};
struct PlaneSeries {
  std::string label;
  std::vector<PlanePoint> points;
  bool connect = false;  // a polyline through the points in order (a trajectory)
};
struct PlaneChart {
  std::string title, caption, x_label, y_label;
  double lo = 0.0, hi = 1.0;
  std::vector<PlaneSeries> series;
};
std::string plane_svg(const PlaneChart& c);

// A line chart: one polyline per series (solid or dashed, optional markers and error bars),
// nice ticks on both axes, a legend right of the plot. Axis bounds left NaN come from the data.
// Throws phasekv::Error on an empty series list or a series whose vectors differ in length.
struct LineSeries {
  std::string label;
  std::vector<double> x, y;
  std::vector<double> lo, hi;  // error bars: empty, or one per point
  bool dashed = false;
  bool markers = false;
  int colour = -1;  // Okabe-Ito palette index; -1: the series' position
};
struct LineChart {
  std::string title, caption, x_label, y_label;
  std::vector<LineSeries> series;
  double x_lo = NAN, x_hi = NAN, y_lo = NAN, y_hi = NAN;
  bool x_integer_ticks = false;  // ticks at whole numbers only (counts such as heads)
  std::vector<double> x_marks;   // dotted vertical lines (e.g. every S-th filler length)
};
std::string line_svg(const LineChart& c);

// A scatter chart (the Pareto chart of `phasekv mitigations report`): one marker per point, its
// area proportional to `area` (a marker of area 1 has radius `unit_radius` px), a short label
// beside it, a colour per group named in the legend, optional shaded regions; x on a log scale
// when `log_x` (ticks 1, 2, 5 x 10^k). Axis bounds left NaN come from the data. Every marker is
// a `<circle class="marker">`, so a test can count them. Throws phasekv::Error on a non-positive
// x with log_x, or a region or legend group that is malformed.
struct ScatterPoint {
  double x = 0.0, y = 0.0;
  double area = 1.0;  // relative marker area (e.g. compute x baseline)
  int group = 0;      // index into ScatterChart::groups (colour and legend entry)
  std::string label;  // drawn beside the marker
  std::string tip;    // tooltip
  bool ring = false;  // drawn hollow with a heavy outline (e.g. the baseline)
};
struct ScatterRegion {
  double x_lo = NAN, x_hi = NAN, y_lo = NAN, y_hi = NAN;  // NaN: the plot's edge
  std::string label;
};
struct ScatterChart {
  std::string title, caption, x_label, y_label;
  bool log_x = false;
  double x_lo = NAN, x_hi = NAN, y_lo = NAN, y_hi = NAN;
  double unit_radius = 6.0;
  std::vector<std::string> groups;  // legend text per group
  std::vector<ScatterPoint> points;
  std::vector<ScatterRegion> regions;
  std::vector<std::string> notes;  // extra legend lines (e.g. what marker size means)
};
std::string scatter_svg(const ScatterChart& c);

// Text pieces shared by the renderers (and handy for CLI messages).
std::string xml_escape(std::string_view text);
std::string format_p(double p);                    // "0.042", "3.1e-12"
std::string format_gap(const PhaseSummary& s);     // "35.2 pp [29.0, 41.3]"
std::string format_period(const PhaseSummary& s);  // "4 (p = 0.001)", "2 (p = 0.80, n.s.)"

}  // namespace phasekv
