// The bundled models (models/, trained by scripts/train-bundled.sh from configs/train/) must show
// what the README's first command promises, here on a smaller sweep through the real CLI:
//  - the lookup pair (the study's geometry): interior-phase weak spots with period 8 in the
//    chunked model, retrieval at every phase in the control;
//  - the chunked model (S = 4) has a weak spot whose gap CI excludes 0, with detected period 4;
//  - the full-attention control retrieves (mean > shortcut + 0.5) and shows no significant period;
//  - `phasekv serve` + a blind `phasekv audit` (no stride given) find period 4 and predict exactly
//    what the in-process sweep predicts for the same examples.
// If these fail after retraining, the models or the method are wrong: do not tune the statistics.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <regex>
#include <sstream>
#include <thread>
#include <tuple>

#include "test_util.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using test::slurp;

const std::string kBin = PHASEKV_BINARY;

std::string model(const std::string& name) {
  return std::string(PHASEKV_SOURCE_DIR) + "/models/" + name;
}

fs::path fresh_dir(const std::string& name) { return test::temp_dir("bundled_" + name); }

// Runs `phasekv sweep` (prefix padding) and returns summary.json.
json sweep(const std::string& name, const fs::path& out, int examples,
           const std::string& task = "kv", int modulus = 8) {
  const std::string cmd = kBin + " sweep --model " + model(name) + " --task " + task +
                          " --modulus " + std::to_string(modulus) +
                          " --padding prefix --threads 2 --examples " + std::to_string(examples) +
                          " --out " + out.string() + " > " + (out.string() + ".log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd << "\n" << slurp(out.string() + ".log");
  return json::parse(slurp(out / "summary.json"));
}

// (example, phase) -> prediction, from a results.jsonl.
std::map<std::pair<int64_t, int>, int> predictions(const fs::path& results) {
  std::map<std::pair<int64_t, int>, int> out;
  std::ifstream in(results);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const json r = json::parse(line);
    out[{r["example_id"].get<int64_t>(), r["phase"].get<int>()}] =
        r["prediction"].is_null() ? -1 : r["prediction"].get<int>();
  }
  return out;
}

TEST(Bundled, ChunkedModelHasAPeriod4WeakSpot) {
  const fs::path dir = fresh_dir("chunked");
  const json s = sweep("kv-chunked", dir / "sweep", 150);
  EXPECT_GT(s["gap_ci_pp"][0].get<double>(), 0.0) << s["gap_ci_pp"];
  EXPECT_EQ(s["period"]["detected"].get<int>(), 4);
  EXPECT_LT(s["period"]["p_value"].get<double>(), 0.01);
  // The worst phase is a boundary phase (key at r mod 4 = 3: its value opens the next entry).
  EXPECT_EQ(s["worst_phase"].get<int>() % 4, 3);
  // Clearly above the no-retrieval shortcut, not saturated.
  const double mean = s["mean_acc"].get<double>();
  EXPECT_GT(mean, s["meta"]["shortcut_ceiling"].get<double>() + 0.2);
  EXPECT_LT(mean, 0.95);
  fs::remove_all(dir);
}

// The control must retrieve (well above the no-retrieval shortcut, 1/3) and be flat: otherwise the
// comparison with the chunked model means nothing. One sweep checks both.
TEST(Bundled, FullAttentionControlRetrievesAndHasNoSignificantPeriod) {
  const fs::path dir = fresh_dir("full");
  const json s = sweep("kv-full", dir / "sweep", 150);
  EXPECT_GT(s["mean_acc"].get<double>(), s["meta"]["shortcut_ceiling"].get<double>() + 0.5);
  EXPECT_GE(s["period"]["p_value"].get<double>(), 0.05);
  fs::remove_all(dir);
}

// The study's geometry (models/lookup-*: every record beyond a 16-token raw window, W8/S8): the
// chunked model's weak spots are interior phases, with period 8; the control retrieves at every
// phase. M = 16: the smallest modulus in which a period of 8 repeats, so the test can tell it from 4.
TEST(Bundled, LookupChunkedModelHasInteriorWeakSpotsWithPeriod8) {
  const fs::path dir = fresh_dir("lookup_chunked");
  const json s = sweep("lookup-chunked", dir / "sweep", 60, "lookup", 16);
  EXPECT_EQ(s["period"]["detected"].get<int>(), 8);
  EXPECT_LT(s["period"]["p_value"].get<double>(), 0.01);
  // Interior phases 0..6 differ by far more than noise: the study's interior-phase finding.
  EXPECT_GT(s["interior"]["gap_ci_pp"][0].get<double>(), 50.0) << s["interior"];
  EXPECT_NE(s["interior"]["worst_phase"].get<int>() % 8, 7);
  EXPECT_EQ(s["stride"].get<int>(), 8);
  EXPECT_GT(s["mean_acc"].get<double>(), s["meta"]["shortcut_ceiling"].get<double>());
  fs::remove_all(dir);
}

// The bundled DeepSeek-V4 (models/v4-lookup: CSA ratio 4 and HCA 128, docs/DEEPSEEK-V4.md) has no
// single stride, so its sweep searches the period blind: it must find 4, the CSA ratio, with a gap
// far beyond noise (200 examples at M = 24 measured 74 pp, 95 % CI [63.5, 84.7]). M = 8: the
// smallest modulus in which a period of 4 repeats.
TEST(Bundled, V4LookupModelHasPeriodOfItsCsaRatio) {
  const fs::path dir = fresh_dir("v4_lookup");
  const json s = sweep("v4-lookup", dir / "sweep", 40, "lookup", 8);
  EXPECT_TRUE(s["stride"].is_null()) << s["stride"];
  EXPECT_EQ(s["period"]["detected"].get<int>(), 4) << s["period"];
  EXPECT_LT(s["period"]["p_value"].get<double>(), 0.01);
  EXPECT_GT(s["gap_ci_pp"][0].get<double>(), 40.0) << s["gap_ci_pp"];
  EXPECT_GT(s["mean_acc"].get<double>(), s["meta"]["shortcut_ceiling"].get<double>());
  fs::remove_all(dir);
}

TEST(Bundled, LookupFullAttentionControlRetrievesAtEveryPhase) {
  const fs::path dir = fresh_dir("lookup_full");
  const json s = sweep("lookup-full", dir / "sweep", 60, "lookup", 16);
  EXPECT_GT(s["mean_acc"].get<double>(), 0.9);
  EXPECT_LT(s["gap_pp"].get<double>(), 10.0);
  fs::remove_all(dir);
}

// `phasekv sweep ... GATE` (prefix padding): the exit status and the last line printed.
std::pair<int, std::string> gated_sweep(const std::string& name, const fs::path& out,
                                        const std::string& task, int examples, int modulus,
                                        const std::string& gate, int bootstrap_reps = 200) {
  const std::string log = out.string() + ".log";
  const std::string cmd = kBin + " sweep --model " + model(name) + " --task " + task +
                          " --modulus " + std::to_string(modulus) +
                          " --padding prefix --threads 2 --bootstrap-reps " +
                          std::to_string(bootstrap_reps) + " --examples " +
                          std::to_string(examples) + " --out " + out.string() + " " + gate +
                          " > " + log + " 2>&1";
  const int st = std::system(cmd.c_str());
  std::string last, line;
  std::istringstream in(slurp(log));
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return {WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st), last};
}

// The worst-phase SLA gate on the issue's own pair: the chunked model's mean hides interior phases
// near 0, so a gate of 25 pp / 0.75 blocks it (exit 4, after its reports are written); the control
// passes the same gate (exit 0). 30 examples at 8 phases bound a perfect control's gap by about
// 17 pp and its worst phase by 0.80 (simultaneous intervals): a 3 pp gate needs ~200 examples.
TEST(Bundled, SlaGateBlocksTheLookupChunkedModelAndPassesItsControl) {
  const fs::path dir = fresh_dir("sla_lookup");
  const std::string gate = "--max-gap 25 --min-worst 0.75";
  const auto [chunked, chunked_line] =
      gated_sweep("lookup-chunked", dir / "chunked", "lookup", 30, 8, gate);
  EXPECT_EQ(chunked, 4) << chunked_line;
  EXPECT_EQ(chunked_line.rfind("SLA FAILED: gap ", 0), 0u) << chunked_line;
  EXPECT_CONTAINS(chunked_line, "> --max-gap 25; worst phase r=");
  EXPECT_TRUE(fs::exists(dir / "chunked" / "report.html"));
  const auto [full, full_line] = gated_sweep("lookup-full", dir / "full", "lookup", 30, 8, gate);
  EXPECT_EQ(full, 0) << full_line;
  EXPECT_EQ(full_line.rfind("SLA passed: gap ", 0), 0u) << full_line;
  fs::remove_all(dir);
}

// The gate compares the conservative end of each 95 % interval: a limit between the point
// estimate and that end fails. kv-chunked's boundary phase (about 0.5) leaves room on both sides.
// Reruns resume, so every verdict judges the same summary; bad limits fail first (exit 2).
TEST(Bundled, SlaGateJudgesTheConfidenceBoundNotThePointEstimate) {
  const fs::path dir = fresh_dir("sla_bound");
  const fs::path out = dir / "sweep";
  auto run = [&](const std::string& gate) {
    return gated_sweep("kv-chunked", out, "kv", 40, 4, gate);
  };
  ASSERT_EQ(run("").first, 0);
  const json s = json::parse(slurp(out / "summary.json"));
  const double gap = s["gap_pp"], gap_hi = s["gap_ci_pp"][1];
  const double worst = s["worst_acc"], worst_lo = s["worst_acc_ci"][0];
  ASSERT_LT(gap, gap_hi) << s["gap_ci_pp"];
  ASSERT_GT(worst, worst_lo) << s["worst_acc_ci"];
  auto num = [](double v) { return std::to_string(v); };  // 6 decimals
  const auto gap_fails = run("--max-gap " + num((gap + gap_hi) / 2));
  EXPECT_EQ(gap_fails.first, 4) << gap_fails.second;
  EXPECT_CONTAINS(gap_fails.second, "SLA FAILED: gap ");
  EXPECT_EQ(run("--min-worst " + num((worst + worst_lo) / 2)).first, 4);
  const auto passes =
      run("--max-gap " + num(gap_hi + 0.01) + " --min-worst " + num(worst_lo - 0.001));
  EXPECT_EQ(passes.first, 0) << passes.second;
  EXPECT_EQ(passes.second.rfind("SLA passed: gap ", 0), 0u) << passes.second;

  const fs::path fresh = dir / "fresh";
  auto bad = [&](const std::string& gate, int reps = 200) {
    return gated_sweep("kv-chunked", fresh, "kv", 40, 4, gate, reps);
  };
  const auto too_wide = bad("--max-gap 150");
  EXPECT_EQ(too_wide.first, 2);
  EXPECT_CONTAINS(too_wide.second, "--max-gap is 150 (allowed: percentage points in [0, 100]");
  const auto percent = bad("--min-worst 95");
  EXPECT_EQ(percent.first, 2);
  EXPECT_CONTAINS(percent.second, "--min-worst is 95 (allowed: an accuracy as a fraction");
  EXPECT_FALSE(fs::exists(fresh / "results.jsonl"));
  // The gate's intervals need no bootstrap: --bootstrap-reps 0 still gates.
  EXPECT_EQ(bad("--max-gap 1", 0).first, 4);
  fs::remove_all(dir);
}

TEST(Bundled, BlindAuditOfTheServedChunkedModelFindsPeriod4AndMatchesTheSweep) {
  const fs::path dir = fresh_dir("audit");
  const int examples = 60;
  sweep("kv-chunked", dir / "sweep", examples);

  test::ServeProcess server(kBin, model("kv-chunked"), dir / "serve.log");
  ASSERT_FALSE(server.endpoint().empty()) << server.log();
  // The served name, as `phasekv serve` prints it (and GET /v1/models lists it).
  const std::string name = server.name();
  ASSERT_FALSE(name.empty()) << server.log();
  const std::string cmd = kBin + " audit --endpoint " + server.endpoint() + " --model '" + name +
                          "' --modulus 8 --examples " + std::to_string(examples) +
                          " --concurrency 8 --out " + (dir / "audit").string() + " > " +
                          (dir / "audit.log").string() + " 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << slurp(dir / "audit.log");
  EXPECT_EQ(server.stop(), 0) << "phasekv serve did not stop cleanly on SIGTERM\n"
                              << slurp(dir / "serve.log");

  const json audit = json::parse(slurp(dir / "audit" / "audit.json"));
  EXPECT_TRUE(audit["stride_given"].is_null());
  EXPECT_EQ(audit["period"]["detected_period"].get<int>(), 4) << audit["period"];
  EXPECT_LT(audit["period"]["p_value"].get<double>(), 0.01);
  EXPECT_EQ(audit["records"]["errors"].get<int>(), 0);

  const auto local = predictions(dir / "sweep" / "results.jsonl");
  const auto served = predictions(dir / "audit" / "results.jsonl");
  ASSERT_EQ(local.size(), static_cast<size_t>(examples * 8));
  EXPECT_EQ(served, local);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv

namespace phasekv {
namespace {

// `phasekv probe` with the shipped lookup spec (configs/probe/lookup.toml): the same prompt
// behind 1 to 64 tokens of prefix padding, four filler families. The chunked model's margin
// P(v17) - P(v3) has period 8 (its stride); the full-attention control answers right at every L.
json probe(const std::string& name, const fs::path& out,
           const std::string& spec = "lookup.toml", const std::string& flags = "--stride 8 --retest 8") {
  const std::string cmd = kBin + " probe --spec " + std::string(PHASEKV_SOURCE_DIR) +
                          "/configs/probe/" + spec + " --model " + model(name) + " --threads 2 " +
                          flags + " --permutations 199 --out " + out.string() + " > " +
                          (out.string() + ".log") + " 2>&1";
  if (std::system(cmd.c_str()) != 0) ADD_FAILURE() << cmd << "\n" << slurp(out.string() + ".log");
  return json::parse(slurp(out / "probe.json"));
}

TEST(Bundled, ProbeFindsTheStrideInTheChunkedModelOnly) {
  const fs::path dir = fresh_dir("probe_chunked");
  const json c = probe("lookup-chunked", dir);
  EXPECT_EQ(c["period"]["detected"], 8);
  EXPECT_LT(c["period"]["p_value"].get<double>(), 0.01);
  EXPECT_EQ(c["rankings"]["total"], 256);
  EXPECT_LT(c["rankings"]["top1_correct"].get<int>(), 200);  // wrong at some phases
  // Re-asking at 8 consecutive lengths never agrees: every window holds a weak phase.
  EXPECT_EQ(c["retest"]["all_agree"], 0);
  EXPECT_GT(c["retest"]["majority_correct"].get<int>(), c["retest"]["single_correct"].get<int>());
  for (const char* f : {"probe.svg", "probe-f0.svg", "probe-f7.svg", "results.jsonl"})
    EXPECT_TRUE(fs::exists(dir / f)) << f;

  const json full = probe("lookup-full", fresh_dir("probe_full"));
  EXPECT_GE(full["period"]["p_value"].get<double>(), 0.05);
  EXPECT_EQ(full["rankings"]["top1_correct"], 256);
  EXPECT_EQ(full["retest"]["all_agree"], full["retest"]["items"]);
}

// The code pair (docs/PROBE.md): at a site of held-out code that the flip search found
// (configs/probe/code-abstractmethod.json: `    @` in numbers.py, next word `abstractmethod`), the
// compressed model writes `abstractmethod` at half the filler lengths and `property` at the
// others, with period 4; the control writes `abstractmethod` at every length.
TEST(Bundled, CodeModelsAnswerAHeldOutSiteByPhaseInTheCompressedModelOnly) {
  const json c = probe("code-chunked", fresh_dir("code_chunked"), "code-abstractmethod.json",
                       "--stride 4");
  EXPECT_EQ(c["period"]["detected"], 4);
  EXPECT_LT(c["period"]["p_value"].get<double>(), 0.01);
  EXPECT_EQ(c["rankings"]["total"], 32);
  EXPECT_FALSE(c["rankings"]["constant_pattern"].get<bool>());
  EXPECT_GE(c["rankings"]["follow_period"].get<int>(), 30);
  const int right = c["rankings"]["top1_correct"].get<int>();
  EXPECT_GT(right, 4);
  EXPECT_LT(right, 28);
  const json f = probe("code-full", fresh_dir("code_full"), "code-abstractmethod.json", "--stride 4");
  EXPECT_GE(f["period"]["p_value"].get<double>(), 0.05);
  EXPECT_EQ(f["rankings"]["top1_correct"], 32);
}

// The flip search on a sample of its sites (the first 32 of configs/probe/flips.toml's draw, one
// family): periodic flips at the stride in the compressed model, none in the control. Needs the
// Python standard library the corpus manifest pins; skipped, saying so, when it is not installed
// as pinned.
TEST(Bundled, FlipSearchFindsPeriodicSitesInTheCompressedModelOnly) {
  const fs::path dir = fresh_dir("flips");
  const json spec = {{"manifest", std::string(PHASEKV_SOURCE_DIR) + "/data/corpus/python-stdlib.json"},
                     {"sites", 32}, {"context_chars", 400}, {"lengths", {16, 47}}, {"seed", 0},
                     {"family", {{{"name", "zeros"}, {"head", "# "}, {"unit", "0"}, {"tail", "\n"}}}}};
  std::ofstream(dir / "flips.json") << spec.dump();
  std::map<std::string, json> rates;
  for (const std::string m : {"code-chunked", "code-full"}) {
    const fs::path out = dir / m;
    const std::string cmd = kBin + " flips --spec " + (dir / "flips.json").string() + " --model " +
                            model(m) + " --stride 4 --threads 2 --out " + out.string() + " > " +
                            out.string() + ".log 2>&1";
    if (std::system(cmd.c_str()) != 0) {
      const std::string log = slurp(out.string() + ".log");
      if (log.find("another package version") != std::string::npos)
        GTEST_SKIP() << "the corpus files differ from data/corpus/python-stdlib.json: " << log;
      FAIL() << cmd << "\n" << log;
    }
    rates[m] = json::parse(slurp(out / "flips.json"))["rates"];
  }
  EXPECT_GE(rates["code-chunked"]["periodic_at_stride"]["k"].get<int>(), 3) << rates["code-chunked"];
  EXPECT_EQ(rates["code-full"]["periodic_at_stride"]["k"], 0) << rates["code-full"];
  EXPECT_EQ(rates["code-chunked"]["periodic_at_control"]["k"], 0);
}

}  // namespace
}  // namespace phasekv
