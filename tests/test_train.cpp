// Training: config errors, learning on a trivial task, and exact resume from a checkpoint.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "model/model_dir.h"
#include "test_util.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

nlohmann::json tiny_train_json() {
  return nlohmann::json::parse(R"({
    "model": {"vocab_size": 29, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64,
              "attention": {"kind": "chunked", "stride": 4, "width": 4, "n_win": 1}},
    "task": {"name": "kv", "n_keys": 8, "n_values": 8, "n_filler": 8, "n_records": 2,
             "context_len": 16},
    "train": {"steps": 20, "batch": 8, "lr": 0.003, "warmup": 2, "seed": 3, "threads": 1,
              "log_every": 1, "eval_every": 10, "eval_examples": 16, "checkpoint_every": 10}})");
}

// A fresh path whose directory does not exist yet (the trainer creates it).
std::string temp_dir(const std::string& name) {
  const fs::path p = test::temp_dir("train_" + name);
  fs::remove_all(p);
  return p.string();
}

std::vector<double> losses(const std::string& dir) {
  std::ifstream in(dir + "/train_log.jsonl");
  std::vector<double> out;
  std::string line;
  while (std::getline(in, line))
    out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

TEST(TrainConfig, ErrorsNameSectionAndKey) {
  auto j = tiny_train_json();
  j["train"]["stepz"] = 3;
  EXPECT_TRUE(test::throws_containing([&] { train_config_from_json(j, "t.toml", "."); },
                                      "[train]: unknown key 'stepz'"));
  // in_sequence_padding: a share in [0, 1], for the lookup task only; written to the provenance
  // only when not the default, so the configs of runs from before the key stay unchanged.
  j = tiny_train_json();
  EXPECT_FALSE(
      train_config_from_json(j, "t.toml", ".").source["train"].contains("in_sequence_padding"));
  j["train"]["in_sequence_padding"] = 0.0;
  EXPECT_TRUE(test::throws_containing([&] { train_config_from_json(j, "t.toml", "."); },
                                      "'in_sequence_padding' applies to the lookup task only"));
  j = tiny_train_json();
  j["model"]["vocab_size"] = 30;
  EXPECT_TRUE(test::throws_containing([&] { train_config_from_json(j, "t.toml", "."); },
                                      "vocab_size is 30"));
}

// Every checked-in training config parses (TOML integers are signed: a seed of 0 must still read
// as an unsigned seed), and a JSON config reads like its TOML.
TEST(TrainConfig, CheckedInConfigsParse) {
  int n = 0;
  for (const char* sub : {"configs/train", "configs/explore"}) {
    const fs::path dir = fs::path(PHASEKV_SOURCE_DIR) / sub;
    if (!fs::exists(dir)) continue;
    for (const auto& e : fs::directory_iterator(dir)) {
      if (e.path().extension() != ".toml") continue;
      EXPECT_NO_THROW(train_config_from_file(e.path().string())) << e.path();
      ++n;
    }
  }
  EXPECT_GE(n, 2);
  const std::string toml = (fs::path(PHASEKV_SOURCE_DIR) / "configs/train/kv-chunked.toml").string();
  const TrainConfig a = train_config_from_file(toml);
  const fs::path json_path = test::temp_dir("config_json") / "kv-chunked.json";
  write_file_atomic(json_path.string(), a.source.dump());
  EXPECT_EQ(train_config_from_file(json_path.string()).source, a.source);
  fs::remove_all(json_path.parent_path());
}

// Trains `cfg` (20 steps) straight into `straight`, and into `resumed` killed at step 13 (the
// step-10 checkpoint survives, steps 11-13 are lost and redone) then resumed; expects the same
// loss at every step and returns the straight run's losses.
std::vector<double> expect_resume_matches(const TrainConfig& cfg, const std::string& straight,
                                          const std::string& resumed) {
  train(cfg, straight, false);
  train(cfg, resumed, false, /*stop_after=*/13);
  train(cfg, resumed, /*resume=*/true);
  auto a = losses(straight), b = losses(resumed);
  EXPECT_EQ(a.size(), 20u);
  EXPECT_EQ(b.size(), 20u);
  for (size_t i = 0; i < std::min(a.size(), b.size()); ++i)
    EXPECT_NEAR(a[i], b[i], 1e-4) << "step " << i + 1;
  return a;
}

TEST(Train, ResumeReachesTheSameStateAsAnUninterruptedRun) {
  auto cfg = train_config_from_json(tiny_train_json(), "t", ".");
  const auto straight = temp_dir("straight"), resumed = temp_dir("resumed");
  const auto a = expect_resume_matches(cfg, straight, resumed);
  ASSERT_EQ(a.size(), 20u);
  // The run learned something: loss went down from its start.
  EXPECT_LT(a.back(), a.front());
  EXPECT_TRUE(fs::exists(resumed + "/model.safetensors"));
  EXPECT_TRUE(fs::exists(resumed + "/task.json"));
  fs::remove_all(straight);
  fs::remove_all(resumed);
}

// The phase curriculum: weights follow the last evaluation's per-phase errors, training then
// draws phases by them, and a resume continues with the saved weights (same losses as an
// uninterrupted run, which it could not have with uniform phases after the kill).
TEST(Train, PhaseCurriculumWeighsPhasesByErrorAndResumesExactly) {
  EvalScore e;
  e.phase_correct = {4, 2, 0, 4};
  e.phase_count = {4, 4, 4, 4};
  const auto w = curriculum_weights(e, 0.5);  // errors 0, .5, 1, 0 -> 1/8 + .5 * err / 1.5
  ASSERT_EQ(w.size(), 4u);
  EXPECT_NEAR(w[0], 0.125, 1e-12);
  EXPECT_NEAR(w[1], 0.125 + 0.5 / 3, 1e-12);
  EXPECT_NEAR(w[2], 0.125 + 1.0 / 3, 1e-12);
  EXPECT_NEAR(w[3], 0.125, 1e-12);
  e.phase_correct = {4, 4, 4, 4};
  for (double x : curriculum_weights(e, 0.5)) EXPECT_DOUBLE_EQ(x, 0.25);  // nothing to weigh

  auto j = tiny_train_json();
  j["train"]["offset_randomization"] = 4;
  j["train"]["phase_curriculum"] = 0.9;
  auto cfg = train_config_from_json(j, "t", ".");
  const auto straight = temp_dir("curriculum"), resumed = temp_dir("curriculum_resumed");
  expect_resume_matches(cfg, straight, resumed);
  // The log carries the weights of the evaluations at steps 10 and 20, one per phase, summing to 1.
  std::ifstream in(straight + "/train_log.jsonl");
  std::string line;
  int with_weights = 0;
  while (std::getline(in, line)) {
    const auto rec = nlohmann::json::parse(line);
    if (!rec.contains("phase_weights")) continue;
    ++with_weights;
    double sum = 0;
    for (double x : rec["phase_weights"]) sum += x;
    EXPECT_EQ(rec["phase_weights"].size(), 4u);
    EXPECT_NEAR(sum, 1.0, 1e-9);
  }
  EXPECT_EQ(with_weights, 2);
  fs::remove_all(straight);
  fs::remove_all(resumed);
  // A curriculum needs phases: without offset randomization it is an error naming the key.
  j["train"]["offset_randomization"] = 0;
  try {
    train_config_from_json(j, "t.toml", ".");
    FAIL() << "no error";
  } catch (const Error& err) {
    EXPECT_CONTAINS(err.what(), "phase_curriculum");
  }
}

// init_from starts a run from saved weights: step 1 of the new run sees exactly the weights the
// first run ended with (same loss as evaluating them), and a model of another config is refused.
TEST(Train, InitFromStartsFromTheSavedWeightsAndChecksTheConfig) {
  auto cfg = train_config_from_json(tiny_train_json(), "t", ".");
  const auto first = temp_dir("first"), second = temp_dir("second");
  train(cfg, first, false);
  Decoder saved = load_model_dir(first);
  Decoder fresh(cfg.model);
  fresh->init_weights(99);
  init_from_model_dir(fresh, first);
  auto want = saved->named_parameters();
  for (const auto& p : fresh->named_parameters())
    EXPECT_TRUE(torch::equal(p.value(), want[p.key()])) << p.key();

  auto j = tiny_train_json();
  j["train"]["init_from"] = fs::path(first).filename().string();  // relative to base_dir
  auto cfg2 = train_config_from_json(j, "t", fs::path(first).parent_path().string());
  EXPECT_EQ(cfg2.train.init_from, first);
  train(cfg2, second, false);
  // The continued run starts where the first ended: its first loss is below the first run's.
  EXPECT_LT(losses(second).front(), losses(first).front());

  j = tiny_train_json();
  j["model"]["d_ff"] = 96;
  j["train"]["init_from"] = first;
  auto other = train_config_from_json(j, "t", ".");
  EXPECT_TRUE(test::throws_containing([&] { train(other, temp_dir("other"), false); }, first));
  fs::remove_all(first);
  fs::remove_all(second);
  fs::remove_all(temp_dir("other"));
}

}  // namespace
}  // namespace phasekv
