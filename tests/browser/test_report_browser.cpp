// The HTML reports in a real browser: Debian's headless Chromium opens a report.html written by
// write_sweep_outputs and a compare.html of four series, at a 1280 x 900 viewport, and checks that
//  - the chart (one SVG with a point and an error bar per phase and series) and the per-phase table
//    render with a real size;
//  - nothing is wider than the viewport: the page does not scroll sideways and every element ends
//    inside it, except the contents of the tables' own scroll boxes; every SVG label lies inside
//    the SVG (nothing clipped). The collapsible sections are opened first, so the metadata lists
//    are measured too;
//  - no request leaves the file, checked three ways: (1) the file itself names no external
//    resource (no http(s)://, src=, href=, url(, @import, <link, <script ...); (2) in the browser
//    a Content-Security-Policy of default-src 'none' blocks every fetch a document could make
//    (images, styles, fonts, frames, ...) and each blocked attempt is recorded as a violation,
//    and the Resource Timing list of fetched subresources must be empty; (3) the browser runs
//    with every host name resolving to nothing (--host-resolver-rules), so even a request that
//    slipped through could not reach the network.
// The report must contain no script (checked in (1)); to measure, the test writes an instrumented
// copy: a violation listener and the CSP at the top of <head>, a probe script before </body> that
// writes its measurements as JSON into a <pre id="phasekv-probe"> which --dump-dom returns.
//
// A separate binary on phasekv_base (no libtorch), registered in ctest with the label `browser`
// (`ctest -LE browser` leaves it out). It skips when Chromium is missing: /usr/bin/chromium, or
// the path in PHASEKV_CHROMIUM. scripts/install-deps.sh installs it, so CI runs it. About 5 s.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "report/report.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

constexpr int kViewportWidth = 1280;
constexpr int kViewportHeight = 900;

std::string chromium_path() {
  const char* env = std::getenv("PHASEKV_CHROMIUM");
  return env != nullptr && *env != '\0' ? env : "/usr/bin/chromium";
}

bool chromium_available() {
  return ::access(chromium_path().c_str(), X_OK) == 0;
}

// Single-quoted for /bin/sh.
std::string shell_quote(const std::string& s) {
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

std::vector<PhaseOutcome> simulate(const std::vector<double>& profile, int examples,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<PhaseOutcome> out;
  for (int e = 0; e < examples; ++e) {
    for (int r = 0; r < static_cast<int>(profile.size()); ++r) {
      const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
      out.push_back({e, r, u < profile[r]});
    }
  }
  return out;
}

// M = 8, S = 4: weak boundary phases 3 and 7, as the bundled chunked model.
PhaseSummary sensitive_summary(uint64_t seed) {
  return summarize(simulate({1.0, 0.98, 0.97, 0.55, 0.99, 0.97, 0.96, 0.5}, 150, seed), 8, 4,
                   {100, 100, 1});
}

PhaseSummary flat_summary(uint64_t seed) {
  return summarize(simulate(std::vector<double>(8, 0.97), 150, seed), 8, 4, {100, 100, 1});
}

// Metadata shaped like a sweep's, with the things that used to overflow the page: long
// unbroken strings, nested objects, long arrays.
nlohmann::json stress_meta() {
  nlohmann::json described = {
      {"kind", "local"},
      {"model_dir", "/very/long/path/" + std::string(180, 'd') + "/kv-chunked"},
      {"config",
       {{"attention", {{"kind", "chunked"}, {"stride", 4}, {"width", 4}, {"n_win", 1}}},
        {"d_model", 128}}}};
  std::vector<double> logprob;
  for (int r = 0; r < 64; ++r) logprob.push_back(-0.001234567 * (r + 1));
  return {{"model_id", "kv-chunked@" + std::string(64, 'f')},
          {"config_hash", std::string(64, 'a')},
          {"backend", described},
          {"sweep", {{"task", {{"kind", "kv"}, {"n_records", 12}}}, {"padding", "prefix"}}},
          {"mean_target_logprob_by_phase", logprob},
          {"records", {{"outcomes", 1200}, {"first_error", std::string(300, 'e')}}},
          {"note", "a long sentence that wraps normally " + std::string(40, 'x') + " and more"}};
}

// What the probe script wrote, or a failure naming what went wrong.
struct Probe {
  nlohmann::json j;
  std::string error;
};

constexpr const char* kHeadProbe = R"(<script>
window.phasekvViolations = [];
document.addEventListener('securitypolicyviolation', function (e) {
  window.phasekvViolations.push(e.violatedDirective + ' ' + e.blockedURI);
});
</script>
<meta http-equiv="Content-Security-Policy"
      content="default-src 'none'; style-src 'unsafe-inline'; script-src 'unsafe-inline'">
)";

constexpr const char* kBodyProbe = R"(<script>
(function () {
  function name(e) {
    return e.tagName.toLowerCase() + (e.id ? '#' + e.id : '') +
           (e.getAttribute('class') ? '.' + e.getAttribute('class').replace(/ /g, '.') : '');
  }
  function run() {
    document.querySelectorAll('details').forEach(function (d) { d.open = true; });
    var de = document.documentElement;
    var width = de.clientWidth;
    var out = {viewport: window.innerWidth, client_width: width,
               scroll_width: Math.max(de.scrollWidth, document.body.scrollWidth),
               overflowing: [], clipped: [], scroll_boxes: [], svgs: [], phase_tables: []};
    var all = document.body.getElementsByTagName('*');
    for (var i = 0; i < all.length; i++) {
      var e = all[i];
      var box = e.parentElement && e.parentElement.closest('div.scroll');
      var svg = e.parentElement && e.parentElement.closest('svg');
      if (box || svg || e.tagName.toLowerCase() === 'script') continue;
      var r = e.getBoundingClientRect();
      if (r.width > 0 && (r.right > width + 0.5 || r.left < -0.5)) {
        out.overflowing.push(name(e) + ' ' + r.left.toFixed(1) + '..' + r.right.toFixed(1));
      }
    }
    document.querySelectorAll('div.scroll').forEach(function (b) {
      out.scroll_boxes.push({client: b.clientWidth, content: b.scrollWidth});
    });
    document.querySelectorAll('svg').forEach(function (s) {
      var sr = s.getBoundingClientRect();
      s.querySelectorAll('text').forEach(function (t) {
        var tr = t.getBoundingClientRect();
        if (tr.left < sr.left - 1 || tr.right > sr.right + 1 || tr.top < sr.top - 1 ||
            tr.bottom > sr.bottom + 1) {
          out.clipped.push(t.textContent);
        }
      });
      var visible = function (sel) {
        var n = 0;
        s.querySelectorAll(sel).forEach(function (p) {
          var pr = p.getBoundingClientRect();
          if (pr.width > 0 && pr.height > 0) n++;
        });
        return n;
      };
      out.svgs.push({left: sr.left, right: sr.right, width: sr.width, height: sr.height,
                     points: visible('circle.point'), errbars: visible('path.errbar')});
    });
    document.querySelectorAll('table.phases').forEach(function (t) {
      var tr = t.getBoundingClientRect();
      out.phase_tables.push({width: tr.width, height: tr.height, rows: t.rows.length,
                             first_header: t.rows[0].cells[0].textContent});
    });
    out.verdicts = [];
    document.querySelectorAll('.verdict').forEach(function (v) {
      var vr = v.getBoundingClientRect();
      out.verdicts.push({text: v.textContent, height: vr.height});
    });
    out.resources = performance.getEntriesByType('resource').map(function (r) { return r.name; });
    out.violations = window.phasekvViolations;
    var pre = document.createElement('pre');
    pre.id = 'phasekv-probe';
    pre.textContent = JSON.stringify(out);
    document.body.appendChild(pre);
  }
  window.addEventListener('load', function () { setTimeout(run, 0); });
})();
</script>
)";

std::string unescape_html(const std::string& text) {
  std::string out;
  for (size_t i = 0; i < text.size();) {
    bool replaced = false;
    for (const auto& [entity, c] : {std::pair<const char*, char>{"&lt;", '<'},
                                    {"&gt;", '>'},
                                    {"&quot;", '"'},
                                    {"&#39;", '\''},
                                    {"&amp;", '&'}}) {
      const std::string e(entity);
      if (text.compare(i, e.size(), e) == 0) {
        out += c;
        i += e.size();
        replaced = true;
        break;
      }
    }
    if (!replaced) out += text[i++];
  }
  return out;
}

// External references a self-contained report must not have. The SVG namespace is a name, not a
// request, and is the only URL allowed.
std::vector<std::string> external_references(std::string html) {
  const std::string xmlns = "xmlns=\"http://www.w3.org/2000/svg\"";
  for (size_t pos; (pos = html.find(xmlns)) != std::string::npos;) html.erase(pos, xmlns.size());
  std::vector<std::string> found;
  for (const char* ref : {"http://", "https://", "ftp://", "file:", "src=", "srcset=", "href=",
                          "url(", "@import", "<link", "<script", "<iframe", "<object", "<embed",
                          "<img", "<image", "<use", "<base", "<meta http-equiv"}) {
    if (html.find(ref) != std::string::npos) found.push_back(ref);
  }
  return found;
}

class ReportBrowser : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!chromium_available()) {
      GTEST_SKIP() << chromium_path()
                   << " not found: install Debian's chromium (bash scripts/install-deps.sh) to "
                      "run the browser checks of report.html and compare.html";
    }
    dir_ = fs::temp_directory_path() /
           fmt::format("phasekv_browser_{}_{}", ::getpid(),
                       ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!dir_.empty() && !HasFailure()) fs::remove_all(dir_);
  }

  // Renders `html` (a report file's content) and returns the probe's measurements.
  Probe render(const std::string& html, const std::string& name) {
    const size_t head = html.find("<head>");
    const size_t body_end = html.rfind("</body>");
    if (head == std::string::npos || body_end == std::string::npos) {
      return {{}, "no <head> or </body> to instrument"};
    }
    std::string probed = html;
    probed.insert(body_end, kBodyProbe);
    probed.insert(head + 6, std::string("\n") + kHeadProbe);
    const fs::path page = dir_ / (name + ".probe.html");
    const fs::path dom = dir_ / (name + ".dom.html");
    const fs::path log = dir_ / (name + ".chromium.log");
    write_file_atomic(page.string(), probed);
    const std::string cmd = fmt::format(
        "timeout 60 {} --headless --no-sandbox --disable-gpu --no-first-run "
        "--no-default-browser-check --disable-extensions --disable-background-networking "
        "--disable-component-update --disable-sync --disable-dev-shm-usage --hide-scrollbars "
        "--host-resolver-rules='MAP * ~NOTFOUND' --user-data-dir={} --window-size={},{} "
        "--virtual-time-budget=3000 --dump-dom {} > {} 2> {}",
        shell_quote(chromium_path()), shell_quote((dir_ / (name + ".profile")).string()),
        kViewportWidth, kViewportHeight, shell_quote("file://" + page.string()),
        shell_quote(dom.string()), shell_quote(log.string()));
    const int status = std::system(cmd.c_str());
    if (status != 0) {
      return {{},
              fmt::format("chromium exited with status {} (log: {})",
                          WIFEXITED(status) ? WEXITSTATUS(status) : -1, log.string())};
    }
    const std::string out = read_file(dom.string());
    const std::string open = "<pre id=\"phasekv-probe\">";
    const size_t start = out.find(open);
    const size_t end = out.find("</pre>", start);
    if (start == std::string::npos || end == std::string::npos) {
      return {{}, "the probe wrote no result into the DOM (see " + dom.string() + ")"};
    }
    const std::string text =
        unescape_html(out.substr(start + open.size(), end - start - open.size()));
    try {
      return {nlohmann::json::parse(text), ""};
    } catch (const nlohmann::json::exception& e) {
      return {{}, std::string("probe output is not JSON: ") + e.what()};
    }
  }

  // The checks shared by both reports.
  void expect_renders_within_viewport(const nlohmann::json& j, size_t series, size_t table_rows) {
    SCOPED_TRACE(j.dump(1));
    EXPECT_EQ(j["viewport"], kViewportWidth);
    EXPECT_LE(j["scroll_width"].get<double>(), j["client_width"].get<double>());
    EXPECT_TRUE(j["overflowing"].empty());
    EXPECT_TRUE(j["clipped"].empty());
    ASSERT_EQ(j["svgs"].size(), 1u);
    const nlohmann::json& svg = j["svgs"][0];
    EXPECT_GT(svg["width"].get<double>(), 400.0);
    EXPECT_GT(svg["height"].get<double>(), 200.0);
    EXPECT_LE(svg["right"].get<double>(), j["client_width"].get<double>());
    EXPECT_EQ(svg["points"], 8 * series);
    EXPECT_EQ(svg["errbars"], 8 * series);
    ASSERT_EQ(j["phase_tables"].size(), 1u);
    const nlohmann::json& table = j["phase_tables"][0];
    EXPECT_EQ(table["rows"], table_rows);
    EXPECT_EQ(table["first_header"], "phase");
    EXPECT_GT(table["width"].get<double>(), 100.0);
    EXPECT_GT(table["height"].get<double>(), 100.0);
    for (const auto& box : j["scroll_boxes"]) {
      EXPECT_LE(box["client"].get<double>(), j["client_width"].get<double>());
    }
    EXPECT_EQ(j["verdicts"].size(), series);
    for (const auto& v : j["verdicts"]) EXPECT_GT(v["height"].get<double>(), 0.0);
    EXPECT_TRUE(j["resources"].empty());
    EXPECT_TRUE(j["violations"].empty());
  }

  fs::path dir_;
};

TEST_F(ReportBrowser, ReportHtml) {
  const fs::path out = dir_ / "sweep";
  write_sweep_outputs(out.string(), "kv-chunked", sensitive_summary(1), stress_meta());
  const std::string html = read_file((out / "report.html").string());
  EXPECT_TRUE(external_references(html).empty())
      << fmt::format("{}", fmt::join(external_references(html), " "));
  const Probe probe = render(html, "report");
  ASSERT_EQ(probe.error, "");
  expect_renders_within_viewport(probe.j, 1, 1 + 8);
  EXPECT_EQ(probe.j["verdicts"][0]["text"].get<std::string>().rfind("phase-sensitive: period 4", 0),
            0u);
}

// An audit over a depth x length grid adds two heatmaps and two tables (html_length_grid): a
// 48-phase row per length and 4 x 3 cells must still fit the viewport, every label inside its SVG.
TEST_F(ReportBrowser, AuditGridReportHtml) {
  nlohmann::json meta = stress_meta();
  meta["lengths"] = nlohmann::json::array();
  meta["cells"] = nlohmann::json::array();
  for (int64_t tokens : {1024, 8192, 65536, 131072}) {
    std::vector<double> acc, n;
    for (int r = 0; r < 48; ++r) acc.push_back(r % 8 == 3 ? 0.125 : 0.9), n.push_back(30);
    meta["lengths"].push_back({{"context_len", tokens}, {"phase_acc", acc}, {"phase_n", n},
                               {"mean_acc", 0.8}, {"worst_phase", 3}, {"worst_acc", 0.125},
                               {"gap_pp", 77.5}});
    for (double depth : {0.0, 50.0, 100.0})
      meta["cells"].push_back({{"context_len", tokens}, {"depth_pct", depth},
                               {"mean_acc", 0.8}, {"worst_phase", 11}, {"worst_acc", 0.1},
                               {"gap_pp", 80.0}, {"detected_period", 8},
                               {"period_p_value", 0.001}});
  }
  const fs::path out = dir_ / "grid";
  write_sweep_outputs(out.string(), "kv-chunked", sensitive_summary(1), meta);
  const std::string html = read_file((out / "report.html").string());
  EXPECT_TRUE(external_references(html).empty());
  const Probe probe = render(html, "grid");
  ASSERT_EQ(probe.error, "");
  const nlohmann::json& j = probe.j;
  SCOPED_TRACE(j.dump(1));
  EXPECT_LE(j["scroll_width"].get<double>(), j["client_width"].get<double>());
  EXPECT_TRUE(j["overflowing"].empty());
  EXPECT_TRUE(j["clipped"].empty());
  ASSERT_EQ(j["svgs"].size(), 3u) << "the phase chart and the two heatmaps";
  for (const auto& svg : j["svgs"]) {
    EXPECT_GT(svg["width"].get<double>(), 400.0);
    EXPECT_LE(svg["right"].get<double>(), j["client_width"].get<double>());
  }
  for (const auto& box : j["scroll_boxes"])
    EXPECT_LE(box["client"].get<double>(), j["client_width"].get<double>());
}

TEST_F(ReportBrowser, CompareHtml) {
  PhaseSeries series;
  for (int i = 0; i < 4; ++i) {
    series.emplace_back(fmt::format("runs/study/{}/kv-{}-seed{}", std::string(30, 'p'),
                                    i % 2 == 0 ? "chunked" : "full", i),
                        i % 2 == 0 ? sensitive_summary(10 + i) : flat_summary(10 + i));
  }
  nlohmann::json meta = nlohmann::json::object();
  for (const auto& [label, s] : series) meta[label] = label;
  const std::string html = report_html(series, "phasekv compare", meta);
  EXPECT_TRUE(external_references(html).empty())
      << fmt::format("{}", fmt::join(external_references(html), " "));
  const Probe probe = render(html, "compare");
  ASSERT_EQ(probe.error, "");
  expect_renders_within_viewport(probe.j, 4, 2 + 8);
}

}  // namespace
}  // namespace phasekv
