// The padding probe (probe/probe.h) and the real-valued period test (eval/value_period.h) on a
// fake backend whose preferred continuation depends on where the code starts. Torch-free: also
// built under ASan + UBSan (fuzz/CMakeLists.txt).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "eval/value_period.h"
#include "probe/probe.h"
#include "test_util.h"
#include "util/config_file.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// One character = one token (its byte). After the code, the fake prefers '8' when the code
// starts at a position L with L mod 4 in {2, 3} (periodic) or always (flat, with a small
// L-dependent wobble), and '3' otherwise; after '3' it says '2' with probability 0.9. Every
// other next token has probability 0.01. A '~' does not tokenize.
class FakeBackend : public Backend {
 public:
  FakeBackend(std::string code, bool periodic, int64_t max_context = 4096)
      : code_(std::move(code)), periodic_(periodic), max_context_(max_context) {}
  std::string model_id() const override { return "fake"; }
  std::vector<int32_t> tokenize(const std::string& text) override {
    std::vector<int32_t> ids;
    for (unsigned char c : text) {
      if (c == '~') throw Error("'~' is not in the vocabulary");
      ids.push_back(c);
    }
    return ids;
  }
  std::string detokenize(const std::vector<int32_t>& ids) override {
    std::string s;
    for (int32_t id : ids) s += static_cast<char>(id);
    return s;
  }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    std::vector<ScoreResult> out;
    for (const auto& r : requests) {
      ++requests_;
      const double p8 = prob_8(r.context), p3 = 0.98 - p8;
      auto p = [&](int32_t t) {
        if (!r.context.empty() && r.context.back() == '3') return t == '2' ? 0.9 : 0.1 / 255;
        return t == '8' ? p8 : t == '3' ? p3 : 0.02 / 254;
      };
      ScoreResult s;
      s.target_logprob = std::log(p(r.target));
      const bool after3 = !r.context.empty() && r.context.back() == '3';
      s.argmax = after3 ? '2' : (p8 > p3 ? '8' : '3');
      s.argmax_logprob = std::log(p(s.argmax));
      out.push_back(s);
    }
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>&, int) override { return {}; }
  int64_t max_context() const override { return max_context_; }
  json describe() const override { return {{"backend", "fake"}}; }
  int64_t requests_ = 0;

 private:
  double prob_8(const std::vector<int32_t>& ctx) const {
    const int64_t L = static_cast<int64_t>(ctx.size()) - static_cast<int64_t>(code_.size());
    if (periodic_) return (L % 4 >= 2) ? 0.7 : 0.2;
    return 0.6 + 0.01 * std::sin(1.7 * static_cast<double>(L) * static_cast<double>(L));
  }
  std::string code_;
  bool periodic_;
  int64_t max_context_;
};

json spec_json() {
  return {{"code", "x = T.Cast(FP"},
          {"candidates", {"8", "32"}},
          {"correct", "8"},
          {"lengths", {9, 40}},
          {"family",
           {{{"name", "equals"}, {"head", "\"\"\"\n"}, {"unit", "="}, {"tail", "\n\"\"\"\n"}},
            {{"name", "hashes"}, {"head", "# "}, {"unit", "#"}, {"tail", "\n"}}}}};
}

fs::path fresh_dir(const std::string& name) {
  const fs::path d = fs::temp_directory_path() / ("phasekv-probe-" + name);
  fs::remove_all(d);
  return d;
}

EvalRecord identity_of(const ProbeSpec& s, int l_hi) {
  EvalRecord id;
  id.model = "fake";
  id.task = "probe:" + s.hash();
  id.modulus = l_hi + 1;
  id.padding = "filler";
  return id;
}

json run_probe(FakeBackend& b, const ProbeSpec& s, const fs::path& dir, int retest = 1,
               int stride = 4, RunResult* run_out = nullptr) {
  ProbePlan plan = plan_probe(b, s, s.l_max + retest - 1);
  ProbeMode mode(s, plan, identity_of(s, s.l_max + retest - 1));
  RunOptions ro;
  ro.out_dir = dir.string();
  const RunResult run = run_items(b, mode, ro);
  if (run_out) *run_out = run;
  ProbeSummaryOptions o;
  o.stride = stride;
  o.retest = retest;
  o.permutations = 199;
  return summarize_probe(s, run, o);
}

TEST(Probe, FindsPeriodFourWhenTheAnswerFollowsTheCodesPhase) {
  const ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  FakeBackend b(s.code, true);
  const json sm = run_probe(b, s, fresh_dir("periodic"));
  EXPECT_EQ(sm["period"]["detected"], 4);
  EXPECT_LT(sm["period"]["p_value"].get<double>(), 0.01);
  // 2 families x 32 lengths, every ranking follows the pattern 32, 32, 8, 8 by L mod 4.
  EXPECT_EQ(sm["rankings"]["total"], 64);
  EXPECT_EQ(sm["rankings"]["follow_period"], 64);
  EXPECT_EQ(sm["rankings"]["residue_winner"], json({"32", "32", "8", "8"}));
  EXPECT_FALSE(sm["rankings"]["constant_pattern"].get<bool>());
  EXPECT_EQ(sm["rankings"]["wins"]["8"], 32);
  EXPECT_EQ(sm["rankings"]["top1_correct"], 32);  // the fake's greedy token is '8' where it wins
  // Residue 2: P(8) = 0.7, P(32) = P(3) x P(2 | 3) = 0.28 x 0.9.
  EXPECT_NEAR(sm["by_residue"][2]["mean_margin"].get<double>(), 0.7 - 0.28 * 0.9, 1e-9);
  EXPECT_CONTAINS(probe_verdict(sm), "period 4");
}

TEST(Probe, FindsNoPeriodWhenTheAnswerIgnoresTheFiller) {
  const ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  FakeBackend b(s.code, false);
  const json sm = run_probe(b, s, fresh_dir("flat"));
  EXPECT_GE(sm["period"]["p_value"].get<double>(), 0.05);
  EXPECT_EQ(sm["rankings"]["wins"]["8"], 64);
  EXPECT_TRUE(sm["rankings"]["constant_pattern"].get<bool>());
  EXPECT_CONTAINS(probe_verdict(sm), "no period detected");
}

TEST(Probe, MultiTokenCandidateProbabilityIsTheProductOfItsTokens) {
  const ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  FakeBackend b(s.code, true);
  RunResult run;
  run_probe(b, s, fresh_dir("product"), 1, 4, &run);
  ASSERT_FALSE(run.latest.empty());
  for (const auto& [key, r] : run.latest) {
    ASSERT_TRUE(r.ok()) << r.error;
    const int L = r.phase;
    const double p8 = (L % 4 >= 2) ? 0.7 : 0.2;
    const auto& c = r.extra.at("candidates");
    EXPECT_EQ(c[1]["ids"], json({51, 50}));  // '3', '2'
    EXPECT_NEAR(c[0]["prob"].get<double>(), p8, 1e-12);
    EXPECT_NEAR(c[1]["prob"].get<double>(), (0.98 - p8) * 0.9, 1e-12);
    EXPECT_NEAR(c[1]["logprob"].get<double>(), std::log(0.98 - p8) + std::log(0.9), 1e-12);
    EXPECT_EQ(r.correct, L % 4 >= 2);
    EXPECT_EQ(r.key_pos, L);  // the code starts right after the L filler tokens
  }
}

TEST(Probe, FillerLengthCountsEveryTokenBeforeTheCode) {
  ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  s.l_min = 4;
  FakeBackend b(s.code, true);
  const ProbePlan p = plan_probe(b, s, s.l_max);
  // "\"\"\"\n" + k x "=" + "\n\"\"\"\n": L = 9 + k, so L = 4 ... 8 is unreachable.
  EXPECT_EQ(p.unreachable.at("equals"), std::vector<int>({4, 5, 6, 7, 8}));
  EXPECT_FALSE(p.unreachable.count("hashes"));
  EXPECT_EQ(p.prompts.at("equals").at(9).k, 0);
  EXPECT_EQ(p.prompts.at("equals").at(20).k, 11);
  EXPECT_EQ(p.prompts.at("equals").at(20).filler_ids.size(), 20u);
  EXPECT_EQ(p.prompts.at("hashes").at(4).k, 1);  // "# " + "#" + "\n"
}

TEST(Probe, RetestComparesShiftedAnswers) {
  const ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  FakeBackend periodic(s.code, true), flat(s.code, false);
  const json a = run_probe(periodic, s, fresh_dir("retest-p"), 4);
  const json b = run_probe(flat, s, fresh_dir("retest-f"), 4);
  // Four consecutive lengths cover every residue: the periodic model never agrees with itself,
  // its greedy answers split 2:2 between 8 and 3.
  EXPECT_EQ(a["retest"]["all_agree"], 0);
  EXPECT_NEAR(a["retest"]["mean_agreement"].get<double>(), 0.5, 1e-12);
  EXPECT_EQ(b["retest"]["all_agree"], b["retest"]["items"]);
  EXPECT_GT(b["retest"]["items"].get<int>(), 50);
}

TEST(Probe, RerunResumesAndAChangedSpecIsAnotherRun) {
  ProbeSpec s = probe_spec_from_json(spec_json(), "spec");
  FakeBackend b(s.code, true);
  const fs::path dir = fresh_dir("resume");
  run_probe(b, s, dir);
  const int64_t first = b.requests_;
  RunResult again;
  run_probe(b, s, dir, 1, 4, &again);
  EXPECT_EQ(b.requests_, first);  // nothing rescored
  EXPECT_EQ(again.resumed, again.items);
  s.candidates = {"8", "16"};
  try {
    run_probe(b, s, dir);
    FAIL() << "a changed spec resumed another run's records";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "holds a different run");
  }
}

TEST(Probe, BadInputsGetClearErrors) {
  json j = spec_json();
  j["code"] = "";
  EXPECT_TRUE(test::throws_containing([&] { probe_spec_from_json(j, "p.toml"); },
                                      "p.toml: key 'code' is empty"));
  j = spec_json();
  j["correct"] = "16";
  EXPECT_TRUE(test::throws_containing([&] { probe_spec_from_json(j, "p.toml"); },
                                      "key 'correct' is \"16\""));
  j = spec_json();
  j["candidates"] = {"8"};
  EXPECT_TRUE(test::throws_containing([&] { probe_spec_from_json(j, "p.toml"); }, "at least 2"));
  j = spec_json();
  j["lengths"] = {9, 3};
  EXPECT_TRUE(test::throws_containing([&] { probe_spec_from_json(j, "p.toml"); }, "key 'lengths'"));
  j = spec_json();
  j["family"][0]["colour"] = "red";
  EXPECT_TRUE(
      test::throws_containing([&] { probe_spec_from_json(j, "p.toml"); }, "unknown key 'colour'"));

  j = spec_json();
  j["candidates"] = {"8", "~"};
  ProbeSpec s = probe_spec_from_json(j, "p.toml");
  FakeBackend b(s.code, true);
  EXPECT_TRUE(test::throws_containing([&] { plan_probe(b, s, s.l_max); },
                                      "candidate \"~\" does not tokenize"));

  s = probe_spec_from_json(spec_json(), "p.toml");
  FakeBackend small(s.code, true, 40);
  // 40 filler + 13 code + 2 candidate tokens - 1 = 54 > 40.
  EXPECT_TRUE(test::throws_containing([&] { plan_probe(small, s, s.l_max); },
                                      "the longest probe context is 54 tokens"));
}

// The checked-in specs parse, and no filler holds a literal backslash-n: in TOML, '...' is a literal
// string, so '"""\n' is three quotes, a backslash and an n, not a docstring line (a spec once
// probed such fillers).
TEST(Probe, CheckedInSpecsParseWithRealNewlines) {
  int n = 0;
  for (const auto& e : fs::directory_iterator(fs::path(PHASEKV_SOURCE_DIR) / "configs/probe")) {
    const json j = read_config_file(e.path().string());
    const auto families = filler_families_from_json(j, e.path().string());
    for (const auto& f : families)
      for (const std::string* text : {&f.head, &f.unit, &f.tail})
        EXPECT_EQ(text->find("\\n"), std::string::npos) << e.path() << " family " << f.name;
    if (!j.contains("candidates")) continue;  // a flip-search spec
    EXPECT_NO_THROW(probe_spec_from_json(j, e.path().string())) << e.path();
    ++n;
  }
  EXPECT_GE(n, 3);
}

TEST(ValuePeriod, ExactPeriodicSeriesReportTheSmallestPeriod) {
  ValueSeries a, b;
  for (int L = 0; L < 32; ++L) {
    a.positions.push_back(L);
    a.values.push_back(L % 4 < 2 ? -0.5 : 0.5);
    b.positions.push_back(L + 3);  // another family, another range, same rule
    b.values.push_back((L + 3) % 4 < 2 ? -0.4 : 0.6);
  }
  const ValuePeriodDetection d = detect_value_period({a, b}, 16, 199, 7);
  EXPECT_EQ(d.detected, 4);  // 8, 12 and 16 fit exactly too
  EXPECT_TRUE(std::isinf(d.statistic));
  EXPECT_NEAR(d.p_value, 1.0 / 200, 1e-12);
  EXPECT_EQ(d.to_json()["statistic"], "inf");
}

TEST(ValuePeriod, RejectsMismatchedAndNonFiniteSeries) {
  ValueSeries a{{0, 1, 2}, {0.1, 0.2}};
  EXPECT_THROW(detect_value_period({a}, 4), Error);
  ValueSeries b{{0, 1, 2, 3}, {0.1, NAN, 0.1, 0.2}};
  EXPECT_THROW(detect_value_period({b}, 2), Error);
  ValueSeries c{{0, 1, 2}, {0.1, 0.2, 0.3}};  // 3 positions: no period with two cycles
  EXPECT_EQ(detect_value_period({c}, 4).detected, 0);
}

}  // namespace
}  // namespace phasekv
