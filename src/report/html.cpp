// Self-contained HTML report: inline CSS and SVG, no scripts, no external references, so it
// opens offline and archives as one file.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <functional>
#include <string>

#include "report/report.h"
#include "util/error.h"

namespace phasekv {

namespace {

constexpr const char* kCss = R"(
body { font-family: sans-serif; margin: 2em auto; max-width: 1100px; color: #222; }
h1 { font-size: 1.4em; } h2 { font-size: 1.15em; margin-top: 1.6em; } h3 { font-size: 1em; }
table { border-collapse: collapse; margin: 0.5em 0; font-size: 0.9em; }
th, td { border: 1px solid #ccc; padding: 0.25em 0.6em; }
th { background: #f4f4f4; text-align: left; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
tr.boundary td { background: #f3f3f3; }
tr.worst td { color: #b00020; font-weight: bold; }
tr.detected td { font-weight: bold; }
p.note { color: #555; font-size: 0.85em; max-width: 60em; }
)";

std::string escape(std::string_view text) {
  return xml_escape(text);
}

std::string td(const std::string& text) {
  return "<td>" + escape(text) + "</td>";
}
std::string td_num(const std::string& text) {
  return "<td class=\"num\">" + escape(text) + "</td>";
}

std::string meta_value(const nlohmann::json& v) {
  return v.is_string() ? v.get<std::string>() : v.dump();
}

std::string html_meta(const nlohmann::json& meta) {
  if (meta.is_null() || (meta.is_object() && meta.empty())) return "";
  std::string out = "<h2>Run</h2>\n<table>\n";
  if (meta.is_object()) {
    for (const auto& [key, value] : meta.items()) {
      out += "<tr><th>" + escape(key) + "</th>" + td(meta_value(value)) + "</tr>\n";
    }
  } else {
    out += "<tr>" + td(meta.dump()) + "</tr>\n";
  }
  return out + "</table>\n";
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
      {"worst phase [95% CI]",
       [](const PhaseSummary& s) {
         return fmt::format("r={}: {:.3f} [{:.3f}, {:.3f}]", s.worst_phase, s.worst_acc,
                            s.worst_acc_ci.lo, s.worst_acc_ci.hi);
       }},
      {"gap (best - worst) [95% CI]", [](const PhaseSummary& s) { return format_gap(s); }},
      {"interior mean / worst",
       [](const PhaseSummary& s) {
         return s.split ? fmt::format("{:.3f} / r={}: {:.3f}", s.split->interior_mean_acc,
                                      s.split->interior_worst_phase, s.split->interior_worst_acc)
                        : "-";
       }},
      {"interior gap [95% CI]",
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
  std::string out = "<h2>Summary</h2>\n<table>\n<tr><th></th>";
  for (const auto& [label, s] : series) out += "<th>" + escape(label) + "</th>";
  out += "</tr>\n";
  for (const Metric& m : summary_metrics()) {
    out += "<tr><th>" + escape(m.name) + "</th>";
    for (const auto& [label, s] : series) out += td_num(m.value(s));
    out += "</tr>\n";
  }
  return out + "</table>\n";
}

bool is_boundary(const PhaseSummary& s, int r) {
  return s.stride >= 2 && r % s.stride == s.stride - 1;
}

std::string html_phase_table(const PhaseSummary& s) {
  std::string out =
      "<h3>Accuracy by phase</h3>\n<table>\n<tr><th>r</th><th>n</th><th>correct</th>"
      "<th>accuracy</th><th>95% Wilson CI</th><th></th></tr>\n";
  for (const PhaseRow& p : s.phases) {
    const std::string cls = p.r == s.worst_phase ? "worst" : is_boundary(s, p.r) ? "boundary" : "";
    std::string note = is_boundary(s, p.r) ? "boundary" : "";
    if (p.r == s.worst_phase) note += note.empty() ? "worst" : ", worst";
    if (p.r == s.best_phase) note += note.empty() ? "best" : ", best";
    out += fmt::format("<tr class=\"{}\">", cls) + td_num(std::to_string(p.r)) +
           td_num(std::to_string(p.n)) + td_num(std::to_string(p.successes)) +
           td_num(fixed3(p.acc)) + td_num(fmt::format("[{:.3f}, {:.3f}]", p.ci_lo, p.ci_hi)) +
           td(note) + "</tr>\n";
  }
  return out + "</table>\n";
}

std::string html_period_table(const PhaseSummary& s) {
  std::string out = "<h3>Period detection</h3>\n";
  if (s.period.by_period.empty()) {
    return out + "<p>No candidate period: M has no divisor in [2, M/2].</p>\n";
  }
  out += fmt::format(
      "<p>Detected period {}, permutation p = {} ({} within-example permutations, "
      "statistic {:.2f}).</p>\n",
      s.period.detected, format_p(s.period.p_value), s.period.permutations, s.period.statistic);
  out +=
      "<table>\n<tr><th>period P</th><th>G2 (fold mod P)</th><th>df</th>"
      "<th>score = -log10 p</th></tr>\n";
  for (const PeriodScore& p : s.period.by_period) {
    out += fmt::format("<tr class=\"{}\">", p.period == s.period.detected ? "detected" : "") +
           td_num(std::to_string(p.period)) + td_num(fmt::format("{:.2f}", p.g2)) +
           td_num(std::to_string(p.df)) + td_num(fmt::format("{:.2f}", p.score)) + "</tr>\n";
  }
  return out + "</table>\n";
}

std::string html_method_note(const PhaseSeries& series) {
  const SummaryOptions& o = series.front().second.options;
  return fmt::format(
      "<p class=\"note\">Accuracy is the fraction of correct answers at each phase; error bars "
      "are 95 % Wilson intervals. The gap is best minus worst phase in percentage points, with a "
      "95 % percentile interval from a cluster bootstrap that resamples logical examples ({} "
      "replicates): the same example is evaluated at every phase. Max minus min is biased upward "
      "when phases are close, so whether phases differ at all is answered by the p-values: the "
      "period detection folds accuracy mod every divisor P of M, scores each fold by its "
      "likelihood-ratio G2 test, keeps the smallest adequate period and tests the best score "
      "against {} permutations of each example's outcomes across its phases. Boundary phases "
      "(r mod S = S-1) have key and value in different compressed entries. Seed {}.</p>\n",
      o.bootstrap_reps, o.permutations, o.seed);
}

}  // namespace

std::string report_html(const PhaseSeries& series, const std::string& title,
                        const nlohmann::json& meta) {
  if (series.empty()) throw Error("report_html: no series to report");
  std::string out = fmt::format(
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<title>{0}</title>\n<style>{1}</style>\n</head>\n<body>\n<h1>{0}</h1>\n",
      escape(title), kCss);
  out += html_meta(meta);
  out += html_summary_table(series);
  out += "<h2>Accuracy by phase</h2>\n<figure>\n" + phase_svg(series, title) + "</figure>\n";
  out += html_method_note(series);
  for (const auto& [label, s] : series) {
    out += "<h2>" + escape(label) + "</h2>\n" + html_phase_table(s) + html_period_table(s);
  }
  return out + "</body>\n</html>\n";
}

std::string report_html(const std::string& label, const PhaseSummary& summary,
                        const nlohmann::json& meta) {
  return report_html(PhaseSeries{{label, summary}}, label, meta);
}

}  // namespace phasekv
