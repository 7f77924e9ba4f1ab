// DeepSeek-V4 models through the training loop (train/trainable.h): a [model] config naming
// DeepseekV4ForCausalLM trains a V4 model directory that loads and sweeps, the loss falls, the
// routers' selection biases move, a killed run resumes to the same losses, and what the loop
// cannot do for V4 is refused by name.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "test_util.h"
#include "test_v4_util.h"
#include "train/trainer.h"
#include "util/error.h"
#include "v4/model_dir.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// A train config (as JSON) whose [model] is a small V4 config file in `dir`, on a kv task of
// vocabulary 29.
nlohmann::json v4_train_json(const fs::path& dir) {
  v4::V4Config c = test::v4_small_config();
  c.vocab_size = 29;
  c.max_position_embeddings = 64;
  fs::create_directories(dir);
  v4::write_config((dir / "v4.json").string(), c);
  return nlohmann::json::parse(R"({
    "model": {"config": "v4.json"},
    "task": {"name": "kv", "n_keys": 8, "n_values": 8, "n_filler": 8, "n_records": 2,
             "context_len": 16},
    "train": {"steps": 20, "batch": 4, "lr": 0.003, "warmup": 2, "seed": 3, "threads": 1,
              "log_every": 1, "eval_every": 10, "eval_examples": 8, "checkpoint_every": 10}})");
}

std::vector<double> losses(const fs::path& dir) {
  std::ifstream in(dir / "train_log.jsonl");
  std::vector<double> out;
  for (std::string line; std::getline(in, line);)
    out.push_back(nlohmann::json::parse(line).at("loss").get<double>());
  return out;
}

TEST(V4Training, TrainsAV4ModelDirectoryAndResumesExactly) {
  const fs::path root = test::temp_dir("v4train");
  const TrainConfig cfg = train_config_from_json(v4_train_json(root), "t.toml", root.string());
  ASSERT_TRUE(cfg.v4.has_value());
  EXPECT_EQ(cfg.source["model"]["architectures"], nlohmann::json({"DeepseekV4ForCausalLM"}));
  const fs::path straight = root / "straight", resumed = root / "resumed";
  train(cfg, straight.string(), false);
  train(cfg, resumed.string(), false, /*stop_after=*/13);
  train(cfg, resumed.string(), /*resume=*/true);
  const auto a = losses(straight), b = losses(resumed);
  ASSERT_EQ(a.size(), 20u);
  ASSERT_EQ(b.size(), 20u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-4) << "step " << i + 1;
  EXPECT_LT(a.back(), a.front());
  // A V4 model directory, with the task beside it: what `phasekv sweep` loads.
  ASSERT_TRUE(v4::is_v4_model_dir(straight.string()));
  EXPECT_TRUE(fs::exists(straight / "task.json"));
  const v4::V4Model trained = v4::load_v4_dir(straight.string());
  v4::V4Model fresh(*cfg.v4);
  fresh.init_random(cfg.train.seed);
  // Layer 1 is score-routed (layer 0 hash-routed): its selection bias moved towards balance.
  EXPECT_FALSE(torch::equal(trained.tensors.at("layers.1.ffn.gate.bias"),
                            fresh.tensors.at("layers.1.ffn.gate.bias")));
  EXPECT_TRUE(torch::equal(trained.tensors.at("layers.2.ffn.gate.bias"),
                           v4::load_v4_dir(resumed.string()).tensors.at("layers.2.ffn.gate.bias")));
}

TEST(V4Training, RefusesWhatTheLoopCannotDoForV4) {
  const fs::path root = test::temp_dir("v4train_bad");
  auto message = [&](const nlohmann::json& j) {
    try {
      train_config_from_json(j, "t.toml", root.string());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json j = v4_train_json(root);
  j["train"]["precision"] = "bf16";
  EXPECT_CONTAINS(message(j), "[train] precision 'bf16' with a DeepSeek-V4 [model] (allowed: f32)");
  j = v4_train_json(root);
  j["task"]["n_keys"] = 9;
  EXPECT_CONTAINS(message(j), "[model] vocab_size is 29 but the task's vocabulary has 30");
  EXPECT_EQ(message(v4_train_json(root)), "");
}

}  // namespace
}  // namespace phasekv
