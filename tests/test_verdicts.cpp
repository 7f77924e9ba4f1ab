// The verdict withholds its answer when the data cannot carry one: an incomplete run (items that
// failed or were never scored) and a model that does not do the task (no phase above the task's
// shortcut). The report, summary.json and the SLA gate say the same; old summary files load.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "eval/sla_gate.h"
#include "eval/stats.h"
#include "report/report.h"
#include "test_util.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// `examples` examples at each of M = 8 phases, correct with the per-phase rates given.
std::vector<PhaseOutcome> outcomes_at(const std::vector<double>& acc, int examples) {
  std::vector<PhaseOutcome> out;
  for (int e = 0; e < examples; ++e)
    for (size_t r = 0; r < acc.size(); ++r)
      out.push_back({e, static_cast<int>(r), e < acc[r] * examples});
  return out;
}

SummaryOptions quick() {
  SummaryOptions o;
  o.bootstrap_reps = 200;
  o.permutations = 200;
  return o;
}

// A strong planted period 4 (boundary phases at 0.2), 100 examples per phase.
PhaseSummary sensitive() {
  return summarize(outcomes_at({1, 1, 1, 0.2, 1, 1, 1, 0.2}, 100), 8, 4, quick());
}

TEST(Verdicts, ACompleteRunAboveTheShortcutKeepsItsVerdict) {
  PhaseSummary s = sensitive();
  s.planned_outcomes = 800;
  s.shortcut = 0.25;
  EXPECT_TRUE(s.complete());
  EXPECT_FALSE(s.at_or_below_shortcut());
  EXPECT_EQ(phase_verdict(s).kind, VerdictKind::kPhaseSensitive);
}

TEST(Verdicts, AnIncompleteRunGetsNoVerdictAndFailsTheGate) {
  // The planted effect is there, but a quarter of the items are missing: no verdict either way.
  PhaseSummary s = sensitive();
  s.planned_outcomes = 2400;
  EXPECT_FALSE(s.complete());
  const Verdict v = phase_verdict(s);
  EXPECT_EQ(v.kind, VerdictKind::kIncomplete);
  EXPECT_EQ(v.text().rfind("no verdict, incomplete: 800 of 2400 outcomes (1600 items", 0), 0u)
      << v.text();
  EXPECT_NOT_CONTAINS(v.text(), "phase-sensitive");
  SlaGate gate;
  gate.max_gap_pp = 100.0;  // passes any complete run
  const SlaVerdict g = evaluate_sla(gate, s);
  EXPECT_FALSE(g.passed);
  EXPECT_CONTAINS(g.line, "incomplete, 800 of 2400 outcomes");
  const std::string html = report_html("m", s, nlohmann::json::object());
  EXPECT_CONTAINS(html, "800 of 2400 outcomes");
  EXPECT_CONTAINS(html, "verdict incomplete");
}

TEST(Verdicts, AModelAtOrBelowTheShortcutIsUninformativeNotFlat) {
  // Accuracy 0.000 at every phase: the permutation test finds no period, which used to read as
  // a green "no periodic weak spot detected".
  PhaseSummary zero = summarize(outcomes_at(std::vector<double>(8, 0.0), 100), 8, 4, quick());
  zero.shortcut = 0.25;
  zero.planned_outcomes = 800;
  EXPECT_TRUE(zero.at_or_below_shortcut());
  const Verdict v = phase_verdict(zero);
  EXPECT_EQ(v.kind, VerdictKind::kUninformative);
  EXPECT_EQ(v.text().rfind("uninformative: accuracy at or below the shortcut 0.250", 0), 0u)
      << v.text();
  SlaGate gate;
  gate.max_gap_pp = 5.0;
  gate.min_worst_acc = 0.0;
  EXPECT_FALSE(evaluate_sla(gate, zero).passed) << evaluate_sla(gate, zero).line;
  EXPECT_CONTAINS(evaluate_sla(gate, zero).line, "uninformative");
  // Noise around the shortcut (0.23-0.30, 100 examples): no phase's interval clears it.
  PhaseSummary chance =
      summarize(outcomes_at({0.25, 0.3, 0.23, 0.27, 0.25, 0.28, 0.24, 0.26}, 100), 8, 4, quick());
  chance.shortcut = 0.25;
  EXPECT_EQ(phase_verdict(chance).kind, VerdictKind::kUninformative);
  // One phase clearly above it (0.6, interval about [0.50, 0.69]) is evidence of reading keys.
  PhaseSummary one =
      summarize(outcomes_at({0.25, 0.6, 0.23, 0.27, 0.25, 0.28, 0.24, 0.26}, 100), 8, 4, quick());
  one.shortcut = 0.25;
  EXPECT_NE(phase_verdict(one).kind, VerdictKind::kUninformative);
  // Without a known shortcut nothing is judged uninformative.
  PhaseSummary unknown = summarize(outcomes_at(std::vector<double>(8, 0.0), 100), 8, 4, quick());
  EXPECT_NE(phase_verdict(unknown).kind, VerdictKind::kUninformative);
}

TEST(Verdicts, SummaryJsonCarriesCompletenessAndShortcutAndOldFilesLoad) {
  PhaseSummary s = sensitive();
  s.planned_outcomes = 2400;
  s.shortcut = 0.125;
  nlohmann::json j = s.to_json();
  EXPECT_EQ(j["planned_outcomes"], 2400);
  EXPECT_EQ(j["complete"], false);
  EXPECT_EQ(j["shortcut_ceiling"], 0.125);
  EXPECT_EQ(j["at_or_below_shortcut"], false);
  const PhaseSummary back = PhaseSummary::from_json(j);
  EXPECT_EQ(back.planned_outcomes, 2400);
  ASSERT_TRUE(back.shortcut.has_value());
  EXPECT_EQ(*back.shortcut, 0.125);
  EXPECT_EQ(phase_verdict(back).kind, VerdictKind::kIncomplete);
  for (const char* key :
       {"planned_outcomes", "complete", "shortcut_ceiling", "at_or_below_shortcut"})
    j.erase(key);
  const PhaseSummary old = PhaseSummary::from_json(j);  // a summary.json from before these keys
  EXPECT_TRUE(old.complete());
  EXPECT_FALSE(old.shortcut.has_value());
  EXPECT_EQ(phase_verdict(old).kind, VerdictKind::kPhaseSensitive);
}

// `init --out` over a trained model would leave its task.json and tokenizer.json beside new
// weights (a later sweep scores 0.000 without a word): refused, as `train` is, unless --force.
TEST(Verdicts, InitRefusesToWriteOverAModelWithoutForce) {
  const fs::path dir = test::temp_dir("init_over");
  const std::string bin = PHASEKV_BINARY;
  const std::string config = std::string(PHASEKV_SOURCE_DIR) + "/configs/tiny-chunked.json";
  const std::string init = bin + " init --config " + config + " --out " + dir.string();
  const std::string log = (dir.parent_path() / (dir.filename().string() + ".log")).string();
  test::write_text(dir / "task.json", "{}");
  test::write_text(dir / "tokenizer.json", "{}");
  EXPECT_NE(std::system((init + " > " + log + " 2>&1").c_str()), 0);
  const std::string msg = read_file(log);
  EXPECT_CONTAINS(msg, "already holds a model (task.json, tokenizer.json)");
  EXPECT_CONTAINS(msg, "--force");
  EXPECT_FALSE(fs::exists(dir / "model.safetensors"));
  ASSERT_EQ(std::system((init + " --force > " + log + " 2>&1").c_str()), 0) << read_file(log);
  EXPECT_TRUE(fs::exists(dir / "model.safetensors"));
  EXPECT_FALSE(fs::exists(dir / "task.json")) << "--force clears the old model's files";
  EXPECT_FALSE(fs::exists(dir / "tokenizer.json"));
  fs::remove_all(dir);
  fs::remove(log);
}

}  // namespace
}  // namespace phasekv
