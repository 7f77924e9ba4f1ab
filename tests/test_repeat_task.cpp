// The repeat objective (train/repeat_task.h): sequence shape, loss positions, determinism, errors,
// and the [train] key that mixes it into batches.
#include <gtest/gtest.h>

#include <set>

#include "train/batch.h"
#include "train/repeat_task.h"
#include "train/train_config.h"
#include "util/error.h"
#include "test_util.h"

namespace phasekv {
namespace {

TaskConfig small_task() {
  TaskConfig c;
  c.n_keys = 4;
  c.n_values = 4;
  c.n_filler = 4;  // 12 content tokens
  c.n_records = 2;
  c.context_len = 20;
  return c;
}

TEST(RepeatTask, SecondHalfRepeatsDistinctContentTokensAndEveryRepeatTokenIsATarget) {
  const TaskConfig c = small_task();
  const TaskVocab v = task_vocab(c);
  std::mt19937_64 rng(7);
  const RepeatSequence r = sample_repeat_sequence(c, rng, 20);
  const int n = 9;
  ASSERT_EQ(r.tokens.size(), 20u);
  EXPECT_EQ(r.tokens[0], TaskVocab::kBos);
  EXPECT_EQ(r.tokens[n + 1], TaskVocab::kQuery);
  std::set<int32_t> seen;
  for (int i = 0; i < n; ++i) {
    const int32_t t = r.tokens[static_cast<size_t>(1 + i)];
    EXPECT_TRUE(v.is_key(t) || v.is_value(t) || v.is_filler(t)) << t;
    EXPECT_TRUE(seen.insert(t).second) << "token " << t << " drawn twice";
    EXPECT_EQ(r.tokens[static_cast<size_t>(n + 2 + i)], t) << "repeat differs at " << i;
  }
  // <q> predicts s1, then each repeat token predicts the next; the last token predicts nothing.
  std::vector<int> want;
  for (int p = n + 1; p <= 18; ++p) want.push_back(p);
  EXPECT_EQ(r.positions, want);
}

TEST(RepeatTask, UnmarkedRepeatsVaryTheirLengthAndTargetTheSecondCopyFromItsSecondToken) {
  const TaskConfig c = small_task();  // 12 content tokens
  std::mt19937_64 rng(7);
  std::set<int> lengths, rows;
  for (int trial = 0; trial < 400; ++trial) {
    const RepeatSequence r = sample_repeat_sequence(c, rng, 20, false);
    const int row = static_cast<int>(r.tokens.size());
    ASSERT_EQ(row % 2, 0);
    ASSERT_GE(row, 6);
    ASSERT_LE(row, 20);
    rows.insert(row);
    EXPECT_EQ(r.tokens[0], TaskVocab::kBos);
    for (int32_t t : r.tokens) EXPECT_NE(t, TaskVocab::kQuery);
    // The copy s1..sn ends the row twice: n from the loss positions (n - 1 of them).
    const int n = static_cast<int>(r.positions.size()) + 1, start = row - 2 * n;
    ASSERT_GE(n, 2);
    ASSERT_LE(n, (row - 1) / 2);  // and <= 12 - 1
    lengths.insert(n);
    std::set<int32_t> copy;
    for (int i = 0; i < n; ++i) {
      const int32_t t = r.tokens[static_cast<size_t>(start + i)];
      EXPECT_TRUE(copy.insert(t).second) << "token " << t << " twice in the copy";
      EXPECT_EQ(r.tokens[static_cast<size_t>(start + n + i)], t);
    }
    for (int p = 1; p < start; ++p)  // the prefix: no token of the copy, so one match each
      EXPECT_EQ(copy.count(r.tokens[static_cast<size_t>(p)]), 0u) << "prefix token at " << p;
    for (size_t i = 0; i < r.positions.size(); ++i)
      EXPECT_EQ(r.positions[i], start + n + static_cast<int>(i));
  }
  EXPECT_EQ(lengths.size(), 8u) << "every n in [2, 9] drawn";
  EXPECT_EQ(rows.size(), 8u) << "every even row length in [6, 20] drawn";
}

TEST(RepeatTask, LookupRepeatsAreAsLongAsItsPaddedRows) {
  TaskConfig c;
  c.kind = TaskKind::kLookup;
  c.n_keys = 32;
  c.n_values = 32;
  c.n_filler = 8;
  c.n_records = 12;
  c.n_demos = 8;
  c.context_len = 43;  // the minimum 2 R + 2 D + 3: every row is 43 + 4 M - 2 tokens long
  std::mt19937_64 rng(3);
  for (int M : {0, 1, 8}) {
    const int want = (43 + 4 * std::max(M, 1) - 2) & ~1;
    EXPECT_EQ(draw_repeat_length(c, rng, M), want) << "M = " << M;
    EXPECT_EQ(static_cast<int>(make_training_batch(c, rng, 2, M, 1.0).tokens.size(1)), want);
    EXPECT_LE(static_cast<int>(make_training_batch(c, rng, 2, M, 1.0, false).tokens.size(1)), want);
  }
  TaskConfig kv = small_task();
  EXPECT_EQ(draw_repeat_length(kv, rng, 8), 20);  // kv rows carry no padding of their own
  // 72 content tokens repeat at most 146 tokens; M = 40 asks for 43 + 158.
  EXPECT_TRUE(test::throws_containing([&] { check_repeat_lengths(c, 40, "t.toml"); },
                                      "plus 158 padding fillers"));
}

TEST(RepeatTask, SameRngSameSequenceAndDifferentSeedsDiffer) {
  const TaskConfig c = small_task();
  std::mt19937_64 a(1), b(1), other(2);
  const auto x = sample_repeat_sequence(c, a, 16), y = sample_repeat_sequence(c, b, 16),
             z = sample_repeat_sequence(c, other, 16);
  EXPECT_EQ(x.tokens, y.tokens);
  EXPECT_NE(x.tokens, z.tokens);
}

TEST(RepeatTask, LengthsItCannotBuildAreErrors) {
  const TaskConfig c = small_task();
  std::mt19937_64 rng(0);
  for (int len : {4, 15, 28}) {  // too short, odd, more distinct tokens (13) than the 12 there are
    try {
      sample_repeat_sequence(c, rng, len);
      FAIL() << "no error for length " << len;
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "length " + std::to_string(len));
    }
  }
  EXPECT_EQ(sample_repeat_sequence(c, rng, 26).tokens.size(), 26u);  // 12 distinct: the maximum
}

// Targets of row b, as (position, target) pairs, checking each target is the next token.
std::vector<std::pair<int64_t, int64_t>> targets_of(const TrainingBatch& batch, int64_t b) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t i = 0; i < batch.row.size(0); ++i) {
    if (batch.row[i].item<int64_t>() != b) continue;
    const int64_t col = batch.col[i].item<int64_t>(), t = batch.target[i].item<int64_t>();
    EXPECT_EQ(batch.tokens[b][col + 1].item<int64_t>(), t) << "row " << b << " col " << col;
    out.emplace_back(col, t);
  }
  return out;
}

TEST(RepeatTask, TrainingBatchPutsRepeatRowsFirstWithATargetAtEveryRepeatedToken) {
  const TaskConfig c = small_task();  // fixed length 20: repeats of 9 tokens, 1 query per example
  std::mt19937_64 rng(5);
  const TrainingBatch batch = make_training_batch(c, rng, 8, 1, 0.25);  // 2 of 8 rows
  ASSERT_EQ(batch.tokens.size(0), 8);
  for (int64_t b = 0; b < 8; ++b) {
    const auto tg = targets_of(batch, b);
    if (b < 2) {
      EXPECT_EQ(batch.tokens[b][10].item<int64_t>(), TaskVocab::kQuery) << b;
      for (int i = 0; i < 9; ++i)
        EXPECT_EQ(batch.tokens[b][11 + i].item<int64_t>(), batch.tokens[b][1 + i].item<int64_t>());
      ASSERT_EQ(tg.size(), 9u) << b;
      EXPECT_EQ(tg.front().first, 10);
      EXPECT_EQ(tg.back().first, 18);
    } else {
      ASSERT_EQ(tg.size(), 1u) << b;  // the task's single answer, after `<q> key`
      EXPECT_EQ(batch.tokens[b][tg[0].first - 1].item<int64_t>(), TaskVocab::kQuery) << b;
      EXPECT_TRUE(task_vocab(c).is_value(static_cast<int32_t>(tg[0].second))) << b;
    }
  }
  // Without repeat rows every row is a task example.
  std::mt19937_64 rng2(5);
  const TrainingBatch plain = make_training_batch(c, rng2, 8, 1, 0.0);
  for (int64_t b = 0; b < 8; ++b) EXPECT_EQ(targets_of(plain, b).size(), 1u) << b;
}

TEST(RepeatTask, RepeatFractionIsReadAndRangeChecked) {
  auto j = nlohmann::json::parse(R"({
    "model": {"vocab_size": 29, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64},
    "task": {"name": "kv", "n_keys": 8, "n_values": 8, "n_filler": 8, "n_records": 2,
             "context_len": 16},
    "train": {"repeat_fraction": 0.25}})");
  EXPECT_DOUBLE_EQ(train_config_from_json(j, "t.toml", ".").train.repeat_fraction, 0.25);
  EXPECT_TRUE(train_config_from_json(j, "t.toml", ".").train.repeat_marker);
  j["train"]["repeat_marker"] = false;
  const TrainConfig unmarked = train_config_from_json(j, "t.toml", ".");
  EXPECT_FALSE(unmarked.train.repeat_marker);
  EXPECT_EQ(train_options_to_json(unmarked.train).at("repeat_marker"), false);
  EXPECT_FALSE(train_options_to_json(TrainOptions{}).contains("repeat_marker"));
  j["train"].erase("repeat_marker");
  j["train"]["repeat_fraction"] = 1.5;
  EXPECT_TRUE(test::throws_containing([&] { train_config_from_json(j, "t.toml", "."); },
                                      "'repeat_fraction' is 1.5"));
  // 24 content tokens allow repeats of at most 50 tokens; a 60-token task cannot be mirrored.
  j["train"]["repeat_fraction"] = 0.5;
  j["task"]["context_len"] = 60;
  try {
    train_config_from_json(j, "t.toml", ".");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(),
                    "t.toml: [train]: repeat_fraction > 0 needs task "
                    "lengths in [6, 50]");
  }
}

TEST(RepeatTask, InductionWarmUpBatchesAreShortUnmarkedRepeatsAndItsKeysAreChecked) {
  const TaskConfig c = small_task();
  std::mt19937_64 rng(11);
  const TrainingBatch batch = make_induction_batch(c, rng, 16, 12);
  EXPECT_LE(batch.tokens.size(1), 12);
  for (int64_t b = 0; b < 16; ++b) {
    const auto tg = targets_of(batch, b);  // also checks each target is the next token
    ASSERT_GE(tg.size(), 1u) << b;
    for (int64_t t = 0; t < batch.tokens.size(1); ++t)
      EXPECT_NE(batch.tokens[b][t].item<int64_t>(), TaskVocab::kQuery);
  }

  auto j = nlohmann::json::parse(R"({
    "model": {"vocab_size": 29, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64},
    "task": {"name": "kv", "n_keys": 8, "n_values": 8, "n_filler": 8, "n_records": 2,
             "context_len": 16},
    "train": {"steps": 100, "induction_steps": 40, "induction_len": 20}})");
  const TrainConfig ok = train_config_from_json(j, "t.toml", ".");
  EXPECT_EQ(ok.train.induction_steps, 40);
  EXPECT_EQ(train_options_to_json(ok.train).at("induction_len"), 20);
  EXPECT_FALSE(train_options_to_json(TrainOptions{}).contains("induction_steps"));
  auto refused = [&](const char* key, int value, const std::string& says) {
    auto bad = j;
    bad["train"][key] = value;
    try {
      train_config_from_json(bad, "t.toml", ".");
      ADD_FAILURE() << key << " = " << value << " accepted";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), says);
    }
  };
  refused("induction_steps", 101, "'induction_steps' is 101 (allowed: 0 to steps = 100)");
  refused("induction_len", 4, "'induction_len' is 4 (allowed: 6 to 50");  // 24 content tokens
  refused("induction_len", 52, "'induction_len' is 52");
}

}  // namespace
}  // namespace phasekv
