#include "suite/report.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <optional>
#include <vector>

#include "eval/stats.h"
#include "report/report.h"
#include "suite/runs.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/json_read.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string pct(double v) { return std::isfinite(v) ? fmt::format("{:.1f}", 100 * v) : "-"; }
std::string num(const json& j, const char* key, const char* fmtstr = "{:.1f}") {
  return j.contains(key) && j[key].is_number() ? fmt::format(fmt::runtime(fmtstr), j[key].get<double>())
                                               : "-";
}

// The report's family of tests: the period test of every sweep and the interior test of every
// sweep that has one, Holm-adjusted together (about 96 tests for the 24-run suite), so that
// "significant" in the table and in the findings holds at 5 % for the whole page.
struct Adjusted {
  std::map<const PhaseSummary*, double> period;
  std::map<const SweepData*, double> interior;
  int tests = 0;
};
Adjusted adjust(const std::vector<RunData>& runs) {
  std::vector<double> p;
  std::vector<const PhaseSummary*> ps;
  std::vector<const SweepData*> is;
  for (const auto& r : runs)
    for (const auto& [padding, d] : r.sweeps) {
      if (d.summary.period.detected > 0 && d.summary.period.permutations > 0) {
        p.push_back(d.summary.period.p_value);
        ps.push_back(&d.summary);
        is.push_back(nullptr);
      }
      if (d.interior) {
        p.push_back(d.interior->p_value);
        ps.push_back(nullptr);
        is.push_back(&d);
      }
    }
  const std::vector<double> holm = holm_adjust(p);
  Adjusted a;
  a.tests = static_cast<int>(p.size());
  for (size_t k = 0; k < p.size(); ++k)
    ps[k] ? void(a.period[ps[k]] = holm[k]) : void(a.interior[is[k]] = holm[k]);
  return a;
}
double holm_period(const Adjusted& a, const PhaseSummary& s) {
  const auto it = a.period.find(&s);
  return it == a.period.end() ? 1.0 : it->second;
}
double holm_interior(const Adjusted& a, const SweepData& d) {
  const auto it = a.interior.find(&d);
  return it == a.interior.end() ? 1.0 : it->second;
}

bool significant(const Adjusted& a, const PhaseSummary& s) {
  return s.period.detected > 0 && s.period.permutations > 0 && holm_period(a, s) < 0.05;
}

// "4 (p = 0.001, Holm 0.02)"
std::string period_cell(const Adjusted& a, const PhaseSummary& s) {
  if (s.period.detected <= 0) return format_period(s);
  return fmt::format("{} (p = {}, Holm {}{})", s.period.detected, format_p(s.period.p_value),
                     format_p(holm_period(a, s)), significant(a, s) ? "" : ", n.s.");
}

// A sweep that cannot count as evidence either way: no phase shown above the shortcut (the
// model does not retrieve), or every phase at 99 % or more (no room for a phase effect).
constexpr double kCeiling = 0.99;
std::string uninformative(const SweepData& d) {
  PhaseSummary s = d.summary;
  if (std::isfinite(d.shortcut)) s.shortcut = d.shortcut;
  if (s.at_or_below_shortcut()) return "at or below the shortcut";
  if (s.worst_acc >= kCeiling) return "at ceiling";
  return "";
}

// Which CPU trained the runs (model/train.json): one line, each CPU with the runs it trained
// when there are several (a suite resumed on another machine), and the trained runs that do
// not record it.
std::string cpu_line(const std::vector<RunData>& runs) {
  std::map<std::string, std::vector<std::string>> by_cpu;
  for (const auto& r : runs)
    if (r.trained) by_cpu[r.cpu].push_back(r.name);  // "": not recorded
  if (by_cpu.empty()) return "";
  std::vector<std::string> parts;
  for (const auto& [cpu, names] : by_cpu)
    if (!cpu.empty())
      parts.push_back(by_cpu.size() == 1 ? cpu
                                         : fmt::format("{}: {}", cpu, json_read::join(names, ", ")));
  if (by_cpu.count(""))  // listed last
    parts.push_back("not recorded (trained before train.json named it): " +
                    json_read::join(by_cpu[""], ", "));
  return "Trained on " + json_read::join(parts, "; ") + ".\n\n";
}

std::string run_kind(const RunData& r) {
  return r.stride > 0 ? fmt::format("W{}/S{}", r.width, r.stride) : "full";
}

// A depth x phase heatmap: rows depths, columns phases, accuracy 0 (dark) .. 1 (light).
std::string depth_heatmap_svg(const std::map<double, PhaseSummary>& depths, const std::string& title) {
  const int M = depths.begin()->second.modulus;
  const int cw = 22, ch = 22, left = 70, top = 40;
  const int width = left + M * cw + 20, height = top + static_cast<int>(depths.size()) * ch + 40;
  std::string s = fmt::format(
      "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" font-family=\"sans-serif\" "
      "font-size=\"11\">\n<text x=\"{}\" y=\"20\" font-size=\"13\">{}</text>\n",
      width, height, left, xml_escape(title));
  int row = 0;
  for (const auto& [depth, sum] : depths) {
    const int y = top + row * ch;
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">depth {:g}</text>\n", left - 6,
                     y + 15, depth);
    for (const auto& p : sum.phases) {
      const int shade = static_cast<int>(std::lround(40 + 215 * std::clamp(p.acc, 0.0, 1.0)));
      s += fmt::format(
          "<rect x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"rgb({},{},255)\"><title>depth "
          "{:g}, phase {}: {:.3f}</title></rect>\n",
          left + p.r * cw, y, cw - 1, ch - 1, shade, shade, depth, p.r, p.acc);
    }
    ++row;
  }
  for (int r = 0; r < M; r += std::max(1, M / 12))
    s += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{}</text>\n",
                     left + r * cw + cw / 2, top + row * ch + 14, r);
  s += fmt::format("<text x=\"{}\" y=\"{}\">phase r (target key position mod {}); lighter = more accurate</text>\n",
                   left, top + row * ch + 32, M);
  return s + "</svg>\n";
}

struct Finding {
  std::string claim, rule, verdict, evidence;
};

std::vector<Finding> findings(const std::vector<RunData>& runs, const Adjusted& adj) {
  auto prefix = [](const RunData& r) -> const SweepData* {
    auto it = r.sweeps.find("prefix");
    return it == r.sweeps.end() ? nullptr : &it->second;
  };
  std::vector<Finding> out;
  // Lists an uninformative prefix sweep in the finding's evidence and tells the caller to skip it.
  auto skip = [&](const RunData& r, Finding& f) {
    const std::string why = prefix(r) ? uninformative(*prefix(r)) : "";
    if (!why.empty()) f.evidence += fmt::format("{}: uninformative ({}); ", r.name, why);
    return !why.empty();
  };
  auto verdict = [](int yes, int total) {
    return total == 0 ? std::string("not tested")
           : yes == total ? std::string("**reproduced**")
           : yes == 0     ? std::string("**not reproduced**")
                          : std::string("**partly**");
  };
  {  // 1. period follows S, not W
    Finding f{"The dominant period equals the stride S, not the width W",
              "every run with W != S (prefix) has a significant detected period equal to S", "", ""};
    int yes = 0, n = 0;
    for (const auto& r : runs)
      if (r.stride > 0 && r.width != r.stride && prefix(r)) {
        const auto& s = prefix(r)->summary;
        if (skip(r, f)) continue;
        ++n;
        yes += significant(adj, s) && s.period.detected == r.stride;
        f.evidence += fmt::format("{} ({}): period {}; ", r.name, run_kind(r), period_cell(adj, s));
      }
    f.verdict = verdict(yes, n);
    out.push_back(f);
  }
  {  // 2. controls flat
    Finding f{"Full-attention controls have no significant period",
              "every informative control (no chunked layer) has Holm-adjusted period p >= 0.05 "
              "(prefix); the gap's 95 % upper bound says how flat that is", "", ""};
    int yes = 0, n = 0;
    for (const auto& r : runs)
      if (r.stride == 0 && prefix(r)) {
        if (skip(r, f)) continue;
        ++n;
        const auto& s = prefix(r)->summary;
        yes += !significant(adj, s);
        f.evidence +=
            fmt::format("{}: {}, gap <= {:.1f} pp; ", r.name, period_cell(adj, s), s.gap_ci_pp.hi);
      }
    f.verdict = verdict(yes, n);
    out.push_back(f);
  }
  {  // 3. no RoPE / uniform averaging keep the period
    Finding f{"The period survives removing RoPE and learned gates (uniform averaging)",
              "every chunked run with rope_dims = 0 or gate = mean has a significant period equal "
              "to S (prefix)", "", ""};
    int yes = 0, n = 0;
    for (const auto& r : runs) {
      if (r.stride == 0 || !prefix(r)) continue;
      bool mean_gate = false;
      for (const auto& l : r.config["model"]["layers"])
        mean_gate = mean_gate || (l.value("kind", "") == "chunked" && l.value("gate", "") == "mean");
      if (r.config["model"].value("rope_dims", -1) != 0 && !mean_gate) continue;
      const auto& s = prefix(r)->summary;
      if (skip(r, f)) continue;
      ++n;
      yes += significant(adj, s) && s.period.detected == r.stride;
      f.evidence += fmt::format("{}: period {}; ", r.name, period_cell(adj, s));
    }
    f.verdict = verdict(yes, n);
    out.push_back(f);
  }
  {  // 4. interior phases differ
    Finding f{"Interior phases 0..S-2 differ significantly, not only the boundary phase",
              "in every informative chunked run with a significant period (prefix), the interior "
              "phases folded mod S differ (sign-flip test of whole examples, Holm-adjusted "
              "p < 0.05)", "", ""};
    int yes = 0, n = 0;
    for (const auto& r : runs) {
      const SweepData* d = prefix(r);
      if (r.stride < 3 || !d || !d->interior || !significant(adj, d->summary)) continue;
      if (skip(r, f)) continue;
      ++n;
      yes += holm_interior(adj, *d) < 0.05;
      f.evidence += fmt::format("{}: interior gap {:.1f} pp, p = {} (Holm {}); ", r.name,
                                d->fold->split ? d->fold->split->interior_gap_pp : NAN,
                                format_p(d->interior->p_value), format_p(holm_interior(adj, *d)));
    }
    f.verdict = verdict(yes, n);
    out.push_back(f);
  }
  {  // 5. seed spread smaller than the gap
    Finding f{"Seed-to-seed spread is smaller than the gap",
              "for runs that differ only in train.seed (prefix): the standard deviation of the gap "
              "across seeds is below the mean gap", "", ""};
    std::map<std::string, std::vector<const RunData*>> groups;
    for (const auto& r : runs) {
      if (!prefix(r)) continue;
      json c = r.config;
      c["train"].erase("seed");
      groups[c.dump()].push_back(&r);
    }
    int yes = 0, n = 0;
    for (const auto& [key, g] : groups) {
      if (g.size() < 2) continue;
      double sum = 0, sq = 0;
      for (const auto* r : g) sum += prefix(*r)->summary.gap_pp;
      const double mean = sum / static_cast<double>(g.size());
      for (const auto* r : g) sq += std::pow(prefix(*r)->summary.gap_pp - mean, 2);
      const double sd = std::sqrt(sq / static_cast<double>(g.size() - 1));
      ++n;
      yes += sd < mean;
      f.evidence += fmt::format("{} and {} more: gap {:.1f} pp mean, SD {:.1f} pp over {} seeds; ",
                                g.front()->name, g.size() - 1, mean, sd, g.size());
    }
    f.verdict = verdict(yes, n);
    out.push_back(f);
  }
  {  // 6. a mean close to the control's hides a worst phase far below it
    Finding f{"A mean close to the control's can hide a worst phase far below it",
              "some chunked run has a mean within 10 pp of a control with the same KV heads and a "
              "worst phase at least 20 pp below that control's worst (prefix)", "", ""};
    int found = 0, n = 0;
    for (const auto& c : runs) {
      if (c.stride != 0 || !prefix(c)) continue;
      if (!uninformative(*prefix(c)).empty()) continue;  // a control at ceiling has no worst phase
      for (const auto& r : runs) {
        if (r.stride == 0 || !prefix(r) || !uninformative(*prefix(r)).empty()) continue;
        if (r.config["model"]["n_kv_heads"] != c.config["model"]["n_kv_heads"]) continue;
        ++n;
        const auto& a = prefix(r)->summary;
        const auto& b = prefix(c)->summary;
        if (std::abs(a.mean_acc - b.mean_acc) <= 0.10 && a.worst_acc <= b.worst_acc - 0.20) {
          ++found;
          f.evidence += fmt::format("{} mean {} vs {} {}, worst {} vs {}; ", r.name, pct(a.mean_acc),
                                    c.name, pct(b.mean_acc), pct(a.worst_acc), pct(b.worst_acc));
        }
      }
    }
    f.verdict = n == 0 ? "not tested" : found > 0 ? "**reproduced**" : "**not reproduced**";
    if (found == 0 && n > 0) f.evidence = fmt::format("no such pair among {} compared", n);
    out.push_back(f);
  }
  return out;
}

}  // namespace

int write_repro_report(const ReproReportOptions& o) {
  LoadSuiteOptions load;
  load.fold = true;
  SuiteResults results = load_suite_results(o.suite_dir, load);
  const json& suite = results.suite;
  std::vector<RunData>& runs = results.runs;
  const Adjusted adjusted = adjust(runs);
  const fs::path md(o.out_md);
  const fs::path fig_dir = md.parent_path() / md.stem().string();
  const std::string fig_rel = md.stem().string();
  int found = 0;
  for (const auto& r : runs) found += static_cast<int>(r.sweeps.size());

  const int M = suite["modulus"].get<int>();
  const auto finished = std::count_if(runs.begin(), runs.end(),
                                      [](const auto& r) { return !r.sweeps.empty(); });
  std::string page = fmt::format(
      "# Reproduction: {}\n\nGenerated by `{}` from the run directories of `{}` (suite file `{}`); "
      "do not edit by hand. Accuracy in %, gaps in pp; the study's figure (its Qwen3-0.6B "
      "backbone trained on 100B tokens) is beside each row it has one for. Every run of the suite "
      "file is listed, including those without results yet.\n\n",
      suite["name"].get<std::string>(), o.command, o.suite_dir, suite["path"].get<std::string>());
  page += cpu_line(runs);
  if (finished < static_cast<std::ptrdiff_t>(runs.size()))
    page += fmt::format(
        "**Partial: {} of {} runs have results.** The findings below are judged on those runs only "
        "and may change as the others finish (`phasekv repro` resumes the suite).\n\n",
        finished, runs.size());
  page += fmt::format(
      "Each run: training, then sweeps of {} logical examples at every phase mod {} with each "
      "padding, summarised from their records by this build (docs/STATISTICS.md). `gap` is best "
      "minus worst phase with its simultaneous 95 % interval and, after `null`, the gap a flat "
      "profile shows with the same examples. `period` is the detected period with its sign-flip "
      "p and its Holm-adjusted p over the page's {} tests (period and interior tests of every "
      "sweep): a finding calls a period significant when the adjusted p is below 0.05. `fold S` "
      "columns fold the same records mod the run's own stride; `interior` is the gap among "
      "phases 0..S-2 of that fold and the sign-flip p (Holm-adjusted) that they differ. A sweep "
      "with no phase above the shortcut or every phase at 99 % or more is uninformative: the "
      "findings list it and count it neither way. "
      "`shortcut` is the accuracy reachable without reading keys: a run at or below it shows no "
      "retrieval, and its phase pattern means nothing. `val loss` is the cross-entropy of the "
      "target answer on held-out examples at the end of training; the study's (in parentheses) "
      "is a text validation loss, a different quantity.\n\n",
      suite["examples"].get<int>(), M, adjusted.tests);
  page += "| run | kind | padding | train loss | val loss (study) | eval acc | mean | best | worst | gap [95% CI] | "
          "period (p) | fold S: interior gap (p) | boundary | shortcut | study mean / worst / gap |\n"
          "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n";
  for (const auto& r : runs) {
    const std::string study =
        r.study.contains("label")
            ? fmt::format("{} / {} / {} ({})", num(r.study, "mean"), num(r.study, "worst"),
                          num(r.study, "gap"), r.study["label"].get<std::string>())
            : "-";
    const std::string loss = r.train_loss ? fmt::format("{:.3f}", *r.train_loss) : "-";
    const std::string acc = r.eval_acc ? pct(*r.eval_acc) : "-";
    const std::string val = fmt::format("{} ({})", r.eval_loss ? fmt::format("{:.3f}", *r.eval_loss) : "-",
                                        num(r.study, "val_loss", "{:.3f}"));
    if (r.sweeps.empty()) {
      page += fmt::format("| {} | {} | (pending) | {} | {} | {} | | | | | | | | | {} |\n", r.name,
                          run_kind(r), loss, val, acc, study);
      continue;
    }
    for (const auto& [padding, d] : r.sweeps) {
      const auto& s = d.summary;
      std::string interior = "-", boundary = "-";
      if (d.fold && d.fold->split && d.interior) {
        interior = fmt::format("{:.1f} (p = {}, Holm {})", d.fold->split->interior_gap_pp,
                               format_p(d.interior->p_value), format_p(holm_interior(adjusted, d)));
        boundary = pct(d.fold->split->boundary_acc);
      }
      page += fmt::format("| {} | {} | {} | {} | {} | {} | {} | {} | {} (r={}) | {} | {} | {} | {} | {} | {} |\n",
                          r.name, run_kind(r), padding, loss, val, acc, pct(s.mean_acc), pct(s.best_acc),
                          pct(s.worst_acc), s.worst_phase,
                          fmt::format("{} null {:.1f}", format_gap(s), s.null_gap_pp),
                          period_cell(adjusted, s),
                          interior, boundary, pct(d.shortcut), study);
    }
  }

  page += "\n## The study's findings\n\n| finding | rule | verdict | evidence |\n|---|---|---|---|\n";
  for (const auto& f : findings(runs, adjusted))
    page += fmt::format("| {} | {} | {} | {} |\n", f.claim, f.rule, f.verdict,
                        f.evidence.empty() ? "-" : f.evidence);

  page += "\n## Accuracy by phase\n\n";
  for (const auto& r : runs) {
    if (r.sweeps.empty()) continue;
    PhaseSeries series;
    for (const auto& [padding, d] : r.sweeps) series.emplace_back(padding, d.summary);
    const std::string file = r.name + ".svg";
    write_file_atomic((fig_dir / file).string(),
                      phase_svg(series, fmt::format("{} ({})", r.name, run_kind(r))));
    page += fmt::format("![{}]({}/{})\n", r.name, fig_rel, file);
  }
  for (const auto& r : runs) {
    if (r.depths.empty()) continue;
    const std::string file = r.name + "-depth.svg";
    write_file_atomic((fig_dir / file).string(),
                      depth_heatmap_svg(r.depths, r.name + ": accuracy by target depth and phase"));
    page += fmt::format("\n## Depth x phase: {}\n\n![depth x phase]({}/{})\n", r.name, fig_rel, file);
  }
  write_file_atomic(o.out_md, page);
  return found;
}

}  // namespace phasekv
