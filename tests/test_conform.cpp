// Engine conformance (eval/conform.h): a sweep through the model in process against the same
// sweep through an "engine". The same backend conforms exactly; a fake engine with a port bug at
// one phase is flagged at that phase and nowhere else; engine-wide noise is not phase-dependent.
#include <gtest/gtest.h>

#include <filesystem>
#include <limits>
#include <map>
#include <set>

#include "backend/local_backend.h"
#include "eval/conform.h"
#include "eval/sweep.h"
#include "io/tokenizer.h"
#include "model/model_dir.h"
#include "test_util.h"
#include "util/fs.h"
#include "util/hash.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// A backend that forwards to `inner` and, for the contexts of one phase (found by their ids, as an
// engine bug tied to the block boundary would find them), moves the target log-probability by
// `bug` and every other context's by `noise`.
class FakeEngine : public Backend {
 public:
  // jitter: each context's noise is `noise` times a fraction in [0, 1) fixed by its ids (a null
  // engine whose deviations differ from item to item, as rounding noise does).
  // bad_example >= 0: the bug hits that example's context at bad_phase only (one item, as a
  // flipped top-k selection would).
  FakeEngine(Backend& inner, const SweepOptions& o, int bad_phase, double bug, double noise,
             bool jitter = false, int64_t bad_example = -1)
      : inner_(inner), bug_(bug), noise_(noise), jitter_(jitter) {
    for (int64_t e = 0; e < o.examples; ++e)
      for (int r = 0; r < o.modulus; ++r) {
        const TaskExample ex =
            materialize(make_logical_example(o.task, o.seed, e), o.modulus, r, o.padding, false);
        if (r == bad_phase && (bad_example < 0 || e == bad_example)) bad_.insert(key(ex.tokens));
      }
  }
  std::string model_id() const override { return inner_.model_id(); }
  std::vector<int32_t> tokenize(const std::string& t) override { return inner_.tokenize(t); }
  std::string detokenize(const std::vector<int32_t>& ids) override {
    return inner_.detokenize(ids);
  }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    std::vector<ScoreResult> out = inner_.score(requests);
    for (size_t i = 0; i < out.size(); ++i)
      out[i].target_logprob += bad_.count(key(requests[i].context)) ? bug_ : noise(requests[i]);
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>& c, int n) override {
    return inner_.generate(c, n);
  }
  int64_t max_context() const override { return inner_.max_context(); }
  int model_stride() const override { return inner_.model_stride(); }
  nlohmann::json describe() const override { return inner_.describe(); }

 private:
  static std::string key(const std::vector<int32_t>& ids) {
    return std::string(reinterpret_cast<const char*>(ids.data()), ids.size() * sizeof(int32_t));
  }
  double noise(const ScoreRequest& r) const {
    if (!jitter_) return noise_;
    return noise_ * static_cast<double>(fnv1a64(key(r.context)) % 1000) / 1000.0;
  }
  Backend& inner_;
  std::set<std::string> bad_;
  double bug_, noise_;
  bool jitter_;
};

class ConformTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = test::temp_dir("conform");
    model_dir_ = (root_ / "tiny").string();
    Decoder model = test::make_model(test::small_kv_model_config(40), 5);
    save_model_dir(model_dir_, model);
    save_task_files(model_dir_, test::small_kv_task());
  }
  SweepOptions options(const std::string& out) {
    SweepOptions o;
    o.task = test::small_kv_task();
    o.examples = 6;
    o.modulus = 8;
    o.seed = 3;
    o.out_dir = (root_ / out).string();
    o.batch = 8;
    o.stats.bootstrap_reps = 0;
    o.stats.permutations = 50;
    return o;
  }
  fs::path root_;
  std::string model_dir_;
};

TEST_F(ConformTest, SameModelConformsAPortBugIsFlaggedAtItsPhase) {
  LocalBackend local = LocalBackend::from_dir(model_dir_, 1, 8);
  const SweepOptions ref_o = options("reference");
  const SweepResult ref = run_sweep(local, ref_o);

  const SweepResult same = run_sweep(local, options("same"));
  const ConformSummary ok = conform_summary(ref.run, same.run, "same", 8);
  EXPECT_EQ(ok.max_dlogprob, 0.0);
  EXPECT_EQ(ok.items, 48);
  EXPECT_TRUE(ok.flagged.empty());
  EXPECT_EQ(ok.verdict.rfind("conforms within", 0), 0u) << ok.verdict;

  const SweepOptions bug_o = options("bug");
  FakeEngine buggy(local, bug_o, /*bad_phase=*/3, /*bug=*/-0.4, /*noise=*/2e-6);
  const ConformSummary bug = conform_summary(ref.run, run_sweep(buggy, bug_o).run, "ub7", 8);
  EXPECT_EQ(bug.flagged, std::vector<int>({3}));
  EXPECT_NEAR(bug.phases[3].max_dlogprob, 0.4, 1e-9);
  EXPECT_NEAR(bug.phases[0].max_dlogprob, 2e-6, 1e-9);
  EXPECT_EQ(bug.verdict.rfind("phase-dependent deviation at r = 3 ", 0), 0u) << bug.verdict;
  EXPECT_EQ(bug.to_json()["flagged_phases"], nlohmann::json({3}));
  EXPECT_TRUE(bug.jumps.empty());
  EXPECT_EQ(bug.phases[3].beyond_tolerance, 6);

  // The same deviation at one item of that phase only (a selection flipped by noise) is a jump,
  // not a phase-dependent deviation.
  const SweepOptions one_o = options("one");
  FakeEngine one_item(local, one_o, 3, -0.4, 2e-6, /*jitter=*/true, /*bad_example=*/4);
  const ConformSummary one = conform_summary(ref.run, run_sweep(one_item, one_o).run, "fa-on", 8);
  EXPECT_TRUE(one.flagged.empty()) << one.verdict;
  ASSERT_EQ(one.jumps.size(), 1u);
  EXPECT_EQ(one.jumps[0].example, 4);
  EXPECT_EQ(one.jumps[0].r, 3);
  EXPECT_NEAR(one.jumps[0].dlogprob, 0.4, 1e-6);
  EXPECT_EQ(one.verdict.rfind("deviates at every phase", 0), 0u) << one.verdict;
  EXPECT_CONTAINS(one.verdict, "1 isolated jump at example 4 r = 3 (0.4)");

  const SweepOptions noisy_o = options("noisy");
  FakeEngine noisy(local, noisy_o, -1, 0.0, 0.05);  // the same deviation at every phase
  const ConformSummary n = conform_summary(ref.run, run_sweep(noisy, noisy_o).run, "fa-on", 8);
  EXPECT_TRUE(n.flagged.empty());
  EXPECT_EQ(n.verdict.rfind("deviates at every phase", 0), 0u) << n.verdict;

  // A null engine whose deviation differs from item to item is not called phase-dependent either.
  const SweepOptions jitter_o = options("jitter");
  FakeEngine jittery(local, jitter_o, -1, 0.0, 0.05, /*jitter=*/true);
  const ConformSummary j = conform_summary(ref.run, run_sweep(jittery, jitter_o).run, "ub5", 8);
  EXPECT_TRUE(j.flagged.empty()) << j.verdict;
  EXPECT_TRUE(j.jumps.empty()) << j.verdict;
  EXPECT_GT(j.max_dlogprob, 0.01);
  EXPECT_LT(j.max_dlogprob, 0.05);
}

// An engine run that scored only part of the items (a server that died, errors) gets no whole
// verdict: the missing items are counted and the verdict says "incomplete".
TEST_F(ConformTest, AnEngineRunWithMissingItemsIsIncompleteNotConforming) {
  LocalBackend local = LocalBackend::from_dir(model_dir_, 1, 8);
  const SweepResult ref = run_sweep(local, options("reference"));
  SweepOptions part = options("part");
  part.examples = 4;  // examples 4 and 5 never reach the engine
  const ConformSummary s = conform_summary(ref.run, run_sweep(local, part).run, "dead", 8);
  EXPECT_EQ(s.items, 32);
  EXPECT_EQ(s.missing, 16);
  EXPECT_EQ(s.max_dlogprob, 0.0);
  EXPECT_EQ(s.verdict.rfind("incomplete: 16 of 48 items missing", 0), 0u) << s.verdict;
}

// An engine that cannot give the target's log-probability at one phase (outside its top-n):
// those items are censored, not missing; their greedy answers still count, and the verdict on
// the rest says how many were censored.
TEST_F(ConformTest, CensoredTargetsAreCountedApartFromTheDeviation) {
  LocalBackend local = LocalBackend::from_dir(model_dir_, 1, 8);
  const SweepResult ref = run_sweep(local, options("reference"));
  const SweepOptions o = options("censoring");
  FakeEngine censoring(local, o, /*bad_phase=*/3, std::numeric_limits<double>::quiet_NaN(), 0.0);
  const ConformSummary s = conform_summary(ref.run, run_sweep(censoring, o).run, "top20", 8);
  EXPECT_EQ(s.items, 48);
  EXPECT_EQ(s.censored, 6);
  EXPECT_EQ(s.missing, 0);
  EXPECT_EQ(s.phases[3].n, 6);
  EXPECT_EQ(s.phases[3].scored, 0);
  EXPECT_TRUE(s.flagged.empty());
  EXPECT_EQ(s.verdict.rfind("conforms within 1.0e-03 (max |dlogprob| 0.0e+00 over 42 items); 6 "
                            "items censored",
                            0),
            0u)
      << s.verdict;
}

// The command through the binary against `phasekv serve` of the same model: one request at a
// time and three in flight both conform; the two conditions are reported side by side in
// OUT/conform.json and OUT/conform.csv; a label that would overwrite the reference is refused.
TEST_F(ConformTest, TheCommandReportsEveryConditionOfAServedModel) {
  test::ServeProcess server(PHASEKV_BINARY, model_dir_, root_ / "serve.log");
  ASSERT_FALSE(server.endpoint().empty()) << server.log();
  const fs::path out = root_ / "conform";
  const std::string base = std::string(PHASEKV_BINARY) + " conform --model " + model_dir_ +
                           " --endpoint " + server.endpoint() + " --served-model " + server.name() +
                           " --out " + out.string() + " --modulus 8 --examples 3 --seed 3";
  const test::CommandResult one = test::run_command(base + " --condition c1");
  ASSERT_EQ(one.status, 0) << one.out << one.err;
  EXPECT_CONTAINS(one.out, "c1: conforms within 1.0e-03");
  const test::CommandResult three = test::run_command(base + " --condition c3 --concurrency 3");
  ASSERT_EQ(three.status, 0) << three.out << three.err;
  const nlohmann::json report = read_json_file((out / "conform.json").string());
  ASSERT_EQ(report["conditions"].size(), 2u);
  for (const auto& c : report["conditions"]) {
    EXPECT_EQ(c["conform"]["items"], 24);
    EXPECT_EQ(c["conform"]["missing"], 0);
    EXPECT_LT(c["conform"]["max_dlogprob"].get<double>(), 1e-4);
  }
  EXPECT_EQ(report["conditions"][1]["engine"]["concurrency"], 3);
  EXPECT_EQ(test::sorted_lines(out / "conform.csv").size(), 1u + 2u * 8u);
  const test::CommandResult bad = test::run_command(base + " --condition reference");
  EXPECT_EQ(bad.status, 2);
  EXPECT_CONTAINS(bad.err, "--condition 'reference'");
  // Pieces through the prompt cache are llama.cpp's /completion only.
  const test::CommandResult pieces = test::run_command(base + " --condition p2 --prefill-pieces 2");
  EXPECT_EQ(pieces.status, 2);
  EXPECT_CONTAINS(pieces.err, "--prefill-pieces");
}

}  // namespace
}  // namespace phasekv
