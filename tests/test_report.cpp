// Report renderers: exact CSV, well-formed SVG/HTML with the right number of marks, no external
// references, and the sweep writer's files.
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "report/report.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

const auto simulate = test::simulate_outcomes;

// M = 8, S = 4, weak spot at phases 3 and 7.
const PhaseSummary& period4_summary() {
  static const PhaseSummary s = summarize(
      simulate({0.95, 0.95, 0.95, 0.6, 0.95, 0.95, 0.95, 0.6}, 200, 1), 8, 4, {200, 200, 1});
  return s;
}

const PhaseSummary& flat_summary() {
  static const PhaseSummary s =
      summarize(simulate(std::vector<double>(8, 0.8), 200, 2), 8, 0, {200, 200, 1});
  return s;
}

// Minimal well-formedness check: start and end tags nest properly; `<x .../>` and the HTML void
// elements close themselves; <!DOCTYPE> and comments are skipped. Returns "" or the problem.
std::string tag_structure_error(const std::string& doc) {
  static const std::set<std::string> kVoid = {"meta", "br", "hr", "img", "link", "input"};
  std::vector<std::string> open;
  for (size_t lt = doc.find('<'); lt != std::string::npos; lt = doc.find('<', lt + 1)) {
    const size_t gt = doc.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag at " + std::to_string(lt);
    const std::string tag = doc.substr(lt + 1, gt - lt - 1);
    if (tag.empty()) return "empty tag at " + std::to_string(lt);
    if (tag[0] == '!' || tag[0] == '?') continue;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "unexpected </" + name + ">";
      open.pop_back();
      continue;
    }
    const std::string name = tag.substr(0, tag.find_first_of(" \n/"));
    if (tag.back() != '/' && !kVoid.count(name)) open.push_back(name);
  }
  return open.empty() ? "" : "unclosed <" + open.back() + ">";
}

TEST(Report, CsvExact) {
  // Phase 0: 2 of 2 correct; phase 1: 1 of 2. Wilson by hand: 2/2 -> [0.342380, 1],
  // 1/2 -> [0.094531, 0.905469].
  const std::vector<PhaseOutcome> outcomes = {
      {0, 0, true}, {0, 1, false}, {1, 0, true}, {1, 1, true}};
  const PhaseSummary s = summarize(outcomes, 2, 0, {10, 10, 1});
  EXPECT_EQ(phase_csv(s),
            "phase,n,acc,ci_lo,ci_hi\n"
            "0,2,1.000000,0.342380,1.000000\n"
            "1,2,0.500000,0.094531,0.905469\n");
}

TEST(Report, SvgIsWellFormedWithOneErrorBarPerPhase) {
  const std::string svg = phase_svg({{"model <A> & co", period4_summary()}}, "title \"x\" <y>");
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_EQ(tag_structure_error(svg), "");
  EXPECT_EQ(test::occurrences(svg, "class=\"errbar\""), 8u);
  EXPECT_EQ(test::occurrences(svg, "class=\"point\""), 8u);
  EXPECT_EQ(test::occurrences(svg, "class=\"mean\""), 1u);
  EXPECT_EQ(test::occurrences(svg, "class=\"stride\""), 1u);  // the boundary between phases 3 and 4
  EXPECT_EQ(test::occurrences(svg, "class=\"boundary\""), 2u);  // shaded phases 3 and 7
  EXPECT_EQ(test::occurrences(svg, "class=\"legend\""), 0u);    // one series: no legend
  EXPECT_CONTAINS(svg, "title &quot;x&quot; &lt;y&gt;");
  EXPECT_CONTAINS(svg, "model &lt;A&gt; &amp; co");
  EXPECT_NOT_CONTAINS(svg, "<A>");
  EXPECT_EQ(test::occurrences(svg, "http"), 1u);  // only the xmlns namespace
  EXPECT_CONTAINS(svg, "dotted: entry boundaries (S = 4)");
  EXPECT_NOT_CONTAINS(svg, "window");  // "window" is the raw window n_win only
}

TEST(Report, SvgLegendShortensLongLabelsKeepingTheirEnd) {
  const std::string label = std::string(50, 'a') + "/kv-chunked-0123456789";
  const std::string svg = phase_svg({{label, flat_summary()}, {"short", period4_summary()}}, "t");
  // Ellipsis plus the last 39 characters; the full label stays in the tooltip.
  EXPECT_CONTAINS(svg, ">\u2026" + label.substr(label.size() - 39) + "</text>");
  EXPECT_CONTAINS(svg, "<title>" + label + "</title>");
  EXPECT_CONTAINS(svg, "<title>short</title>short</text>");
}

TEST(Report, SvgSeveralSeriesShareLegendAndStride) {
  // The flat series does not know its stride; the known one (4) is drawn.
  const std::string svg = phase_svg({{"flat", flat_summary()}, {"weak", period4_summary()}}, "t");
  EXPECT_EQ(tag_structure_error(svg), "");
  EXPECT_EQ(test::occurrences(svg, "class=\"errbar\""), 16u);
  EXPECT_EQ(test::occurrences(svg, "class=\"mean\""), 2u);
  EXPECT_EQ(test::occurrences(svg, "class=\"legend\""), 1u);
  EXPECT_EQ(test::occurrences(svg, "class=\"stride\""), 1u);
  // Series that disagree on the stride: no entry boundaries are claimed.
  PhaseSummary stride2 = flat_summary();
  stride2.stride = 2;
  const std::string mixed = phase_svg({{"s2", stride2}, {"s4", period4_summary()}}, "t");
  EXPECT_EQ(test::occurrences(mixed, "class=\"stride\""), 0u);
  EXPECT_EQ(test::occurrences(mixed, "class=\"boundary\""), 0u);
  EXPECT_THROW(phase_svg({}, "empty"), Error);
}

// The 95 % Wilson score interval of k successes in n, written out here so that the chart is
// checked against a formula independent of eval/stats.
std::pair<double, double> wilson95(int k, int n) {
  const double z = 1.959963984540054, p = static_cast<double>(k) / n, z2n = z * z / n;
  const double centre = (p + z2n / 2) / (1 + z2n);
  const double half = z * std::sqrt(p * (1 - p) / n + z * z / (4.0 * n * n)) / (1 + z2n);
  return {std::max(0.0, centre - half), std::min(1.0, centre + half)};
}

// Reads the chart back: the y axis from its own tick labels, then every point and error bar as an
// accuracy. Points, bars and tooltips must be the per-phase numbers, phase by phase, left to right.
TEST(Report, SvgPointsAndErrorBarsReadBackAsAccuracyAndWilsonInterval) {
  const int kExamples = 5;
  const std::vector<int> correct = {5, 3, 0, 1};  // per phase, of 5
  std::vector<PhaseOutcome> outcomes;
  for (int e = 0; e < kExamples; ++e)
    for (int r = 0; r < 4; ++r) outcomes.push_back({e, r, e < correct[static_cast<size_t>(r)]});
  const std::string svg = phase_svg({{"mixed", summarize(outcomes, 4, 0, {10, 10, 1})}}, "t");
  ASSERT_EQ(tag_structure_error(svg), "");

  // The y axis: six gridlines labelled 0.0 .. 1.0, 0.0 on the plot frame's bottom edge and 1.0 on
  // its top edge.
  const std::regex tick_re(
      "<line x1=\"[0-9.]+\" y1=\"([0-9.]+)\" x2=\"[0-9.]+\" y2=\"\\1\" stroke=\"#dddddd\"/>\n"
      "<text [^>]*text-anchor=\"end\">([0-9.]+)</text>");
  std::map<std::string, double> tick_y;
  for (std::sregex_iterator it(svg.begin(), svg.end(), tick_re), end; it != end; ++it)
    tick_y[(*it)[2]] = std::stod((*it)[1]);
  ASSERT_EQ(tick_y.size(), 6u) << svg;
  ASSERT_TRUE(tick_y.count("0.0") && tick_y.count("1.0")) << svg;
  const double y0 = tick_y["0.0"], y1 = tick_y["1.0"];
  ASSERT_GT(y0, y1);  // accuracy grows upwards
  std::smatch frame;
  ASSERT_TRUE(std::regex_search(svg, frame,
                                std::regex("<rect x=\"[0-9.]+\" y=\"([0-9.]+)\" width=\"[0-9.]+\" "
                                           "height=\"([0-9.]+)\" fill=\"none\"")))
      << svg;
  EXPECT_NEAR(y1, std::stod(frame[1]), 0.05);
  EXPECT_NEAR(y0, std::stod(frame[1]) + std::stod(frame[2]), 0.05);
  for (const auto& [label, y] : tick_y)  // the other ticks lie on the same linear axis
    EXPECT_NEAR(y, y0 + std::stod(label) * (y1 - y0), 0.05) << label;
  auto acc_at = [&](const std::string& y) { return (y0 - std::stod(y)) / (y0 - y1); };
  const double kTol = 1e-3;  // coordinates are written to 0.1 px of a ~300 px axis

  const std::regex point_re(
      "<circle class=\"point\" cx=\"([0-9.]+)\" cy=\"([0-9.]+)\" [^>]*><title>([^<]*)</title>");
  const std::regex bar_re("<path class=\"errbar\" d=\"M([0-9.]+),([0-9.]+)V([0-9.]+)M");
  const std::regex label_re(
      "<text x=\"([0-9.]+)\" y=\"[0-9.]+\" text-anchor=\"middle\">([0-9]+)</text>");
  std::vector<std::smatch> points, bars, labels;
  for (std::sregex_iterator it(svg.begin(), svg.end(), point_re), end; it != end; ++it)
    points.push_back(*it);
  for (std::sregex_iterator it(svg.begin(), svg.end(), bar_re), end; it != end; ++it)
    bars.push_back(*it);
  for (std::sregex_iterator it(svg.begin(), svg.end(), label_re), end; it != end; ++it)
    labels.push_back(*it);
  ASSERT_EQ(points.size(), correct.size()) << svg;
  ASSERT_EQ(bars.size(), correct.size()) << svg;
  ASSERT_EQ(labels.size(), correct.size()) << svg;  // the x axis: one label per phase
  double mean = 0.0;
  for (size_t r = 0; r < correct.size(); ++r) {
    SCOPED_TRACE("phase " + std::to_string(r));
    const double acc = static_cast<double>(correct[r]) / kExamples;
    const auto [lo, hi] = wilson95(correct[r], kExamples);
    mean += acc / static_cast<double>(correct.size());
    EXPECT_EQ(labels[r][2], std::to_string(r));
    EXPECT_EQ(points[r][1], labels[r][1]);  // one series: the point sits over its phase label
    if (r > 0) {
      EXPECT_GT(std::stod(points[r][1]), std::stod(points[r - 1][1]));
    }
    EXPECT_NEAR(acc_at(points[r][2]), acc, kTol);
    EXPECT_EQ(bars[r][1], points[r][1]);  // the bar stands on its point's x
    EXPECT_NEAR(acc_at(bars[r][2]), lo, kTol);
    EXPECT_NEAR(acc_at(bars[r][3]), hi, kTol);
    EXPECT_EQ(points[r][3].str(),
              fmt::format("mixed r={}: {:.3f} [{:.3f}, {:.3f}], n={}", r, acc, lo, hi, kExamples));
  }
  std::smatch mean_line;
  ASSERT_TRUE(
      std::regex_search(svg, mean_line, std::regex("<line class=\"mean\" [^>]*y1=\"([0-9.]+)\"")));
  EXPECT_NEAR(acc_at(mean_line[1]), mean, kTol);
  EXPECT_CONTAINS(svg, "bars: 95% Wilson CI; dashed: mean");
  EXPECT_CONTAINS(svg, "phase r = target position mod 4");
}

TEST(Report, HtmlIsSelfContained) {
  const nlohmann::json meta = {{"model", "tiny <w8s8>"}, {"seed", 3}};
  const std::string html = report_html("run-1", period4_summary(), meta);
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_EQ(tag_structure_error(html), "");
  std::string stripped = html;
  const std::string xmlns = "http://www.w3.org/2000/svg";
  for (size_t pos; (pos = stripped.find(xmlns)) != std::string::npos;)
    stripped.erase(pos, xmlns.size());
  EXPECT_NOT_CONTAINS(stripped, "http://");
  EXPECT_NOT_CONTAINS(stripped, "https://");
  for (const char* ref : {"src=", "href=", "@import", "url(", "<script"}) {
    EXPECT_NOT_CONTAINS(html, ref) << ref;
  }
  EXPECT_EQ(test::occurrences(html, "<svg"), 1u);
  EXPECT_EQ(test::occurrences(html, "class=\"errbar\""), 8u);
  EXPECT_CONTAINS(html, "tiny &lt;w8s8&gt;");
  EXPECT_CONTAINS(html, "Detected period 4");
  // Per-phase table: one row per phase plus the header, and the period table marks its choice.
  EXPECT_EQ(test::occurrences(html, "<tr class=\"worst\">"), 1u);
  EXPECT_EQ(test::occurrences(html, "<tr class=\"boundary\">"),
            1u);  // the other boundary row is the worst
  EXPECT_EQ(test::occurrences(html, "<tr class=\"detected\">"), 1u);
  EXPECT_EQ(test::occurrences(html, "<table class=\"phases\">\n<tr><th>phase</th><th>n</th>"), 1u);
  EXPECT_EQ(test::occurrences(html, "entry boundary"), 2u + 1u);  // phases 3 and 7, and the verdict
}

// A hand-made summary, so the verdict's text is exact (not subject to the bootstrap's draws).
PhaseSummary made_summary(int worst_phase, double worst, double best, double mean, double p) {
  PhaseSummary s;
  s.modulus = 8;
  s.stride = 4;
  s.worst_phase = worst_phase;
  s.worst_acc = worst;
  s.best_phase = 0;
  s.best_acc = best;
  s.mean_acc = mean;
  s.gap_pp = 100.0 * (best - worst);
  s.gap_ci_pp = {s.gap_pp - 4.2, s.gap_pp + 3.7};
  s.period.detected = 4;
  s.period.p_value = p;
  s.period.permutations = 1000;
  return s;
}

TEST(Report, VerdictPhaseSensitive) {
  const Verdict v = phase_verdict(made_summary(7, 0.507, 1.0, 0.869, 1.0 / 1001.0));
  EXPECT_EQ(v.kind, VerdictKind::kPhaseSensitive);
  EXPECT_EQ(v.text(),
            "phase-sensitive: period 4 (p = 0.001); worst phase r = 7 (entry boundary) at 0.507 "
            "vs best 1.000; the mean 0.869 hides a 49.3 pp gap (95 % CI [45.1, 53.0])");
  // An interior worst phase is not called a boundary; a stride-less summary never is.
  PhaseSummary s = made_summary(5, 0.507, 1.0, 0.869, 0.01);
  EXPECT_CONTAINS(phase_verdict(s).detail, "worst phase r = 5 at 0.507");
  s.stride = 0;
  s.worst_phase = 7;
  EXPECT_CONTAINS(phase_verdict(s).detail, "worst phase r = 7 at 0.507");
  // From simulated outcomes: the weak spot at the boundary phases 3 and 7 is found.
  const PhaseSummary& sim = period4_summary();
  const Verdict w = phase_verdict(sim);
  EXPECT_EQ(w.kind, VerdictKind::kPhaseSensitive);
  EXPECT_EQ(w.text().rfind("phase-sensitive: period 4 (p = " + format_p(sim.period.p_value) +
                               "; detected in 100 % of example resamples); worst phase r = " +
                               std::to_string(sim.worst_phase) + " (entry boundary) at ",
                           0),
            0u)
      << w.text();
  EXPECT_CONTAINS(w.detail, fmt::format("hides a {:.1f} pp gap", sim.gap_pp));
}

TEST(Report, VerdictFlat) {
  PhaseSummary s = made_summary(3, 0.994, 1.0, 0.998, 0.14);
  s.stride = 0;
  s.period.detected = 2;
  s.gap_ci_pp = {0.0, 2.1};
  const Verdict v = phase_verdict(s);
  EXPECT_EQ(v.kind, VerdictKind::kNoPeriodDetected);
  EXPECT_EQ(v.text(),
            "no periodic weak spot detected: period test p = 0.140; accuracy 0.998 \u00b1 0.004 "
            "across phases (worst phase r = 3 at 0.994 vs best 1.000; gap 0.6 pp, 95 % CI [0.0, "
            "2.1])");
  // p exactly 0.05 is not significant; a switched-off bootstrap leaves the interval out.
  s.period.p_value = 0.05;
  s.gap_ci_pp = {std::nan(""), std::nan("")};
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kNoPeriodDetected);
  EXPECT_CONTAINS(phase_verdict(s).detail, "gap 0.6 pp)");
  // Simulated flat profile.
  const Verdict f = phase_verdict(flat_summary());
  EXPECT_EQ(f.kind, VerdictKind::kNoPeriodDetected);
  EXPECT_EQ(f.text().rfind("no periodic weak spot detected: period test p = " +
                               format_p(flat_summary().period.p_value) + "; accuracy ",
                           0),
            0u)
      << f.text();
}

// With --min-gap: the sensitivity decides between "inconclusive" and the plain null, which then
// says why it can be trusted.
TEST(Report, VerdictWithMinGap) {
  PhaseSummary s = made_summary(3, 0.80, 0.95, 0.88, 0.31);
  s.gap_ci_pp = {0.0, 22.5};
  Sensitivity v;
  v.min_gap_pp = 10, v.stride = 4, v.examples = 40, v.power = 0.34, v.examples_needed = 160;
  s.sensitivity = v;
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kInconclusive);
  EXPECT_EQ(phase_verdict(s).text(),
            "inconclusive at 10 pp: no period found (p = 0.310), but 40 examples per phase detect "
            "a 10 pp dip every 4 phases with probability 34 % (simulated), and the data do not "
            "rule it out: about 160 examples per phase would detect it (phasekv plan --min-gap "
            "10); accuracy 0.880 \u00b1 0.080 across phases (worst phase r = 3 (entry boundary) at "
            "0.800 vs best 0.950; gap 15.0 pp, 95 % CI [0.0, 22.5])");
  s.sensitivity->power = 0.91;
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kNoPeriodDetected);
  EXPECT_CONTAINS(phase_verdict(s).text(),
                  "22.5]); 40 examples per phase detect a 10 pp dip every 4 phases with "
                  "probability 91 % (simulated)");
  s.sensitivity->power = 0.2;
  s.sensitivity->ruled_out = true;
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kNoPeriodDetected);
  EXPECT_CONTAINS(phase_verdict(s).text(),
                  "; a gap of 10 pp or more is ruled out (above the gap's 95 % interval)");
  // A detected period is not second-guessed.
  s.period.p_value = 0.001;
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kPhaseSensitive);
}

TEST(Report, VerdictWithoutAPeriodTest) {
  PhaseSummary s = made_summary(1, 0.5, 1.0, 0.75, 1.0);
  s.modulus = 2;
  s.stride = 0;
  s.period.detected = 0;  // M = 2 has no candidate period
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kNotTested);
  EXPECT_EQ(phase_verdict(s).text().rfind("no period test: M = 2 has no candidate period", 0), 0u);
  EXPECT_CONTAINS(phase_verdict(s).detail, "accuracy 0.750 \u00b1 0.250 across phases");
  // 0 permutations: p = 1 by construction, which must not read as "no weak spot".
  s = made_summary(7, 0.5, 1.0, 0.9, 1.0);
  s.period.permutations = 0;
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kNotTested);
  EXPECT_EQ(phase_verdict(s).text().rfind("no period test: 0 permutations were run; ", 0), 0u);
}

size_t position(const std::string& html, const std::string& needle) {
  const size_t pos = html.find(needle);
  EXPECT_NE(pos, std::string::npos) << needle;
  return pos;
}

TEST(Report, HtmlReadingOrderAndMetadataLists) {
  const nlohmann::json meta = {{"model_id", "kv-chunked@1234"},
                               {"backend", {{"kind", "local"}, {"config", {{"stride", 4}}}}},
                               {"mean_target_logprob_by_phase", {-0.5, -0.25}},
                               {"long", std::string(500, 'x')}};
  const std::string html = report_html("run-1", period4_summary(), meta);
  EXPECT_EQ(tag_structure_error(html), "");
  // Verdict, chart, per-phase table, statistics, then the collapsed metadata.
  const size_t verdict = position(html,
                                  "<p class=\"verdict sensitive\"><strong>phase-sensitive:"
                                  "</strong> period 4 (p = ");
  const size_t chart = position(html, "<svg");
  const size_t table = position(html, "<table class=\"phases\">");
  const size_t stats = position(html, "<table class=\"summary\">");
  const size_t details = position(html, "<details class=\"meta\">\n<summary>Run metadata");
  EXPECT_LT(verdict, chart);
  EXPECT_LT(chart, table);
  EXPECT_LT(table, stats);
  EXPECT_LT(stats, details);
  EXPECT_EQ(test::occurrences(html, "class=\"verdict"), 1u);
  EXPECT_CONTAINS(html, xml_escape(phase_verdict(period4_summary()).detail));
  // Key/value lists, nested for objects; no JSON text.
  EXPECT_CONTAINS(html,
                  "<li><span class=\"k\">model_id</span>: <span class=\"v\">kv-chunked@1234"
                  "</span></li>");
  EXPECT_CONTAINS(html,
                  "<span class=\"k\">backend</span>: \n<ul class=\"kv\">\n<li><span "
                  "class=\"k\">config</span>: \n<ul class=\"kv\">\n<li><span class=\"k\">"
                  "stride</span>: <span class=\"v\">4</span></li>");
  EXPECT_CONTAINS(html, "<span class=\"v\">-0.5, -0.25</span>");
  EXPECT_NOT_CONTAINS(html, "{&quot;");
  EXPECT_NOT_CONTAINS(html, "[-0.5");
  // What keeps it inside the viewport (measured by tests/browser).
  EXPECT_CONTAINS(html, "overflow-wrap: anywhere");
  EXPECT_CONTAINS(html, "max-width: 100%; height: auto;");
  EXPECT_EQ(test::occurrences(html, "<div class=\"scroll\">"), 2u);  // per-phase and summary tables
}

// An audit.json written before the grid's key followed the glossary ("context_tokens", now
// "context_len") renders the same length table as one written today.
TEST(Report, HtmlLengthGridReadsTheOldKeyToo) {
  auto meta_with = [](const std::string& key) {
    nlohmann::json meta = {{"lengths", nlohmann::json::array()}};
    for (int64_t tokens : {1024, 8192})
      meta["lengths"].push_back({{key, tokens},
                                 {"phase_acc", {0.9, 0.2}},
                                 {"phase_n", {10, 10}},
                                 {"mean_acc", 0.55},
                                 {"worst_phase", 1},
                                 {"worst_acc", 0.2},
                                 {"gap_pp", 70.0}});
    return meta;
  };
  auto grid_of = [&](const std::string& key) {  // the section, up to the metadata list
    const std::string html = report_html("run-1", period4_summary(), meta_with(key));
    const size_t at = html.find("<h2>By context length</h2>");
    return at == std::string::npos ? std::string()
                                   : html.substr(at, html.find("<details", at) - at);
  };
  const std::string now = grid_of("context_len");
  EXPECT_CONTAINS(now, ">8192<");
  EXPECT_EQ(grid_of("context_tokens"), now);
}

TEST(Report, CompareHtmlHasAVerdictPerSeries) {
  const std::string html = report_html({{"flat <f>", flat_summary()}, {"weak", period4_summary()}},
                                       "phasekv compare", {{"weak", "run-1"}});
  EXPECT_EQ(tag_structure_error(html), "");
  EXPECT_EQ(test::occurrences(html, "<li class=\"verdict "), 2u);
  const size_t flat = position(html,
                               "<li class=\"verdict none\"><span class=\"k\">flat &lt;f&gt;"
                               "</span> \u2014 <strong>no periodic weak spot detected:");
  const size_t weak = position(html,
                               "<li class=\"verdict sensitive\"><span class=\"k\">weak"
                               "</span> \u2014 <strong>phase-sensitive:");
  EXPECT_LT(flat, weak);  // in the order given
  EXPECT_LT(weak, position(html, "<svg"));
  // One side-by-side per-phase table: a column pair per series, a row per phase.
  EXPECT_EQ(test::occurrences(html, "<table class=\"phases\">"), 1u);
  EXPECT_EQ(test::occurrences(html, "<th class=\"label\" colspan=\"2\">"), 2u);
  const size_t start = html.find("<table class=\"phases\">");
  const std::string table = html.substr(start, html.find("</table>", start) - start);
  EXPECT_EQ(test::occurrences(table, "<tr>"), 2u + 8u);
  EXPECT_EQ(test::occurrences(table, "<td class=\"num worst\">"),
            4u);                                   // accuracy and CI, both series
  EXPECT_EQ(test::occurrences(html, "<h3>"), 2u);  // period detection per series
  EXPECT_CONTAINS(html, "<span class=\"k\">weak</span>: <span class=\"v\">run-1</span>");
}

TEST(Report, TerminalTable) {
  const PhaseSummary& s = period4_summary();
  const std::string text = terminal_table(s, "run-1");
  EXPECT_EQ(text.rfind("run-1: M = 8, S = 4, 200 examples, 1600 outcomes\n", 0), 0u);
  // Header line, column line, 8 phases, mean, gap, interior, periodicity.
  EXPECT_EQ(test::occurrences(text, "\n"), 14u);
  EXPECT_CONTAINS(text, "gap " + format_gap(s));
  EXPECT_CONTAINS(text, "period 4 (p = ");
  EXPECT_CONTAINS(text, "\n  phase    n    acc  95% CI\n");
  const size_t line3 = text.find("\n      3  ");
  ASSERT_NE(line3, std::string::npos);
  EXPECT_CONTAINS(text.substr(line3, text.find('\n', line3 + 1) - line3), "boundary");
}

TEST(Report, CompareTable) {
  const std::string text = compare_table({{"flat", flat_summary()}, {"weak", period4_summary()}});
  EXPECT_EQ(test::occurrences(text, "\n"), 3u);
  EXPECT_EQ(text.rfind("label", 0), 0u);
  EXPECT_CONTAINS(text, "\nflat ");
  EXPECT_CONTAINS(text, "\nweak ");
  EXPECT_CONTAINS(text, format_period(period4_summary()));
}

TEST(Report, Formatting) {
  EXPECT_EQ(format_p(0.0421), "0.042");
  EXPECT_EQ(format_p(1.0 / 1001.0), "0.001");
  EXPECT_EQ(format_p(3.1e-12), "3.1e-12");
  EXPECT_EQ(format_p(0.0), "<1e-300");
  EXPECT_EQ(xml_escape("a<b>&\"'"), "a&lt;b&gt;&amp;&quot;&#39;");
  EXPECT_CONTAINS(format_period(flat_summary()), "n.s.");
  PhaseSummary s = flat_summary();
  s.gap_pp = 12.34;
  s.gap_ci_pp = {10.0, 15.06};
  EXPECT_EQ(format_gap(s), "12.3 pp [10.0, 15.1]");
}

TEST(Report, WriteSweepOutputs) {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("phasekv_report_test_" + std::to_string(::getpid()));
  const nlohmann::json meta = {{"model", "tiny"}};
  write_sweep_outputs(dir.string(), "run-1", period4_summary(), meta);
  const nlohmann::json j = nlohmann::json::parse(read_file((dir / "summary.json").string()));
  EXPECT_EQ(j["label"], "run-1");
  EXPECT_EQ(j["meta"], meta);
  EXPECT_EQ(j["modulus"], 8);
  EXPECT_EQ(PhaseSummary::from_json(j).to_json()["gap_pp"], j["gap_pp"]);
  EXPECT_EQ(read_file((dir / "phase.csv").string()), phase_csv(period4_summary()));
  EXPECT_EQ(read_file((dir / "phase.svg").string()).rfind("<svg", 0), 0u);
  EXPECT_CONTAINS(read_file((dir / "report.html").string()), "run-1");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 4);  // no temp files
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
