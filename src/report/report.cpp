// Text renderers (CSV, terminal tables) and the sweep output writer. SVG and HTML live in
// svg.cpp and html.cpp.
#include "report/report.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "util/fs.h"

namespace phasekv {

namespace {

constexpr int kBarWidth = 24;

// Columns padded to their widest cell; `align` holds one 'l' or 'r' per column (labels and bars
// left, numbers right). Widths count bytes, so keep the cells ASCII.
std::string render_columns(const std::vector<std::vector<std::string>>& rows,
                           std::string_view align, std::string_view indent = "") {
  std::vector<size_t> width(align.size(), 0);
  for (const auto& row : rows) {
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line(indent);
    for (size_t c = 0; c < row.size(); ++c) {
      if (c > 0) line += "  ";
      line += align[c] == 'l' ? fmt::format("{:<{}}", row[c], width[c])
                              : fmt::format("{:>{}}", row[c], width[c]);
    }
    line.erase(line.find_last_not_of(' ') + 1);
    out += line + "\n";
  }
  return out;
}

std::string bar(double acc) {
  const int filled = std::isnan(acc) ? 0 : static_cast<int>(std::lround(acc * kBarWidth));
  return std::string(std::clamp(filled, 0, kBarWidth), '#');
}

std::string phase_marks(const PhaseSummary& s, int r) {
  std::vector<std::string> marks;
  if (s.split && std::find(s.split->boundary_phases.begin(), s.split->boundary_phases.end(), r) !=
                     s.split->boundary_phases.end()) {
    marks.push_back("boundary");
  }
  // A flat profile has no worst or best phase (report.html leaves it unmarked too).
  if (s.best_acc > s.worst_acc) {
    if (r == s.worst_phase) marks.push_back("worst");
    if (r == s.best_phase) marks.push_back("best");
  }
  return fmt::format("{}", fmt::join(marks, ", "));
}

std::string per_phase_lines(const PhaseSummary& s) {
  std::vector<std::vector<std::string>> rows = {{"phase", "n", "acc", "95% CI", "", ""}};
  for (const PhaseRow& p : s.phases) {
    rows.push_back({std::to_string(p.r), std::to_string(p.n), fmt::format("{:.3f}", p.acc),
                    fmt::format("[{:.3f}, {:.3f}]", p.ci_lo, p.ci_hi), bar(p.acc),
                    phase_marks(s, p.r)});
  }
  return render_columns(rows, "rrrlll", "  ");
}

std::string split_line(const PhaseSummary& s) {
  const StrideSplit& sp = *s.split;
  return fmt::format(
      "interior (r mod {} != {}): mean {:.3f}, worst r={} {:.3f}, gap {:.1f} pp [{:.1f}, {:.1f}] | "
      "boundary r={}: {:.3f}\n",
      s.stride, s.stride - 1, sp.interior_mean_acc, sp.interior_worst_phase, sp.interior_worst_acc,
      sp.interior_gap_pp, sp.interior_gap_ci_pp.lo, sp.interior_gap_ci_pp.hi,
      fmt::join(sp.boundary_phases, ","), sp.boundary_acc);
}

}  // namespace

std::string xml_escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string format_p(double p) {
  if (std::isnan(p)) return "n/a";
  if (p <= 0.0) return "<1e-300";  // the survival function underflowed
  // Three decimals while they show a nonzero digit: the smallest p of 1000 permutations, 1/1001,
  // reads "0.001".
  return p >= 0.0005 ? fmt::format("{:.3f}", p) : fmt::format("{:.1e}", p);
}

std::string format_gap(const PhaseSummary& s) {
  if (std::isnan(s.gap_ci_pp.lo)) return fmt::format("{:.1f} pp", s.gap_pp);
  return fmt::format("{:.1f} pp [{:.1f}, {:.1f}]", s.gap_pp, s.gap_ci_pp.lo, s.gap_ci_pp.hi);
}

std::string format_period(const PhaseSummary& s) {
  if (s.period.detected == 0) return "none (no candidate period divides M)";
  const bool significant = s.period.p_value < 0.05;
  return fmt::format("{} (p = {}{})", s.period.detected, format_p(s.period.p_value),
                     significant ? "" : ", n.s.");
}

namespace {

// "; detected in 97 % of example resamples" when the support bootstrap ran.
std::string support_text(const PhaseSummary& s) {
  if (s.period.support.empty()) return "";
  return fmt::format("; detected in {:.0f} % of example resamples",
                     100.0 * s.period.detected_support());
}

// What a flat profile shows with the same examples: the level an observed gap has to clear.
std::string null_gap_text(const PhaseSummary& s) {
  if (!(s.null_gap_pp > 0.0)) return "";
  return fmt::format("; a flat profile shows {:.1f} pp with these examples", s.null_gap_pp);
}

// With --min-gap (PhaseSummary::sensitivity), after a period test that found nothing: whether a
// gap of that size is ruled out, would have been found, or neither (then the verdict is
// "inconclusive" and says how many examples would do).
std::string sensitivity_text(const Sensitivity& v) {
  const std::string dip =
      fmt::format("a {:g} pp dip every {} phases{}", v.min_gap_pp, v.stride,
                  v.stride_assumed ? " (the stride is unknown: M/2, the hardest period)" : "");
  if (v.ruled_out)
    return fmt::format("; a gap of {:g} pp or more is ruled out (above the gap's 95 % interval)",
                       v.min_gap_pp);
  const std::string power =
      fmt::format("{} examples per phase detect {} with probability {:.0f} % (simulated)",
                  v.examples, dip, 100 * v.power);
  if (v.power >= 0.8) return "; " + power;
  const std::string needed =
      v.examples_needed > 0
          ? fmt::format("about {} examples per phase would detect it", v.examples_needed)
          : std::string("more than 6400 examples per phase would be needed");
  return fmt::format("; {}, and the data do not rule it out: {} (phasekv plan --min-gap {:g})",
                     power, needed, v.min_gap_pp);
}

bool underpowered(const PhaseSummary& s) {
  return s.sensitivity && !s.sensitivity->ruled_out && s.sensitivity->power < 0.8;
}

}  // namespace

Verdict phase_verdict(const PhaseSummary& s) {
  const bool boundary = s.stride >= 2 && s.worst_phase % s.stride == s.stride - 1;
  const std::string worst =
      fmt::format("worst phase r = {}{} at {:.3f} vs best {:.3f}", s.worst_phase,
                  boundary ? " (entry boundary)" : "", s.worst_acc, s.best_acc);
  const bool has_ci = !std::isnan(s.gap_ci_pp.lo) && !std::isnan(s.gap_ci_pp.hi);
  Verdict v;
  if (!s.complete()) {
    v.kind = VerdictKind::kIncomplete;
    v.headline = "no verdict, incomplete";
    v.detail = fmt::format(
        "{} of {} outcomes ({} items failed or were not scored); the statistics of the rest are "
        "not a result: rerun the same command to retry the missing items",
        s.outcomes, s.planned_outcomes, s.planned_outcomes - s.outcomes);
    return v;
  }
  if (s.at_or_below_shortcut()) {
    v.kind = VerdictKind::kUninformative;
    v.headline = "uninformative";
    v.detail = fmt::format(
        "accuracy at or below the shortcut {:.3f} at every phase (mean {:.3f}; best phase r = {} "
        "at {:.3f}, its 95 % interval reaches down to {:.3f}): the model does not do the task, so "
        "its phases show nothing about weak spots",
        *s.shortcut, s.mean_acc, s.best_phase, s.best_acc,
        s.phases.at(static_cast<size_t>(s.best_phase)).ci_lo);
    return v;
  }
  const bool tested = s.period.detected > 0 && s.period.permutations > 0;
  if (tested && s.period.p_value < 0.05) {
    v.kind = VerdictKind::kPhaseSensitive;
    v.headline = "phase-sensitive";
    v.detail = fmt::format(
        "period {} (p = {}{}); {}; the mean {:.3f} hides a {:.1f} pp gap{}{}", s.period.detected,
        format_p(s.period.p_value), support_text(s), worst, s.mean_acc, s.gap_pp,
        has_ci ? fmt::format(" (95 % CI [{:.1f}, {:.1f}])", s.gap_ci_pp.lo, s.gap_ci_pp.hi) : "",
        null_gap_text(s));
    return v;
  }
  std::string test;
  if (tested && underpowered(s)) {
    v.kind = VerdictKind::kInconclusive;
    v.headline = fmt::format("inconclusive at {:g} pp", s.sensitivity->min_gap_pp);
    // "no period found (p = 0.31), but 40 examples per phase detect ... (simulated), and ..."
    test = fmt::format("no period found (p = {}), but {}", format_p(s.period.p_value),
                       sensitivity_text(*s.sensitivity).substr(2));
  } else if (tested) {
    v.kind = VerdictKind::kNoPeriodDetected;
    v.headline = "no periodic weak spot detected";
    test = fmt::format("period test p = {}", format_p(s.period.p_value));
  } else {
    v.kind = VerdictKind::kNotTested;
    v.headline = "no period test";
    test = s.period.detected == 0
               ? fmt::format("M = {} has no candidate period (a divisor in [2, M/2])", s.modulus)
               : std::string("0 permutations were run");
  }
  // The spread around the mean: every phase lies within mean +- spread.
  const double spread = std::max(s.best_acc - s.mean_acc, s.mean_acc - s.worst_acc);
  v.detail = fmt::format(
      "{}; accuracy {:.3f} \u00b1 {:.3f} across phases ({}; gap {:.1f} pp{}){}", test, s.mean_acc,
      spread, worst, s.gap_pp,
      has_ci ? fmt::format(", 95 % CI [{:.1f}, {:.1f}]", s.gap_ci_pp.lo, s.gap_ci_pp.hi) : "",
      null_gap_text(s));
  if (s.sensitivity && v.kind == VerdictKind::kNoPeriodDetected) {
    v.detail += sensitivity_text(*s.sensitivity);
  }
  return v;
}

std::string phase_csv(const PhaseSummary& summary) {
  std::string out = "phase,n,acc,ci_lo,ci_hi\n";
  for (const PhaseRow& p : summary.phases) {
    out += fmt::format("{},{},{:.6f},{:.6f},{:.6f}\n", p.r, p.n, p.acc, p.ci_lo, p.ci_hi);
  }
  return out;
}

std::string terminal_table(const PhaseSummary& s, const std::string& label) {
  std::string out =
      fmt::format("{}: M = {}, S = {}, {} examples, {} outcomes\n", label, s.modulus,
                  s.stride > 0 ? std::to_string(s.stride) : "unknown", s.examples, s.outcomes);
  out += per_phase_lines(s);
  out += fmt::format("mean {:.3f} | best r={} {:.3f} | worst r={} {:.3f} [{:.3f}, {:.3f}]\n",
                     s.mean_acc, s.best_phase, s.best_acc, s.worst_phase, s.worst_acc,
                     s.worst_acc_ci.lo, s.worst_acc_ci.hi);
  out += fmt::format("gap {} | period {} | chi2 {:.1f}, df {}, p = {}\n", format_gap(s),
                     format_period(s), s.chi_square.statistic, s.chi_square.df,
                     format_p(s.chi_square.p_value));
  if (s.split) out += split_line(s);
  if (s.periodicity_check_pp) {
    out += fmt::format("periodicity (S = {}): mean |A(r) - A(r+{})| = {:.1f} pp\n", s.stride,
                       s.stride, *s.periodicity_check_pp);
  }
  return out;
}

std::string compare_table(const PhaseSeries& series) {
  std::vector<std::vector<std::string>> rows = {{"label", "M", "S", "examples", "mean", "worst (r)",
                                                 "gap [95% CI]", "interior gap", "period (p)"}};
  for (const auto& [label, s] : series) {
    rows.push_back({label, std::to_string(s.modulus), s.stride > 0 ? std::to_string(s.stride) : "-",
                    std::to_string(s.examples), fmt::format("{:.3f}", s.mean_acc),
                    fmt::format("{:.3f} ({})", s.worst_acc, s.worst_phase), format_gap(s),
                    s.split ? fmt::format("{:.1f} pp", s.split->interior_gap_pp) : "-",
                    format_period(s)});
  }
  return render_columns(rows, "lrrrrrrrl");
}

void write_sweep_outputs(const std::string& dir, const std::string& label,
                         const PhaseSummary& summary, const nlohmann::json& meta) {
  const std::filesystem::path base(dir);
  nlohmann::json j = summary.to_json();
  j["label"] = label;
  j["meta"] = meta;
  write_file_atomic((base / "summary.json").string(), j.dump(2) + "\n");
  write_file_atomic((base / "phase.csv").string(), phase_csv(summary));
  write_file_atomic((base / "phase.svg").string(), phase_svg({{label, summary}}, label));
  write_file_atomic((base / "report.html").string(), report_html(label, summary, meta));
}

}  // namespace phasekv
