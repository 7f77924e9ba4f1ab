// The lookup task (task/lookup.h): the study's layout, padding that holds the query position and
// the first two moments of the target position fixed across phases, in-sequence padding that
// decouples the other records from the target's phase, depth control, determinism, strict config,
// and the wiring into training batches, the trainer and the sweep.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <filesystem>
#include <iostream>
#include <set>
#include <tuple>

#include "backend/local_backend.h"
#include "eval/results_file.h"
#include "eval/sweep.h"
#include "task/lookup.h"
#include "task/task_file.h"
#include "task/tasks.h"
#include "test_util.h"
#include "train/batch.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "util/error.h"

namespace phasekv {
namespace {

constexpr double kPi = 3.14159265358979323846;

using test::small_lookup;

// The study's sizes: 64 records, 8 demonstrations, no filler between records.
TaskConfig study_lookup() {
  TaskConfig c;
  c.kind = TaskKind::kLookup;
  c.n_keys = 96;
  c.n_values = 96;
  c.n_filler = 16;
  c.n_records = 64;
  c.n_demos = 8;
  c.context_len = 2 * (64 + 8) + 3;
  return c;
}

// The index of the record whose key sits at `pos` in `ex`, or -1.
int record_at(const TaskExample& ex, int pos) {
  for (size_t i = 0; i < ex.records.size(); ++i)
    if (ex.records[i].key_pos == pos) return static_cast<int>(i);
  return -1;
}

// Checks the layout from the tokens alone (independently of check_layout): each record key once
// before the demonstrations and followed by its value, every other token there a filler; the
// demonstrations are records' pairs other than the target's; the target key is the last token.
void expect_study_layout(const TaskConfig& c, const LogicalExample& lg, const TaskExample& ex) {
  const TaskVocab v = task_vocab(c);
  const int R = c.n_records, D = c.n_demos;
  const int n = static_cast<int>(ex.tokens.size());
  const int query_start = n - (ex.with_answer ? 2 : 1) - 2 * D;
  ASSERT_EQ(ex.tokens[0], TaskVocab::kBos);
  std::vector<int> key_positions;
  int fillers = 0;
  for (int p = 1; p < query_start; ++p) {
    const int32_t t = ex.tokens[p];
    if (v.is_key(t)) {
      key_positions.push_back(p);
      ASSERT_TRUE(v.is_value(ex.tokens[p + 1])) << "key at " << p << " not followed by a value";
      ++p;
    } else {
      ASSERT_TRUE(v.is_filler(t)) << "token " << t << " at " << p;
      ++fillers;
    }
  }
  ASSERT_EQ(static_cast<int>(key_positions.size()), R);
  EXPECT_EQ(fillers, (c.context_len - lookup::min_context_len(c)) + 4 * ex.modulus - 2);
  std::set<int32_t> keys;
  for (int i = 0; i < R; ++i) {
    // Planned == generated: the plan's record i is the i-th key found in the tokens.
    EXPECT_EQ(ex.records[i].key_pos, key_positions[i]);
    EXPECT_EQ(ex.tokens[key_positions[i]], lg.records[i].key);
    EXPECT_EQ(ex.tokens[key_positions[i] + 1], lg.records[i].value);
    keys.insert(ex.tokens[key_positions[i]]);
  }
  EXPECT_EQ(static_cast<int>(keys.size()), R);  // each key once
  const int target = lg.query_records.back();
  std::set<int> demo_records;
  ASSERT_EQ(static_cast<int>(ex.queries.size()), D + 1);
  for (int i = 0; i < D; ++i) {
    const int p = query_start + 2 * i;
    int r = -1;  // the record whose key (found in the tokens) this demonstration repeats
    for (int j = 0; j < R; ++j)
      if (ex.tokens[key_positions[j]] == ex.tokens[p]) r = j;
    ASSERT_GE(r, 0) << "demonstration " << i << " is not a record's key";
    EXPECT_NE(r, target);
    EXPECT_EQ(ex.tokens[p + 1], ex.records[r].value);
    demo_records.insert(r);
    EXPECT_EQ(ex.queries[i].query_pos, p);
    EXPECT_EQ(ex.queries[i].answer, ex.records[r].value);
  }
  EXPECT_EQ(static_cast<int>(demo_records.size()), D);
  const int target_query = query_start + 2 * D;
  EXPECT_EQ(ex.tokens[target_query], lg.target().key);
  EXPECT_EQ(ex.target().query_pos, target_query);
  EXPECT_EQ(ex.target().answer, lg.target().value);
  EXPECT_EQ(ex.target().key_pos, ex.records[target].key_pos);
  if (!ex.with_answer) {
    EXPECT_EQ(target_query, n - 1);
  } else {
    EXPECT_EQ(ex.tokens[n - 1], lg.target().value);
  }
}

// ---------------------------------------------------------------------------------------------
// Layout at every phase, for both paddings, with and without filler between records.

using LayoutParam = std::tuple<int, PaddingMode, int>;  // M, padding, extra body fillers
class LookupLayout : public ::testing::TestWithParam<LayoutParam> {};

TEST_P(LookupLayout, EveryPhaseKeepsTheLayoutLengthAndQueryPosition) {
  const auto [m, mode, extra] = GetParam();
  const TaskConfig c = small_lookup(extra);
  for (uint64_t id = 0; id < 12; ++id) {
    const LogicalExample lg = make_logical_example(c, 7, id);
    const TaskExample ref = materialize(lg, m, 0, mode, false);
    for (int r = 0; r < m; ++r) {
      SCOPED_TRACE("id " + std::to_string(id) + " r " + std::to_string(r));
      for (bool with_answer : {false, true}) {
        const TaskExample ex = materialize(lg, m, r, mode, with_answer);
        expect_study_layout(c, lg, ex);
        EXPECT_EQ(ex.target().key_pos % m, r);
        EXPECT_EQ(static_cast<int>(ex.tokens.size()),
                  c.context_len + 4 * m - 2 - (with_answer ? 0 : 1));
        EXPECT_EQ(ex.pad_before + ex.pad_after, 4 * m - 2);
        for (size_t q = 0; q < ex.queries.size(); ++q)
          EXPECT_EQ(ex.queries[q].query_pos, ref.queries[q].query_pos);
        // The target's record index and the records before it do not depend on the phase.
        EXPECT_EQ(record_at(ex, ex.target().key_pos), lg.query_records.back());
        EXPECT_EQ(ex.target().key_pos, 1 + lg.target().key_pos + ex.pad_before);
        if (mode == PaddingMode::kPrefix) {
          for (size_t i = 0; i < ex.records.size(); ++i)
            EXPECT_EQ(ex.records[i].key_pos, 1 + lg.records[i].key_pos + ex.pad_before);
        }
        // answer_positions: every demonstration, and the target when its answer is present.
        EXPECT_EQ(answer_positions(ex).size(), ex.queries.size() - (with_answer ? 0 : 1));
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Lookup, LookupLayout,
                         ::testing::Combine(::testing::Values(1, 4, 8, 24),
                                            ::testing::Values(PaddingMode::kPrefix,
                                                              PaddingMode::kInSequence),
                                            ::testing::Values(0, 9)));

TEST(Lookup, StudySizesAtEveryPhase) {
  const TaskConfig c = study_lookup();
  for (uint64_t id = 0; id < 4; ++id) {
    const LogicalExample lg = make_logical_example(c, 1, id);
    for (PaddingMode mode : {PaddingMode::kPrefix, PaddingMode::kInSequence})
      for (int r = 0; r < 24; ++r) {
        const TaskExample ex = materialize(lg, 24, r, mode, false);
        expect_study_layout(c, lg, ex);
        EXPECT_EQ(ex.tokens.size(), 240u);  // context_len 147 - 1 (no answer) + 94 pads
        EXPECT_EQ(ex.target().query_pos, 239);
        EXPECT_EQ(ex.target().key_pos % 24, r);
      }
  }
}

// ---------------------------------------------------------------------------------------------
// The padding arithmetic, for every modulus, phase and unpadded position.

TEST(Lookup, TargetPaddingStaysInRangeAndHitsThePhase) {
  for (int m = 1; m <= 30; ++m) {
    const int P0 = 2 * m - 1;
    for (int r = 0; r < m; ++r)
      for (int b = 0; b < 200; ++b)
        for (uint64_t id : {0ULL, 1ULL, 17ULL, 123456789ULL, ~0ULL}) {
          const lookup::TargetPadding tp = lookup::target_padding(id, b, m, r);
          ASSERT_GE(tp.pad_before, 0);
          ASSERT_LE(tp.pad_before, 4 * m - 2);
          ASSERT_EQ((b + tp.pad_before) % m, r);
          ASSERT_EQ(b + tp.pad_before, m * ((P0 + b) / m) + r + m * tp.x);
        }
  }
  EXPECT_THROW(lookup::target_padding(0, 5, 8, 8), Error);
  EXPECT_THROW(lookup::target_padding(0, 5, 0, 0), Error);
}

TEST(Lookup, ModulusOneGivesZeroOneOrTwoPads) {
  int counts[3] = {0, 0, 0};
  const int n = 8000;
  for (int e = 0; e < n; ++e) ++counts[lookup::target_padding(e, 13, 1, 0).pad_before];
  EXPECT_NEAR(counts[0] / double(n), 1.0 / 8, 0.005);
  EXPECT_NEAR(counts[1] / double(n), 3.0 / 4, 0.005);
  EXPECT_NEAR(counts[2] / double(n), 1.0 / 8, 0.005);
}

// The low-discrepancy X: per phase, the shares of +1 and -1 are a_r and b_r within a few 1/N.
TEST(Lookup, DrawsOfXMatchTheirProbabilitiesPerPhase) {
  const int m = 24, n = 2400;
  for (int r = 0; r < m; ++r) {
    const double mu = ((m - 1) / 2.0 - r) / m;
    const double a = (0.25 + mu * mu + mu) / 2, b = (0.25 + mu * mu - mu) / 2;
    int plus = 0, minus = 0;
    for (int e = 0; e < n; ++e) {
      const int x = lookup::target_padding(e, 1, m, r).x;
      plus += x == 1;
      minus += x == -1;
    }
    EXPECT_NEAR(plus / double(n), a, 4.0 / n) << "r " << r;
    EXPECT_NEAR(minus / double(n), b, 4.0 / n) << "r " << r;
  }
}

// ---------------------------------------------------------------------------------------------
// Moments of the target position across phases.

struct Moments {
  std::vector<double> mean, sd;
  double mean_spread() const {
    return *std::max_element(mean.begin(), mean.end()) -
           *std::min_element(mean.begin(), mean.end());
  }
  double sd_spread() const {
    return *std::max_element(sd.begin(), sd.end()) - *std::min_element(sd.begin(), sd.end());
  }
};

template <typename PosFn>
Moments per_phase_moments(int m, int n, PosFn pos) {
  Moments out;
  for (int r = 0; r < m; ++r) {
    double s = 0, s2 = 0;
    for (int e = 0; e < n; ++e) {
      const double p = pos(e, r);
      s += p;
      s2 += p * p;
    }
    const double mean = s / n;
    out.mean.push_back(mean);
    out.sd.push_back(std::sqrt(std::max(0.0, s2 / n - mean * mean)));
  }
  return out;
}

// The study's sizes, M = 24, 2400 logical examples each at every phase. Tolerance 0.5 tokens for
// both the mean and the SD: half a position, against an SD of about 39 tokens (1.3 %); what is
// left is the residual sample covariance of the target's depth with X, which falls like the
// discrepancy of the (d, u) point set (lookup.h). The kv task's padding (k = (r - b) mod M, the
// negative control below) moves the mean by M - 1 = 23 tokens across phases on the same examples.
TEST(Lookup, TargetPositionMomentsAreTheSameAtEveryPhase) {
  const TaskConfig c = study_lookup();
  const int m = 24, n = 2400;
  std::vector<LogicalExample> lgs;
  for (int e = 0; e < n; ++e) lgs.push_back(make_logical_example(c, 3, e));
  for (PaddingMode mode : {PaddingMode::kPrefix, PaddingMode::kInSequence}) {
    int query_pos = -1;
    const Moments mo = per_phase_moments(m, n, [&](int e, int r) {
      const TaskExample ex = materialize(lgs[e], m, r, mode, false);
      if (query_pos < 0) query_pos = ex.target().query_pos;
      EXPECT_EQ(ex.target().query_pos, query_pos);
      return static_cast<double>(ex.target().key_pos);
    });
    std::cout << "[lookup moments] " << to_string(mode) << " M=24 N=2400: mean " << mo.mean.front()
              << ", max mean difference " << mo.mean_spread() << ", SD " << mo.sd.front()
              << ", max SD difference " << mo.sd_spread() << "\n";
    EXPECT_LT(mo.mean_spread(), 0.5) << to_string(mode);
    EXPECT_LT(mo.sd_spread(), 0.5) << to_string(mode);
    // And the values the derivation predicts: E[T] = E[M floor((P0 + b)/M)] + (M - 1)/2,
    // Var T = Var[M floor((P0 + b)/M)] + M^2 / 4.
    double s = 0, s2 = 0;
    for (const auto& lg : lgs) {
      const double base = m * ((2 * m - 1 + 1 + lg.target().key_pos) / m);
      s += base;
      s2 += base * base;
    }
    const double base_mean = s / n, base_var = s2 / n - base_mean * base_mean;
    for (int r = 0; r < m; ++r) {
      EXPECT_NEAR(mo.mean[r], base_mean + (m - 1) / 2.0, 0.5) << "r " << r;
      EXPECT_NEAR(mo.sd[r], std::sqrt(base_var + m * m / 4.0), 0.5) << "r " << r;
    }
  }
  // Negative control: the kv task's padding (k = (r - b) mod M) on the same examples fails the
  // same test (b is always odd here, so the mean alternates with the parity of r).
  const Moments kv = per_phase_moments(m, n, [&](int e, int r) {
    const int b = 1 + lgs[e].target().key_pos;
    return static_cast<double>(b + ((r - b) % m + m) % m);
  });
  EXPECT_GT(kv.mean_spread(), 1.0);
}

// With a fixed depth the base position is the same for every example, so only X varies.
TEST(Lookup, MomentsAtAFixedDepth) {
  TaskConfig c = study_lookup();
  c.target_depth = 0.5;
  const int m = 24, n = 1200;
  std::vector<LogicalExample> lgs;
  for (int e = 0; e < n; ++e) lgs.push_back(make_logical_example(c, 4, e));
  const Moments mo = per_phase_moments(m, n, [&](int e, int r) {
    return static_cast<double>(
        materialize(lgs[e], m, r, PaddingMode::kInSequence, false).target().key_pos);
  });
  std::cout << "[lookup moments] depth 0.5, in_sequence, M=24 N=1200: max mean difference "
            << mo.mean_spread() << ", max SD difference " << mo.sd_spread() << " (SD "
            << mo.sd.front() << ", exact 12)\n";
  EXPECT_LT(mo.mean_spread(), 0.5);
  EXPECT_LT(mo.sd_spread(), 0.5);
  for (double sd : mo.sd) EXPECT_NEAR(sd, 12.0, 0.5);  // M / 2
  // Negative control: with the kv task's padding the mean moves by M - 1 across phases.
  const Moments kv = per_phase_moments(m, n, [&](int e, int r) {
    const int b = 1 + lgs[e].target().key_pos;
    return static_cast<double>(b + ((r - b) % m + m) % m);
  });
  EXPECT_NEAR(kv.mean_spread(), m - 1, 1e-9);
}

// ---------------------------------------------------------------------------------------------
// Distractors: prefix padding moves every record with the target; in-sequence padding does not.

// Per example, |mean over r of exp(2 pi i (p_other - p_target) / M)|: 1 when the other record's
// phase moves in lockstep with the target's, near 0 when it stays while the target's goes round.
// `offset` picks the other record relative to the target (-1 = the one before it); examples
// without such a record are skipped. offset = kFirst: record 0 (when it is not the target).
constexpr int kFirst = 1000;
double phase_locking(const std::vector<LogicalExample>& lgs, int m, PaddingMode mode, int offset) {
  double sum = 0;
  int used = 0;
  for (const auto& lg : lgs) {
    const int t = lg.query_records.back();
    const int j = offset == kFirst ? 0 : t + offset;
    if (j == t || j < 0 || j >= static_cast<int>(lg.records.size())) continue;
    std::complex<double> z = 0;
    for (int r = 0; r < m; ++r) {
      const TaskExample ex = materialize(lg, m, r, mode, false);
      const int delta = ex.records[j].key_pos - ex.target().key_pos;
      z += std::polar(1.0, 2 * kPi * delta / m);
    }
    sum += std::abs(z) / m;
    ++used;
  }
  return sum / used;
}

TEST(Lookup, InSequencePaddingDecouplesDistractorsFromTheTargetPhase) {
  const TaskConfig c = study_lookup();
  const int m = 24;
  std::vector<LogicalExample> lgs;
  for (int e = 0; e < 300; ++e) lgs.push_back(make_logical_example(c, 5, e));
  std::cout << "[lookup distractors] phase locking with the target (1 = moves with it, 0 = "
               "independent), prefix / in_sequence:";
  for (int offset : {kFirst, -16, -8, -4, -2, -1, 1, 2, 4, 8, 16}) {
    const double prefix = phase_locking(lgs, m, PaddingMode::kPrefix, offset);
    const double inseq = phase_locking(lgs, m, PaddingMode::kInSequence, offset);
    std::cout << " " << (offset == kFirst ? std::string("first") : std::to_string(offset)) << " "
              << prefix << "/" << inseq;
    EXPECT_NEAR(prefix, 1.0, 1e-9) << "offset " << offset;  // prefix: everything moves together
    if (offset == kFirst) {
      EXPECT_LT(inseq, 0.1);
    } else if (std::abs(offset) >= 16) {
      EXPECT_LT(inseq, 0.5) << "offset " << offset;
    } else {
      // Neighbours only partly: 4M - 2 = 94 fillers over 65 gaps leave about 1.5 per gap, so the
      // gaps next to the target rarely change by much as r moves it (lookup.h).
      EXPECT_LT(inseq, 0.99) << "offset " << offset;
    }
  }
  std::cout << "\n";
}

// ---------------------------------------------------------------------------------------------
// Depth control.

TEST(Lookup, TargetDepthPutsTheTargetWhereAsked) {
  TaskConfig c = study_lookup();
  for (double depth : {0.0, 0.25, 0.5, 1.0}) {
    c.target_depth = depth;
    const int want = static_cast<int>(std::lround(depth * 63));
    for (uint64_t id = 0; id < 5; ++id) {
      const LogicalExample lg = make_logical_example(c, 2, id);
      EXPECT_EQ(lg.query_records.back(), want);
      for (PaddingMode mode : {PaddingMode::kPrefix, PaddingMode::kInSequence})
        for (int r : {0, 7, 23}) {
          const TaskExample ex = materialize(lg, 24, r, mode, false);
          // Exactly `want` record keys precede the target key in the context.
          int before = 0;
          for (const auto& rec : ex.records) before += rec.key_pos < ex.target().key_pos;
          EXPECT_EQ(before, want) << "depth " << depth;
        }
    }
  }
}

TEST(Lookup, RandomDepthCoversEveryRecordEvenly) {
  const TaskConfig c = study_lookup();
  std::vector<int> count(64, 0);
  for (int e = 0; e < 64 * 20; ++e) ++count[make_logical_example(c, 8, e).query_records.back()];
  for (int d = 0; d < 64; ++d) EXPECT_NEAR(count[d], 20, 3) << "record " << d;
  // A different seed rotates the sequence.
  EXPECT_NE(lookup::target_record(c, 8, 0), lookup::target_record(c, 9, 0));
}

// ---------------------------------------------------------------------------------------------
// Determinism.

TEST(Lookup, DeterministicInSeedAndId) {
  const TaskConfig c = small_lookup(5);
  const auto tokens = [&](uint64_t seed, uint64_t id) {
    return materialize(make_logical_example(c, seed, id), 8, 3, PaddingMode::kInSequence, true)
        .tokens;
  };
  EXPECT_EQ(tokens(1, 2), tokens(1, 2));
  EXPECT_NE(tokens(1, 2), tokens(2, 2));
  EXPECT_NE(tokens(1, 2), tokens(1, 3));
  // Golden values: (seed, id) names the same example on every platform and build.
  const LogicalExample lg = make_logical_example(c, 1, 2);
  EXPECT_EQ(lg.body, (std::vector<int32_t>{9, 23, 42, 19, 30, 20, 33, 41, 11, 28, 40, 8, 27, 37, 42,
                                           18, 34}));
  EXPECT_EQ(lg.query_records, (std::vector<int>{3, 5, 4}));
  EXPECT_EQ(tokens(1, 2),
            (std::vector<int32_t>{1,  42, 9,  23, 42, 40, 40, 43, 42, 40, 43, 38, 19, 30,
                                  44, 37, 38, 20, 33, 41, 44, 39, 11, 28, 40, 37, 43, 8,
                                  27, 37, 42, 44, 43, 42, 37, 37, 42, 18, 34, 38, 42, 38,
                                  40, 39, 37, 41, 37, 38, 11, 28, 18, 34, 8,  27}));
  const lookup::TargetPadding tp = lookup::target_padding(12345, 77, 24, 5);
  EXPECT_EQ(tp.pad_before, 72);
  EXPECT_EQ(tp.x, 1);
}

// ---------------------------------------------------------------------------------------------
// Layout check.

TEST(Lookup, LayoutCheckCatchesACorruptedPlan) {
  const TaskConfig c = small_lookup(3);
  const TaskExample good =
      materialize(make_logical_example(c, 2, 5), 8, 5, PaddingMode::kInSequence, true);
  EXPECT_NO_THROW(check_layout(good));

  TaskExample bad = good;
  bad.records[1].key_pos += 1;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;  // a demonstration with a wrong value
  bad.tokens[bad.queries[0].query_pos + 1] = bad.records[bad.target().record].value;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;  // a demonstration of the target's own record
  bad.queries[0].record = good.target().record;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;
  bad.phase = (good.phase + 1) % 8;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;
  bad.tokens.pop_back();
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;
  bad.pad_after += 1;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;  // a record's key in the padding makes the lookup ambiguous
  const TaskVocab v = task_vocab(c);
  const auto filler =
      std::find_if(bad.tokens.begin(), bad.tokens.end(), [&](int32_t t) { return v.is_filler(t); });
  ASSERT_NE(filler, bad.tokens.end());
  *filler = bad.records[3].key;
  EXPECT_THROW(check_layout(bad), Error);

  bad = good;  // a value in the padding
  *std::find_if(bad.tokens.begin(), bad.tokens.end(), [&](int32_t t) { return v.is_filler(t); }) =
      bad.records[2].value;
  EXPECT_THROW(check_layout(bad), Error);
}

// ---------------------------------------------------------------------------------------------
// Config.

std::string parse_error(const nlohmann::json& j) {
  try {
    task_config_from_json(j, "task.json");
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

nlohmann::json lookup_json() {
  return {{"name", "lookup"}, {"n_keys", 16}, {"n_values", 16},   {"n_filler", 8},
          {"n_records", 6},   {"n_demos", 2}, {"context_len", 19}};
}

TEST(Lookup, ConfigRoundTripsAndKvFilesStayAsTheyWere) {
  const TaskConfig c = task_config_from_json(lookup_json(), "x");
  EXPECT_EQ(c.kind, TaskKind::kLookup);
  EXPECT_EQ(c.n_demos, 2);
  const nlohmann::json j = task_config_to_json(c);
  EXPECT_EQ(j.at("name"), "lookup");
  EXPECT_EQ(j.at("n_demos"), 2);
  EXPECT_EQ(task_config_to_json(task_config_from_json(j, "x")), j);
  EXPECT_FALSE(task_config_to_json(TaskConfig{}).contains("n_demos"));
}

TEST(Lookup, ConfigErrorsNameTheKeyAndTheRange) {
  const auto with = [](const char* key, nlohmann::json value) {
    nlohmann::json j = lookup_json();
    j[key] = value;
    return parse_error(j);
  };
  EXPECT_EQ(parse_error(lookup_json()), "");
  std::string e = with("n_demos", 6);
  EXPECT_CONTAINS(e, "'n_demos'");
  EXPECT_CONTAINS(e, "[0, 5]");
  EXPECT_CONTAINS(with("n_demos", -1), "'n_demos'");
  e = with("context_len", 18);
  EXPECT_CONTAINS(e, "'context_len'");
  EXPECT_CONTAINS(e, "[19, ");
  EXPECT_CONTAINS(with("min_context_len", 18), "'min_context_len'");
  EXPECT_EQ(with("min_context_len", 19), "");
  e = with("n_queries", 2);
  EXPECT_CONTAINS(e, "'n_queries'");
  EXPECT_CONTAINS(e, "n_demos");
  EXPECT_CONTAINS(with("record_format", "kv_sep"), "'record_format'");
  EXPECT_CONTAINS(with("n_keys", 5), "'n_keys'");
  EXPECT_CONTAINS(with("n_values", 5), "'n_values'");
  EXPECT_CONTAINS(with("n_filler", 0), "'n_filler'");
  EXPECT_CONTAINS(with("target_depth", 1.5), "'target_depth'");
  EXPECT_CONTAINS(with("n_demos", "two"), "'n_demos'");
  // Demonstrations belong to lookup only.
  e = parse_error({{"name", "kv"}, {"n_demos", 1}});
  EXPECT_CONTAINS(e, "'n_demos'");
  EXPECT_CONTAINS(parse_error({{"name", "qa"}}), "kv|passkey|lookup");
}

// ---------------------------------------------------------------------------------------------
// Training examples.

TEST(Lookup, TrainingExamplesRandomiseThePhaseAndBothPaddings) {
  const TaskConfig c = small_lookup(4);
  Rng rng(11);
  const int m = 8, n = 1600;
  std::vector<int> phases(m, 0);
  int in_sequence = 0;
  std::set<int> key_parities;
  for (int i = 0; i < n; ++i) {
    const TaskExample ex = sample_training_example(c, rng, m);
    ASSERT_EQ(ex.kind, TaskKind::kLookup);
    ASSERT_TRUE(ex.with_answer);
    ++phases[ex.target().key_pos % m];
    in_sequence += ex.padding == PaddingMode::kInSequence;
    EXPECT_EQ(static_cast<int>(ex.tokens.size()), c.context_len + 4 * m - 2);
    EXPECT_EQ(answer_positions(ex).size(), static_cast<size_t>(c.n_demos + 1));
    key_parities.insert(ex.records[0].key_pos % 2);
  }
  for (int r = 0; r < m; ++r) EXPECT_GT(phases[r], n / m / 2) << "phase " << r;
  EXPECT_NEAR(in_sequence / double(n), 0.5, 0.05);
  EXPECT_EQ(key_parities.size(), 2u);
}

// [train] in_sequence_padding: the share of in-sequence examples follows it (0 = prefix only, 1 =
// in-sequence only), and every share draws the same examples at the same phases, so two runs that
// differ in it compare like with like. The default 1/2 is the fair coin of earlier versions, draw
// for draw (checked-in runs and bundled models train on the same data as before).
TEST(Lookup, TrainingInSequenceShareChoosesThePaddingOfTheSameExamples) {
  Rng a(21), b(21);
  for (int i = 0; i < 2000; ++i) ASSERT_EQ(draw_chance(a, 0.5), draw_below(b, 2) == 1) << i;
  const TaskConfig c = small_lookup(4);
  const int m = 8, n = 1200;
  auto draw = [&](double share) {
    Rng rng(11);
    std::vector<TaskExample> out;
    for (int i = 0; i < n; ++i) out.push_back(sample_training_example(c, rng, m, {}, share));
    return out;
  };
  auto in_sequence_share = [](const std::vector<TaskExample>& xs) {
    int k = 0;
    for (const auto& ex : xs) k += ex.padding == PaddingMode::kInSequence;
    return k / double(xs.size());
  };
  const auto half = draw(0.5), none = draw(0.0), all = draw(1.0), quarter = draw(0.25);
  EXPECT_EQ(in_sequence_share(none), 0.0);
  EXPECT_EQ(in_sequence_share(all), 1.0);
  EXPECT_NEAR(in_sequence_share(quarter), 0.25, 0.04);  // binomial sd 0.0125
  EXPECT_NEAR(in_sequence_share(half), 0.5, 0.05);
  Rng rng(11);
  for (int i = 0; i < n; ++i) {
    ASSERT_EQ(sample_training_example(c, rng, m).tokens, half[i].tokens) << i;  // the default
    for (const auto* xs : {&none, &all, &quarter}) {
      const TaskExample& ex = (*xs)[i];
      ASSERT_EQ(ex.logical_id, half[i].logical_id) << i;
      ASSERT_EQ(ex.phase, half[i].phase) << i;
      ASSERT_EQ(ex.tokens.size(), half[i].tokens.size()) << i;
      ASSERT_EQ(ex.target().key_pos, half[i].target().key_pos) << i;
      if (ex.padding == half[i].padding) {
        ASSERT_EQ(ex.tokens, half[i].tokens) << i;
      }
    }
  }
  // Other tasks pad the prefix only: another share is an error, not silently ignored.
  TaskConfig kv;
  kv.context_len = 16;
  Rng r(1);
  EXPECT_THROW(sample_training_example(kv, r, m, {}, 0.0), Error);
}

TEST(Lookup, TrainingWithoutRandomisationStillMovesTheRecords) {
  const TaskConfig c = small_lookup();  // no filler: only the padding moves the records
  Rng rng(3);
  std::set<int> pads, first_key;
  for (int i = 0; i < 400; ++i) {
    const TaskExample ex = sample_training_example(c, rng, 0);
    EXPECT_EQ(static_cast<int>(ex.tokens.size()), c.context_len + 2);
    pads.insert(ex.pad_before);
    first_key.insert(ex.records[0].key_pos);
  }
  EXPECT_EQ(pads, (std::set<int>{0, 1, 2}));
  EXPECT_GE(first_key.size(), 2u);  // keys at odd and even positions
}

TEST(Lookup, TrainingContextLengthCurriculum) {
  TaskConfig c = small_lookup(10);
  c.min_context_len = 19;
  Rng rng(9);
  std::set<size_t> lengths;
  for (int i = 0; i < 1000; ++i) lengths.insert(sample_training_example(c, rng, 4).tokens.size());
  EXPECT_EQ(*lengths.begin(), 19u + 14u);
  EXPECT_EQ(*lengths.rbegin(), 29u + 14u);
}

TEST(Lookup, ShortcutCeilingRulesOutTheDemonstrations) {
  EXPECT_NEAR(shortcut_ceiling(study_lookup(), 0, 50), 1.0 / 56, 1e-12);
  EXPECT_NEAR(shortcut_ceiling(small_lookup(), 0, 50), 1.0 / 4, 1e-12);
}

// ---------------------------------------------------------------------------------------------
// Wiring: training batches, the trainer, the sweep.

TEST(Lookup, TrainingBatchesTakeTheLossAtDemonstrationsAndTarget) {
  const TaskConfig c = small_lookup(2);
  Rng rng(4);
  const TrainingBatch b = make_training_batch(c, rng, 6, 4, 0.0);
  EXPECT_EQ(b.tokens.size(0), 6);
  EXPECT_EQ(b.tokens.size(1), c.context_len + 14);
  ASSERT_EQ(b.target.numel(), 6 * (c.n_demos + 1));
  const TaskVocab v = task_vocab(c);
  for (int64_t i = 0; i < b.target.numel(); ++i) {
    EXPECT_TRUE(v.is_value(static_cast<int32_t>(b.target[i].item<int64_t>())));
    EXPECT_TRUE(v.is_key(static_cast<int32_t>(b.tokens[b.row[i]][b.col[i]].item<int64_t>())));
  }
}

// A backend that answers by looking the last token up in the context, except when the target key
// sits at position 3 mod 4: the sweep must find exactly that phase at 0.
class OracleBackend : public Backend {
 public:
  std::string model_id() const override { return "oracle"; }
  std::vector<int32_t> tokenize(const std::string&) override { return {}; }
  std::string detokenize(const std::vector<int32_t>&) override { return ""; }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    std::vector<ScoreResult> out;
    for (const auto& r : requests) {
      ScoreResult s;
      const int32_t key = r.context.back();
      const auto first = std::find(r.context.begin(), r.context.end(), key);
      s.argmax = (first - r.context.begin()) % 4 == 3 ? 0 : *(first + 1);
      s.target_logprob = s.argmax == r.target ? 0.0 : -5.0;
      out.push_back(s);
    }
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>&, int) override { return {}; }
  int64_t max_context() const override { return 4096; }
  nlohmann::json describe() const override { return {{"backend", "oracle"}}; }
};

TEST(Lookup, SweepScoresTheTargetAtEveryPhase) {
  OracleBackend oracle;
  for (PaddingMode mode : {PaddingMode::kPrefix, PaddingMode::kInSequence}) {
    SweepOptions o;
    o.task = study_lookup();
    o.examples = 10;
    o.modulus = 8;
    o.padding = mode;
    o.seed = 1;
    o.stride = 4;
    o.out_dir = test::temp_dir("lookup_sweep").string();
    o.stats.bootstrap_reps = 50;
    o.stats.permutations = 20;
    const SweepResult res = run_sweep(oracle, o);
    EXPECT_EQ(res.scored, 80);
    EXPECT_NEAR(res.meta.at("shortcut_ceiling").get<double>(), 1.0 / 56, 1e-12);
    for (const auto& rec : read_results(o.out_dir + "/results.jsonl").records) {
      EXPECT_EQ(rec.task, "lookup");
      EXPECT_EQ(rec.key_pos % 8, rec.phase);
      EXPECT_EQ(rec.query_pos, 145 + 30);  // context_len - 1 + 4M - 2 tokens, the key last
      EXPECT_EQ(rec.correct, rec.phase % 4 != 3) << "phase " << rec.phase;
    }
  }
}

// `phasekv train` on a lookup config: a few steps of a tiny model, then the trained model's own
// evaluation through the local backend.
TEST(Lookup, TrainsAndSweepsATinyModel) {
  const nlohmann::json j = nlohmann::json::parse(R"({
    "model": {"vocab_size": 45, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64,
              "attention": {"kind": "chunked", "stride": 4, "width": 4, "n_win": 2}},
    "task": {"name": "lookup", "n_keys": 16, "n_values": 16, "n_filler": 8, "n_records": 6,
             "n_demos": 2, "context_len": 19},
    "train": {"steps": 3, "batch": 4, "lr": 0.003, "warmup": 1, "seed": 3, "threads": 1,
              "offset_randomization": 4, "log_every": 1, "eval_every": 3, "eval_examples": 8,
              "checkpoint_every": 3}})");
  const TrainConfig cfg = train_config_from_json(j, "t", ".");
  const std::string dir = (test::temp_dir("lookup_train") / "model").string();
  const TrainResult r = train(cfg, dir, false);
  EXPECT_TRUE(std::isfinite(r.final_loss));
  LocalBackend backend = LocalBackend::from_dir(dir, 1, 8);
  SweepOptions o;
  o.task = load_task_config(dir);
  EXPECT_EQ(o.task.kind, TaskKind::kLookup);
  o.examples = 3;
  o.modulus = 4;
  o.out_dir = test::temp_dir("lookup_train_sweep").string();
  o.stats.bootstrap_reps = 20;
  o.stats.permutations = 10;
  EXPECT_EQ(run_sweep(backend, o).scored, 12);
}

}  // namespace
}  // namespace phasekv
