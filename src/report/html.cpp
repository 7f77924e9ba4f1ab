// Self-contained HTML report: inline CSS and SVG, no scripts, no external references, so it
// opens offline and archives as one file.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

#include "report/modulus_check.h"
#include "report/report.h"
#include "util/error.h"

namespace phasekv {

namespace {

// Laid out for reading on a laptop: nothing may be wider than the viewport (checked at 1280 px by
// tests/browser). Long values wrap anywhere, tables scroll inside their own box, the chart scales.
constexpr const char* kCss = R"(
*, *::before, *::after { box-sizing: border-box; }
body { font-family: sans-serif; margin: 1.5em auto; max-width: 1100px; padding: 0 1em;
       color: #222; line-height: 1.4; }
h1, h2, h3, p, li, summary, td, th.label { overflow-wrap: anywhere; }
th { overflow-wrap: break-word; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
.verdict { font-size: 1.05em; margin: 0.4em 0; padding: 0.5em 0.8em; background: #f6f6f6;
           border-left: 6px solid #777777; }
.verdict.sensitive { border-left-color: #b00020; }
.verdict.none { border-left-color: #1a7f37; }
.verdict.incomplete, .verdict.uninformative, .verdict.inconclusive { border-left-color: #b26a00; }
ul.verdicts { list-style: none; padding: 0; }
figure.chart { margin: 1em 0; }
figure.chart svg { display: block; max-width: 100%; height: auto; }
div.scroll { max-width: 100%; overflow-x: auto; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
tr.boundary td, td.boundary { background: #f3f3f3; }
tr.worst td, td.worst { color: #b00020; font-weight: bold; }
tr.detected td { font-weight: bold; }
p.note { color: #555; font-size: 0.85em; max-width: 60em; }
p.warning { margin: 0.4em 0; padding: 0.5em 0.8em; background: #fff8e6;
            border-left: 6px solid #b26a00; }
details { margin: 1em 0; } details > summary { cursor: pointer; font-weight: bold; }
ul.kv, ol.kv { margin: 0.2em 0; padding-left: 1.4em; }
ul.kv { list-style: square; } ul.kv li, ol.kv li { margin: 0.1em 0; }
.k { font-weight: bold; }
.v { font-family: monospace; overflow-wrap: anywhere; }
)";

std::string escape(std::string_view text) {
  return xml_escape(text);
}

std::string td(const std::string& text) {
  return "<td>" + escape(text) + "</td>";
}
std::string td_num(const std::string& text, const std::string& cls = "") {
  return "<td class=\"num" + (cls.empty() ? "" : " " + cls) + "\">" + escape(text) + "</td>";
}

// Tables scroll inside this box when they have more columns than the page is wide.
std::string scroll_box(const std::string& table) {
  return "<div class=\"scroll\">\n" + table + "</div>\n";
}

std::string verdict_class(VerdictKind kind) {
  switch (kind) {
    case VerdictKind::kPhaseSensitive:
      return "sensitive";
    case VerdictKind::kNoPeriodDetected:
      return "none";
    case VerdictKind::kIncomplete:
      return "incomplete";
    case VerdictKind::kUninformative:
      return "uninformative";
    case VerdictKind::kInconclusive:
      return "inconclusive";
    case VerdictKind::kNotTested:
      break;
  }
  return "untested";
}

std::string verdict_html(const Verdict& v) {
  return "<strong>" + escape(v.headline) + ":</strong> " + escape(v.detail);
}

// One line for a sweep; one line per series, led by its label, for a comparison.
std::string html_verdicts(const PhaseSeries& series) {
  if (series.size() == 1) {
    const Verdict v = phase_verdict(series.front().second);
    return "<p class=\"verdict " + verdict_class(v.kind) + "\">" + verdict_html(v) + "</p>\n";
  }
  std::string out = "<ul class=\"verdicts\">\n";
  for (const auto& [label, s] : series) {
    const Verdict v = phase_verdict(s);
    out += "<li class=\"verdict " + verdict_class(v.kind) + "\"><span class=\"k\">" +
           escape(label) + "</span> \u2014 " + verdict_html(v) + "</li>\n";
  }
  return out + "</ul>\n";
}

// Run metadata as nested key/value lists: objects become lists of "key: value", arrays of plain
// values one comma-separated line, other arrays numbered lists.
std::string json_scalar(const nlohmann::json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_number_float()) return fmt::format("{:.6g}", v.get<double>());
  return v.dump();
}

std::string meta_value(const nlohmann::json& v);

std::string meta_object(const nlohmann::json& obj) {
  std::string out = "<ul class=\"kv\">\n";
  for (const auto& [key, value] : obj.items()) {
    out += "<li><span class=\"k\">" + escape(key) + "</span>: " + meta_value(value) + "</li>\n";
  }
  return out + "</ul>\n";
}

std::string meta_value(const nlohmann::json& v) {
  if (v.is_object()) {
    return v.empty() ? "<span class=\"v\">(none)</span>" : "\n" + meta_object(v);
  }
  if (v.is_array()) {
    if (v.empty()) return "<span class=\"v\">(none)</span>";
    const bool plain =
        std::none_of(v.begin(), v.end(), [](const nlohmann::json& e) { return e.is_structured(); });
    std::string out;
    if (plain) {
      for (const auto& e : v) out += (out.empty() ? "" : ", ") + json_scalar(e);
      return "<span class=\"v\">" + escape(out) + "</span>";
    }
    out = "\n<ol class=\"kv\">\n";
    for (const auto& e : v) out += "<li>" + meta_value(e) + "</li>\n";
    return out + "</ol>\n";
  }
  return "<span class=\"v\">" + escape(json_scalar(v)) + "</span>";
}

std::string html_meta(const nlohmann::json& meta) {
  if (meta.is_null() || (meta.is_structured() && meta.empty())) return "";
  std::string out = "<details class=\"meta\">\n<summary>Run metadata</summary>\n";
  out += meta.is_object() ? meta_object(meta) : "<div>" + meta_value(meta) + "</div>\n";
  return out + "</details>\n";
}

// Metrics as rows and series as columns: reads well for one series and for a handful.
struct Metric {
  const char* name;
  std::function<std::string(const PhaseSummary&)> value;
};

std::string fixed3(double v) {
  return fmt::format("{:.3f}", v);
}

std::vector<Metric> summary_metrics() {
  return {
      {"examples", [](const PhaseSummary& s) { return std::to_string(s.examples); }},
      {"modulus M", [](const PhaseSummary& s) { return std::to_string(s.modulus); }},
      {"stride S",
       [](const PhaseSummary& s) { return s.stride > 0 ? std::to_string(s.stride) : "unknown"; }},
      {"mean accuracy", [](const PhaseSummary& s) { return fixed3(s.mean_acc); }},
      {"best phase",
       [](const PhaseSummary& s) { return fmt::format("r={}: {:.3f}", s.best_phase, s.best_acc); }},
      // Not the phase table's Wilson interval of that phase: the simultaneous interval of the
      // minimum over phases, which the SLA gate judges (method note).
      {"worst phase [95% simultaneous CI]",
       [](const PhaseSummary& s) {
         return fmt::format("r={}: {:.3f} [{:.3f}, {:.3f}]", s.worst_phase, s.worst_acc,
                            s.worst_acc_ci.lo, s.worst_acc_ci.hi);
       }},
      {"gap (best - worst) [95% simultaneous CI]",
       [](const PhaseSummary& s) { return format_gap(s); }},
      {"bias-corrected gap / null gap",
       [](const PhaseSummary& s) {
         return fmt::format("{:.1f} pp / {:.1f} pp", s.gap_bc_pp, s.null_gap_pp);
       }},
      {"interior mean / worst",
       [](const PhaseSummary& s) {
         return s.split ? fmt::format("{:.3f} / r={}: {:.3f}", s.split->interior_mean_acc,
                                      s.split->interior_worst_phase, s.split->interior_worst_acc)
                        : "-";
       }},
      {"interior gap [95% simultaneous CI]",
       [](const PhaseSummary& s) {
         return s.split
                    ? fmt::format("{:.1f} pp [{:.1f}, {:.1f}]", s.split->interior_gap_pp,
                                  s.split->interior_gap_ci_pp.lo, s.split->interior_gap_ci_pp.hi)
                    : "-";
       }},
      {"boundary accuracy",
       [](const PhaseSummary& s) {
         return s.split ? fmt::format("{:.3f} (r={})", s.split->boundary_acc,
                                      fmt::join(s.split->boundary_phases, ","))
                        : "-";
       }},
      {"periodicity check: mean |A(r) - A(r+S)|",
       [](const PhaseSummary& s) {
         return s.periodicity_check_pp ? fmt::format("{:.1f} pp", *s.periodicity_check_pp) : "-";
       }},
      {"detected period (permutation p)", [](const PhaseSummary& s) { return format_period(s); }},
      {"chi-square homogeneity",
       [](const PhaseSummary& s) {
         return fmt::format("{:.1f}, df {}, p = {}", s.chi_square.statistic, s.chi_square.df,
                            format_p(s.chi_square.p_value));
       }},
  };
}

std::string html_summary_table(const PhaseSeries& series) {
  std::string out = "<h2>Summary statistics</h2>\n<table class=\"summary\">\n<tr><th></th>";
  for (const auto& [label, s] : series) out += "<th class=\"label\">" + escape(label) + "</th>";
  out += "</tr>\n";
  for (const Metric& m : summary_metrics()) {
    out += "<tr><th>" + escape(m.name) + "</th>";
    for (const auto& [label, s] : series) out += td_num(m.value(s));
    out += "</tr>\n";
  }
  return scroll_box(out + "</table>\n");
}

bool is_boundary(const PhaseSummary& s, int r) {
  return s.stride >= 2 && r % s.stride == s.stride - 1;
}

const PhaseRow* find_phase(const PhaseSummary& s, int r) {
  for (const PhaseRow& p : s.phases) {
    if (p.r == r) return &p;
  }
  return nullptr;
}

// A profile whose phases all score the same has no worst phase to mark: a perfect control is
// not red.
bool has_worst(const PhaseSummary& s) {
  return s.best_acc > s.worst_acc;
}

std::string ci_text(const PhaseRow& p) {
  return fmt::format("[{:.3f}, {:.3f}]", p.ci_lo, p.ci_hi);
}

// One series: counts, accuracy, interval and what is special about the phase.
std::string html_phase_table(const PhaseSummary& s) {
  std::string out =
      "<table class=\"phases\">\n<tr><th>phase</th><th>n</th><th>correct</th>"
      "<th>accuracy</th><th>95% Wilson CI</th><th></th></tr>\n";
  for (const PhaseRow& p : s.phases) {
    const bool worst = has_worst(s) && p.r == s.worst_phase;
    const std::string cls = worst ? "worst" : is_boundary(s, p.r) ? "boundary" : "";
    std::string note = is_boundary(s, p.r) ? "entry boundary" : "";
    if (worst) note += note.empty() ? "worst" : ", worst";
    if (has_worst(s) && p.r == s.best_phase) note += note.empty() ? "best" : ", best";
    out += fmt::format("<tr class=\"{}\">", cls) + td_num(std::to_string(p.r)) +
           td_num(std::to_string(p.n)) + td_num(std::to_string(p.successes)) +
           td_num(fixed3(p.acc)) + td_num(ci_text(p)) + td(note) + "</tr>\n";
  }
  return scroll_box(out + "</table>\n");
}

// Several series side by side: a row per phase, accuracy and interval per series; each series'
// worst phase in red, its boundary phases shaded.
std::string html_phase_table(const PhaseSeries& series) {
  int modulus = 0;
  for (const auto& [label, s] : series) modulus = std::max(modulus, s.modulus);
  std::string out = "<table class=\"phases\">\n<tr><th rowspan=\"2\">phase</th>";
  for (const auto& [label, s] : series) {
    out += "<th class=\"label\" colspan=\"2\">" + escape(label) + "</th>";
  }
  out += "</tr>\n<tr>";
  for (size_t i = 0; i < series.size(); ++i) out += "<th>accuracy</th><th>95% Wilson CI</th>";
  out += "</tr>\n";
  for (int r = 0; r < modulus; ++r) {
    out += "<tr>" + td_num(std::to_string(r));
    for (const auto& [label, s] : series) {
      const PhaseRow* p = find_phase(s, r);
      if (p == nullptr) {
        out += td_num("-") + td_num("-");
        continue;
      }
      const std::string cls = has_worst(s) && r == s.worst_phase ? "worst"
                              : is_boundary(s, r)                ? "boundary"
                                                                 : "";
      out += td_num(fixed3(p->acc), cls) + td_num(ci_text(*p), cls);
    }
    out += "</tr>\n";
  }
  return scroll_box(out + "</table>\n");
}

std::string html_period_table(const PhaseSummary& s) {
  if (s.period.by_period.empty()) {
    return "<p>No candidate period: M has no divisor in [2, M/2].</p>\n";
  }
  std::string out = fmt::format(
      "<p>Detected period {}, sign-flip p = {} ({} flips of whole examples, statistic {:.2f}; "
      "detected in {:.0f} % of example resamples; periods tested by {}).</p>\n",
      s.period.detected, format_p(s.period.p_value), s.period.permutations, s.period.statistic,
      100.0 * s.period.detected_support(),
      s.period.positions_known ? "key position mod P" : "phase mod P (divisors of M only)");
  out +=
      "<table class=\"periods\">\n<tr><th>period P</th><th>statistic (fold mod P)</th><th>df</th>"
      "<th>score = -log10 p</th></tr>\n";
  for (const PeriodScore& p : s.period.by_period) {
    out += fmt::format("<tr class=\"{}\">", p.period == s.period.detected ? "detected" : "") +
           td_num(std::to_string(p.period)) + td_num(fmt::format("{:.2f}", p.statistic)) +
           td_num(std::to_string(p.df)) + td_num(fmt::format("{:.2f}", p.score)) + "</tr>\n";
  }
  return out + "</table>\n";
}

std::string html_period_details(const PhaseSeries& series) {
  std::string out = "<details class=\"periods\">\n<summary>Period detection</summary>\n";
  for (const auto& [label, s] : series) {
    if (series.size() > 1) out += "<h3>" + escape(label) + "</h3>\n";
    out += html_period_table(s);
  }
  return out + "</details>\n";
}

std::string html_method_note(const PhaseSeries& series) {
  const SummaryOptions& o = series.front().second.options;
  return fmt::format(
      "<p class=\"note\">Accuracy is the fraction of correct answers at each phase r (the target "
      "key's position mod M); error bars and the phase table's intervals are each phase's own 95 "
      "% Wilson interval. The summary's intervals hold for all phases at once (Sidak level): the "
      "worst phase's covers whichever phase is worst (the interval the SLA gate judges), and the "
      "gap's comes from simultaneous bands on the profile with each example's own level removed, "
      "so it always contains the observed gap. The verdict calls a model "
      "phase-sensitive when the period detection finds a period with sign-flip p &lt; 0.05; "
      "\u00b1 is the largest distance of a phase's accuracy from the mean. The gap is best minus "
      "worst phase in percentage points; a max minus a min is biased upward, so the summary also "
      "gives a bias-corrected gap ({} cluster-bootstrap replicates) and the gap a flat profile "
      "shows with these examples. The period detection folds each example's outcomes mod every "
      "candidate P, scores each fold, keeps the smallest adequate period and tests the best score "
      "against at least {} sign flips of whole examples (docs/STATISTICS.md). Boundary phases (r "
      "mod S = S-1) have the target's key and value in different "
      "compressed entries: the dotted lines are entry boundaries. Seed {}.</p>\n",
      o.bootstrap_reps, o.permutations, o.seed);
}

std::string html_modulus_warning(const PhaseSeries& series) {
  const std::string w = modulus_mismatch(series);
  return w.empty() ? "" : "<p class=\"warning\"><strong>Warning:</strong> " + escape(w) + ".</p>\n";
}

}  // namespace

// An audit over a depth x length grid (audit.json "lengths" and "cells", docs/AUDIT.md): the
// per-phase accuracy per context length as a heatmap and a table (all depths of a length pooled),
// and the worst-phase accuracy of every depth x length cell as a heatmap with its gap in the
// tooltip table. Empty when the meta has no grid.
// A heatmap of accuracies in percent, 50 % neutral.
static Heatmap percent_heatmap(std::string title, std::string caption, std::string x_label,
                               std::string y_label) {
  Heatmap h;
  h.title = std::move(title), h.caption = std::move(caption);
  h.x_label = std::move(x_label), h.y_label = std::move(y_label);
  h.unit = " %";
  h.center = 50.0, h.limit = 50.0;
  return h;
}

// A grid row's length: "context_len", or "context_tokens" in audit.json files written before the
// key followed the glossary (issue 45).
static int64_t context_len_of(const nlohmann::json& row) {
  return (row.contains("context_len") ? row["context_len"] : row["context_tokens"]).get<int64_t>();
}

static std::string html_length_grid(const nlohmann::json& meta) {
  if (!meta.is_object() || !meta.contains("lengths") || !meta["lengths"].is_array() ||
      meta["lengths"].empty())
    return "";
  const auto& lengths = meta["lengths"];
  std::string out = "<h2>By context length</h2>\n";
  Heatmap h = percent_heatmap(
      "Accuracy (%) by context length and phase (all depths pooled)",
      "one row per context length; columns: the target's phase r = key position mod M", "phase r",
      "context tokens");
  const size_t M = lengths.front()["phase_acc"].size();
  for (size_t r = 0; r < M; ++r) h.cols.push_back(std::to_string(r));
  std::string table = "<table>\n<tr><th>tokens</th>";
  for (size_t r = 0; r < M; ++r) table += fmt::format("<th>r={}</th>", r);
  table += "<th>mean</th><th>worst (r)</th><th>gap pp</th></tr>\n";
  for (const auto& row : lengths) {
    const int64_t tokens = context_len_of(row);
    const int worst = row["worst_phase"].get<int>();
    h.rows.push_back(std::to_string(tokens));
    std::vector<double> values;
    table += "<tr>" + td_num(std::to_string(tokens));
    for (size_t r = 0; r < row["phase_acc"].size(); ++r) {
      const double acc = row["phase_acc"][r].get<double>();
      values.push_back(100.0 * acc);
      table += td_num(fixed3(acc), static_cast<int>(r) == worst ? "worst" : "");
    }
    h.values.push_back(values);
    table += td_num(fixed3(row["mean_acc"].get<double>())) +
             td_num(fmt::format("{:.3f} ({})", row["worst_acc"].get<double>(), worst)) +
             td_num(fmt::format("{:.1f}", row["gap_pp"].get<double>())) + "</tr>\n";
  }
  out += "<figure class=\"chart\">\n" + heatmap_svg(h) + "</figure>\n";
  out += scroll_box(table + "</table>\n");
  if (!meta.contains("cells") || !meta["cells"].is_array() || meta["cells"].empty()) return out;
  // Depth x length: rows the depths in first-seen order, columns the lengths.
  std::vector<std::string> depths;
  std::vector<int64_t> tokens;
  auto depth_name = [](const nlohmann::json& c) {
    return c["depth_pct"].is_null() ? std::string("random")
                                    : fmt::format("{:g}%", c["depth_pct"].get<double>());
  };
  for (const auto& c : meta["cells"]) {
    if (std::find(depths.begin(), depths.end(), depth_name(c)) == depths.end())
      depths.push_back(depth_name(c));
    const int64_t t = context_len_of(c);
    if (std::find(tokens.begin(), tokens.end(), t) == tokens.end()) tokens.push_back(t);
  }
  Heatmap g = percent_heatmap(
      "Worst-phase accuracy (%) by depth and context length",
      "each cell on its own examples; the table below gives its worst phase and gap",
      "context tokens", "depth");
  g.rows = depths;
  for (int64_t t : tokens) g.cols.push_back(std::to_string(t));
  g.values.assign(depths.size(), std::vector<double>(tokens.size(), 0.0));
  std::string cells =
      "<table>\n<tr><th>tokens</th><th>depth</th><th>mean</th><th>worst (r)"
      "</th><th>gap pp</th><th>period (p)</th></tr>\n";
  for (const auto& c : meta["cells"]) {
    const size_t r = static_cast<size_t>(std::find(depths.begin(), depths.end(), depth_name(c)) -
                                         depths.begin());
    const size_t col = static_cast<size_t>(
        std::find(tokens.begin(), tokens.end(), context_len_of(c)) - tokens.begin());
    g.values[r][col] = 100.0 * c["worst_acc"].get<double>();
    const std::string period = c["detected_period"].is_null()
                                   ? "none"
                                   : fmt::format("{} ({})", c["detected_period"].get<int>(),
                                                 format_p(c["period_p_value"].get<double>()));
    cells += "<tr>" + td_num(std::to_string(context_len_of(c))) + td(depth_name(c)) +
             td_num(fixed3(c["mean_acc"].get<double>())) +
             td_num(fmt::format("{:.3f} ({})", c["worst_acc"].get<double>(),
                                c["worst_phase"].get<int>())) +
             td_num(fmt::format("{:.1f}", c["gap_pp"].get<double>())) + td_num(period) + "</tr>\n";
  }
  out += "<figure class=\"chart\">\n" + heatmap_svg(g) + "</figure>\n";
  return out + scroll_box(cells + "</table>\n");
}

std::string report_html(const PhaseSeries& series, const std::string& title,
                        const nlohmann::json& meta) {
  if (series.empty()) throw Error("report_html: no series to report");
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>{0}</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>{0}</h1>\n",
      escape(title), kCss);
  out += html_verdicts(series);
  out += html_modulus_warning(series);
  out += "<figure class=\"chart\">\n" + phase_svg(series, title) + "</figure>\n";
  out += "<h2>Accuracy by phase</h2>\n";
  out += series.size() == 1 ? html_phase_table(series.front().second) : html_phase_table(series);
  out += html_summary_table(series);
  out += html_method_note(series);
  out += html_period_details(series);
  out += html_length_grid(meta);
  out += html_meta(meta);
  return out + "</body>\n</html>\n";
}

std::string report_html(const std::string& label, const PhaseSummary& summary,
                        const nlohmann::json& meta) {
  return report_html(PhaseSeries{{label, summary}}, label, meta);
}

}  // namespace phasekv
