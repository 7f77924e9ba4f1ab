// The sweep's inference-time mitigations (eval/mitigations.h, docs/MITIGATIONS.md): the prompt
// edits themselves (task/prompt_edits.h), what a sweep sends with --ensemble K and --recent-copy,
// how the K distributions are combined, and the validation of both options. A recording backend
// stands in for a model, so every expectation is exact.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>

#include "eval/mitigations.h"
#include "eval/sweep.h"
#include "task/prompt_edits.h"
#include "test_util.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

constexpr int kStride = 8;  // the recorder's "model": strong only at key positions 7, 0 mod 8
// Its raw window: 3 tokens, so that only a recent copy lies in it (the demonstrations, 4 tokens,
// keep every record of the context out).
constexpr int kWindow = 3;

TaskConfig lookup_task() { return test::small_lookup(); }  // 19 tokens, 48 at M = 8

// Answers like a phase-sensitive chunked model: the query key's record is read correctly (all
// the mass on its value) when its latest occurrence lies in the raw window or at a key position 7
// or 0 mod kStride; otherwise the model is lost (a uniform distribution, whose top-1 is id 0,
// <pad>). Records every context it is sent.
class Recorder : public Backend {
 public:
  explicit Recorder(int vocab) : vocab_(vocab) {}
  std::string model_id() const override { return "recorder"; }
  std::vector<int32_t> tokenize(const std::string&) override { return {}; }
  std::string detokenize(const std::vector<int32_t>&) override { return ""; }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    const std::vector<Distribution> dists = next_token_distributions(requests);
    std::vector<ScoreResult> out(requests.size());
    for (size_t i = 0; i < out.size(); ++i) {
      const std::vector<double>& p = dists[i].probs;
      out[i].argmax = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
      out[i].argmax_logprob = std::log(p[static_cast<size_t>(out[i].argmax)]);
      out[i].target_logprob = std::log(p.at(static_cast<size_t>(requests[i].target)));
    }
    return out;
  }
  std::vector<Distribution> next_token_distributions(
      const std::vector<ScoreRequest>& requests) override {
    std::vector<Distribution> out;
    for (const auto& r : requests) {
      sent.push_back(r.context);
      const int n = static_cast<int>(r.context.size());
      int pos = n - 2;  // the latest earlier occurrence of the query key
      while (pos >= 0 && r.context[static_cast<size_t>(pos)] != r.context.back()) --pos;
      Distribution d;
      d.probs.assign(static_cast<size_t>(vocab_), 1.0 / vocab_);
      const bool strong = pos % kStride == kStride - 1 || pos % kStride == 0;
      if (pos >= 0 && (n - 1 - pos < kWindow || strong)) {
        d.probs.assign(static_cast<size_t>(vocab_), 0.0);
        d.probs[static_cast<size_t>(r.context[static_cast<size_t>(pos) + 1])] = 1.0;
      }
      out.push_back(d);
    }
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>&, int) override { return {}; }
  int64_t max_context() const override { return 4096; }
  int model_stride() const override { return kStride; }
  nlohmann::json describe() const override {
    return {{"backend", "recorder"}, {"stride", kStride}, {"vocab_size", vocab_}};
  }

  std::vector<std::vector<int32_t>> sent;

 private:
  int vocab_;
};

SweepOptions options(const std::string& name, int examples = 4) {
  SweepOptions o;
  o.task = lookup_task();
  o.examples = examples;
  o.modulus = kStride;
  o.seed = 3;
  o.out_dir = test::temp_dir(name).string();
  o.batch = 5;  // not a multiple of the modulus: batches cut examples apart
  o.stats.bootstrap_reps = 50;
  o.stats.permutations = 20;
  return o;
}

std::map<int, double> accuracy_by_phase(const SweepResult& r) {
  std::map<int, double> acc;
  for (const PhaseRow& row : r.summary.phases) acc[row.r] = row.acc;
  return acc;
}

// ---------------------------------------------------------------------------------------------
// The prompt edits.

TEST(PromptEdits, AShiftInsertsFillersRightAfterBosAndMovesEverythingElse) {
  const LogicalExample lg = make_logical_example(lookup_task(), 3, 1);
  const TaskExample ex = materialize(lg, kStride, 5, PaddingMode::kPrefix, false);
  const TaskVocab v = task_vocab(lookup_task());
  EXPECT_EQ(shifted_context(lg, ex.tokens, 0), ex.tokens);
  const std::vector<int32_t> s6 = shifted_context(lg, ex.tokens, 6);
  ASSERT_EQ(s6.size(), ex.tokens.size() + 6);
  EXPECT_EQ(s6[0], TaskVocab::kBos);
  for (int i = 1; i <= 6; ++i) EXPECT_TRUE(v.is_filler(s6[static_cast<size_t>(i)])) << i;
  EXPECT_TRUE(std::equal(ex.tokens.begin() + 1, ex.tokens.end(), s6.begin() + 7));
  EXPECT_EQ(s6[static_cast<size_t>(ex.target().key_pos) + 6], lg.target().key);
  // Shifts of one example share their first fillers.
  const std::vector<int32_t> s2 = shifted_context(lg, ex.tokens, 2);
  EXPECT_TRUE(std::equal(s2.begin(), s2.begin() + 3, s6.begin()));
  EXPECT_THROW(shifted_context(lg, ex.tokens, -1), Error);
}

TEST(PromptEdits, ARecentCopyPutsTheTargetRecordRightBeforeTheQueryKey) {
  const LogicalExample lg = make_logical_example(lookup_task(), 3, 2);
  for (PaddingMode mode : {PaddingMode::kPrefix, PaddingMode::kInSequence}) {
    const TaskExample ex = materialize(lg, kStride, 3, mode, false);
    const TaskExample rc = with_recent_copy(ex);
    const size_t n = ex.tokens.size();
    ASSERT_EQ(rc.tokens.size(), n + 2);
    EXPECT_TRUE(std::equal(ex.tokens.begin(), ex.tokens.end() - 1, rc.tokens.begin()));
    EXPECT_EQ(rc.tokens[n - 1], lg.target().key);
    EXPECT_EQ(rc.tokens[n], lg.target().value);
    EXPECT_EQ(rc.tokens[n + 1], lg.target().key);
    EXPECT_EQ(rc.target().query_pos, ex.target().query_pos + 2);
    EXPECT_EQ(rc.target().key_pos, ex.target().key_pos);  // the record itself stays
    EXPECT_EQ(rc.phase, ex.phase);
  }
  const TaskExample kv =
      materialize(make_logical_example(test::small_kv_task(), 3, 0), 4, 1, PaddingMode::kPrefix,
                  false);
  EXPECT_THROW(with_recent_copy(kv), Error);
  EXPECT_THROW(with_recent_copy(materialize(lg, kStride, 3, PaddingMode::kPrefix, true)), Error);
}

TEST(Mitigations, ConditionNamesEverySetting) {
  SweepOptions o;
  EXPECT_EQ(mitigation_condition(o), "");
  o.ensemble = 4;
  EXPECT_EQ(mitigation_condition(o), "ensemble=4");
  o.recent_copy = true;
  EXPECT_EQ(mitigation_condition(o), "recent_copy+ensemble=4");
  o.ensemble = 1;
  EXPECT_EQ(mitigation_condition(o), "recent_copy");
}

TEST(Mitigations, ShiftsSpreadEvenlyOverTheStride) {
  SweepOptions o = options("shifts");
  const int model_stride = 8;
  EXPECT_EQ(ensemble_shifts(o, model_stride), std::vector<int>({0}));
  o.ensemble = 4;
  EXPECT_EQ(ensemble_shifts(o, model_stride), std::vector<int>({0, 2, 4, 6}));
  o.ensemble = 3;
  EXPECT_EQ(ensemble_shifts(o, model_stride), std::vector<int>({0, 2, 5}));
  o.stride = 4;  // --stride wins over the model's
  EXPECT_EQ(ensemble_shifts(o, model_stride), std::vector<int>({0, 1, 2}));
}

// ---------------------------------------------------------------------------------------------
// Through the sweep.

TEST(Mitigations, EnsembleOfOneIsThePlainSweep) {
  Recorder plain_backend(task_vocab(lookup_task()).vocab_size());
  Recorder one_backend(task_vocab(lookup_task()).vocab_size());
  SweepOptions plain = options("plain"), one = options("one");
  one.ensemble = 1;
  const SweepResult a = run_sweep(plain_backend, plain);
  const SweepResult b = run_sweep(one_backend, one);
  EXPECT_EQ(plain_backend.sent, one_backend.sent);
  EXPECT_EQ(test::slurp(fs::path(plain.out_dir) / "results.jsonl"),
            test::slurp(fs::path(one.out_dir) / "results.jsonl"));
  EXPECT_EQ(a.summary.to_json(), b.summary.to_json());
  EXPECT_EQ(a.meta["sweep"]["condition"], "");
}

TEST(Mitigations, EnsembleSendsShiftedCopiesAndAveragesTheirDistributions) {
  const int vocab = task_vocab(lookup_task()).vocab_size();
  for (int k : {2, 8}) {
    Recorder backend(vocab);
    SweepOptions o = options("ensemble" + std::to_string(k));
    o.ensemble = k;
    const SweepResult r = run_sweep(backend, o);
    // K requests per item, in item order, each the unshifted context shifted by j S / K.
    ASSERT_EQ(backend.sent.size(), static_cast<size_t>(o.examples * kStride * k));
    size_t next = 0;
    for (int e = 0; e < o.examples; ++e) {
      const LogicalExample lg = make_logical_example(o.task, o.seed, static_cast<uint64_t>(e));
      for (int phase = 0; phase < kStride; ++phase) {
        const TaskExample ex = materialize(lg, kStride, phase, o.padding, false);
        for (int j = 0; j < k; ++j)
          EXPECT_EQ(backend.sent[next++], shifted_context(lg, ex.tokens, j * kStride / k))
              << "example " << e << " phase " << phase << " copy " << j;
      }
    }
    // The phase reported is the unshifted one. Records are read at 7 and 0 mod 8 only, and a
    // lost copy is uniform: the average is right when one copy is strong. K = 2 (shifts 0, 4)
    // rescues the phases 3 and 4; K = 8 covers every phase.
    for (const auto& [phase, acc] : accuracy_by_phase(r)) {
      const bool covered = k == 8 || phase % 4 == 3 || phase % 4 == 0;
      EXPECT_EQ(acc, covered ? 1.0 : 0.0) << "K " << k << " phase " << phase;
    }
    for (const auto& rec : read_results(o.out_dir + "/results.jsonl").records) {
      EXPECT_EQ(rec.condition, "ensemble=" + std::to_string(k));
      EXPECT_EQ(rec.key_pos % kStride, rec.phase);
      if (k == 8) {  // 2 of 8 copies put all their mass on the answer, 6 spread it evenly
        EXPECT_NEAR(*rec.target_logprob, std::log(2.0 / 8 + 6.0 / 8 / vocab), 1e-12);
      }
    }
    EXPECT_EQ(r.meta["sweep"]["ensemble"], k);
  }
}

TEST(Mitigations, RecentCopySendsTheTargetRecordRightBeforeTheQueryKey) {
  Recorder backend(task_vocab(lookup_task()).vocab_size());
  SweepOptions o = options("recent");
  o.recent_copy = true;
  const SweepResult r = run_sweep(backend, o);
  ASSERT_EQ(backend.sent.size(), static_cast<size_t>(o.examples * kStride));
  size_t next = 0;
  for (int e = 0; e < o.examples; ++e) {
    const LogicalExample lg = make_logical_example(o.task, o.seed, static_cast<uint64_t>(e));
    for (int phase = 0; phase < kStride; ++phase) {
      const std::vector<int32_t>& sent = backend.sent[next++];
      EXPECT_EQ(std::vector<int32_t>(sent.end() - 3, sent.end()),
                std::vector<int32_t>({lg.target().key, lg.target().value, lg.target().key}));
      std::vector<int32_t> without = sent;
      without.erase(without.end() - 3, without.end() - 1);
      EXPECT_EQ(without, materialize(lg, kStride, phase, o.padding, false).tokens);
    }
  }
  // The copy lies inside the recorder's raw window, so every phase is read.
  for (const auto& [phase, acc] : accuracy_by_phase(r)) EXPECT_EQ(acc, 1.0) << phase;
  for (const auto& rec : read_results(o.out_dir + "/results.jsonl").records) {
    EXPECT_EQ(rec.condition, "recent_copy");
    EXPECT_EQ(rec.key_pos % kStride, rec.phase);
    EXPECT_EQ(rec.query_pos, 19 - 1 + 4 * kStride - 2 + 2 - 1);  // the copy before the last key
  }
}

TEST(Mitigations, BadOptionsFailNamingTheFlagBeforeWritingAnything) {
  auto expect_error = [](Backend& b, const SweepOptions& o, const std::string& needle) {
    EXPECT_TRUE(test::throws_containing([&] { run_sweep(b, o); }, needle));
    EXPECT_FALSE(fs::exists(fs::path(o.out_dir) / "results.jsonl")) << o.out_dir;
  };
  Recorder backend(task_vocab(lookup_task()).vocab_size());
  SweepOptions o = options("bad0");
  o.ensemble = 0;
  expect_error(backend, o, "--ensemble is 0 (allowed: >= 1");
  o.ensemble = 16;
  expect_error(backend, o, "--ensemble 16 exceeds the stride 8 (allowed: 1 to 8");
  // A model without a stride (a full-attention control): --stride gives the shifts.
  class NoStride : public Recorder {
   public:
    using Recorder::Recorder;
    int model_stride() const override { return 0; }
    nlohmann::json describe() const override { return {{"backend", "recorder"}}; }
  } full(task_vocab(lookup_task()).vocab_size());
  o.ensemble = 2;
  expect_error(full, o, "--ensemble 2 needs a stride S");
  o.stride = 8;
  EXPECT_NO_THROW(run_sweep(full, o));
  SweepOptions kv = options("bad_kv");
  kv.task = test::small_kv_task();
  kv.modulus = 4;
  kv.recent_copy = true;
  expect_error(backend, kv, "--recent-copy: the task is kv (allowed: lookup");
}

}  // namespace
}  // namespace phasekv
