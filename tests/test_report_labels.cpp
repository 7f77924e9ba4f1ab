// report.html and compare.html as a reader checks them (issue 46): the worst phase's two
// intervals say which is which, and a perfect control has no red "worst" phase.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "eval/stats.h"
#include "report/report.h"
#include "test_util.h"

namespace phasekv {
namespace {

// M = 8, S = 4, weak at the boundary phases 3 and 7.
PhaseSummary weak_summary() {
  return summarize(test::simulate_outcomes({0.95, 0.95, 0.95, 0.5, 0.95, 0.95, 0.95, 0.5}, 100, 3),
                   8, 4);
}

// Every phase right: a perfect full-attention control.
PhaseSummary perfect_summary() {
  return summarize(test::simulate_outcomes(std::vector<double>(8, 1.0), 100, 4), 8, 4);
}

TEST(ReportHtml, TheWorstPhaseIntervalsSayWhichIsWhich) {
  const std::string html = report_html("weak", weak_summary(), nlohmann::json::object());
  EXPECT_EQ(test::occurrences(html, "<th>worst phase [95% simultaneous CI]</th>"), 1u) << html;
  EXPECT_EQ(test::occurrences(html, "<th>gap (best - worst) [95% simultaneous CI]</th>"), 1u);
  EXPECT_EQ(test::occurrences(html, "<th>95% Wilson CI</th>"), 1u);
  EXPECT_EQ(test::occurrences(html, "95% CI]"), 0u) << "an interval without its kind";
  // The note says why the two intervals of the worst phase differ.
  EXPECT_CONTAINS(html, "worst phase's covers whichever phase is worst");
}

TEST(ReportHtml, APerfectControlHasNoWorstPhase) {
  const PhaseSummary weak = weak_summary(), perfect = perfect_summary();
  ASSERT_EQ(perfect.best_acc, perfect.worst_acc);
  const std::string alone = report_html("control", perfect, nlohmann::json::object());
  EXPECT_EQ(test::occurrences(alone, "class=\"worst\""), 0u);
  EXPECT_EQ(test::occurrences(alone, "<td>worst</td>"), 0u);
  EXPECT_EQ(test::occurrences(alone, "<td>entry boundary, worst</td>"), 0u);
  // Side by side: the weak model's worst phase is red (accuracy and interval cells), the
  // control's phases are not.
  const std::string both = report_html({{"chunked", weak}, {"full", perfect}}, "phasekv compare",
                                       nlohmann::json::object());
  EXPECT_EQ(test::occurrences(both, "class=\"num worst\""), 2u) << both;
  // A weak model keeps its marks.
  const std::string weak_alone = report_html("weak", weak, nlohmann::json::object());
  EXPECT_EQ(test::occurrences(weak_alone, "<tr class=\"worst\">"), 1u);
}

}  // namespace
}  // namespace phasekv
