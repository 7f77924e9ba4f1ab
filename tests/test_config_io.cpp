// Config parsing errors and model-directory round trips / corruption, as users meet them.
#include <gtest/gtest.h>

#include <filesystem>
#include <atomic>
#include <fstream>
#include <thread>
#include <vector>

#include "model/model_dir.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

using test::error_of;

nlohmann::json base_json() {
  return nlohmann::json::parse(R"({"vocab_size": 32, "d_model": 32, "n_layers": 2, "n_heads": 4,
    "n_kv_heads": 2, "head_dim": 8, "d_ff": 48,
    "attention": {"kind": "chunked", "stride": 4, "width": 8, "gate": "vector", "n_win": 2},
    "layers": [{"kind": "full"}, {}]})");
}

TEST(Config, ParsesDefaultsAndPerLayerOverrides) {
  auto c = model_config_from_json(base_json(), "cfg.json");
  ASSERT_EQ(c.layers.size(), 2u);
  EXPECT_EQ(c.layers[0].kind, AttentionKind::kFull);
  EXPECT_EQ(c.layers[1].kind, AttentionKind::kChunked);
  EXPECT_EQ(c.layers[1].width, 8);
  EXPECT_EQ(c.layers[1].gate, GateKind::kVector);
  EXPECT_EQ(c.layers[1].lanes(), 2);
  // Round trip through JSON is exact.
  auto again = model_config_from_json(model_config_to_json(c), "again");
  EXPECT_EQ(model_config_to_json(again), model_config_to_json(c));
}

TEST(Config, ErrorsNameTheKeyAndWhatIsAllowed) {
  auto j = base_json();
  j["attention"]["strid"] = 4;
  auto msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "cfg.json");
  EXPECT_CONTAINS(msg, "'strid'");
  EXPECT_CONTAINS(msg, "stride");

  j = base_json();
  j["attention"]["gate"] = "max";
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "scalar|vector|mean");

  j = base_json();
  j["attention"]["width"] = 2;
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "'width' (2) must be >= stride (4)");

  j = base_json();
  j["n_heads"] = 3;
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "multiple of n_kv_heads");

  j = base_json();
  j["attention"]["grid_offset"] = 4;  // stride 4: allowed 0..3
  j["layers"][0]["grid_offset"] = 0;  // layer 0 is full attention
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "'grid_offset' must be in [0, stride) = [0, 4), got 4");
  j["attention"]["grid_offset"] = 3;
  j["layers"][0].erase("grid_offset");  // layer 0 (full attention) inherits 3
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "layers[0]: 'grid_offset' applies to chunked layers only");

  j = base_json();
  j["d_model"] = "big";
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "'d_model' has the wrong type");
}

// Per-KV-head grids: one offset per KV head, each in [0, S), chunked layers only, not with a
// layer grid_offset; runs of equal offsets form one grid group, and equal offsets everywhere are
// the layer's grid_offset.
TEST(Config, KvHeadOffsetsFormGridGroups) {
  auto j = base_json();
  j["n_kv_heads"] = 4;
  j["layers"][1]["kv_head_offsets"] = {0, 0, 3, 1};
  auto c = model_config_from_json(j, "cfg.json");
  auto groups = grid_groups(c, c.layers[1]);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].head0, 0);
  EXPECT_EQ(groups[0].heads, 2);
  EXPECT_EQ(groups[1].head0, 2);
  EXPECT_EQ(groups[1].heads, 1);
  EXPECT_EQ(groups[1].attn.grid_offset, 3);
  EXPECT_EQ(groups[2].attn.grid_offset, 1);
  EXPECT_TRUE(groups[2].attn.kv_head_offsets.empty());
  EXPECT_CONTAINS(describe(c.layers[1]), "head-offsets=0,0,3,1");
  auto again = model_config_from_json(model_config_to_json(c), "again");
  EXPECT_EQ(again.layers[1].kv_head_offsets, c.layers[1].kv_head_offsets);
  // Without offsets: one group of every head, the layer's own config.
  auto one = grid_groups(c, c.layers[0]);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].heads, 4);

  j["layers"][1]["kv_head_offsets"] = {0, 2};
  auto msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg,
                  "layers[1]: 'kv_head_offsets' needs one offset per KV head (n_kv_heads = 4), "
                  "got 2");
  j["layers"][1]["kv_head_offsets"] = {0, 1, 2, 4};
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "kv_head_offsets[3] must be in [0, stride) = [0, 4), got 4");
  j["layers"][1]["kv_head_offsets"] = {0, 1, 2, 3};
  j["layers"][1]["grid_offset"] = 1;
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "set 'grid_offset' or 'kv_head_offsets', not both");
  j["layers"][1].erase("grid_offset");
  j["layers"][0]["kv_head_offsets"] = {0, 1, 2, 3};
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "layers[0]: 'kv_head_offsets' applies to chunked layers only");
  j["layers"][0].erase("kv_head_offsets");
  j["layers"][1]["kv_head_offsets"] = "0,1";
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "'kv_head_offsets' must be a list of integers");
  j["layers"][1]["kv_head_offsets"] = {0, 1.5, 2, 3};
  msg = error_of([&] { model_config_from_json(j, "cfg.json"); });
  EXPECT_CONTAINS(msg, "kv_head_offsets[1]");
}

struct TempDir {
  std::string path;
  TempDir() {
    path = (std::filesystem::temp_directory_path() /
            ("phasekv_test_" + std::to_string(::getpid()) + "_" + std::to_string(rand())))
               .string();
    std::filesystem::create_directories(path);
  }
  ~TempDir() { std::filesystem::remove_all(path); }
};

TEST(ModelDir, RoundTripF32AndBf16) {
  auto cfg = model_config_from_json(base_json(), "cfg");
  auto m = test::make_model(cfg, 3);
  TempDir dir;
  auto tokens = test::random_tokens(21, 32, 4);
  torch::NoGradGuard g;
  auto ref = m->forward(tokens);
  save_model_dir(dir.path + "/f32", m);
  auto back = load_model_dir(dir.path + "/f32");
  EXPECT_EQ((back->forward(tokens) - ref).abs().max().item<double>(), 0.0);
  save_model_dir(dir.path + "/bf16", m, torch::kBFloat16);
  auto b16 = load_model_dir(dir.path + "/bf16");
  double d = (b16->forward(tokens) - ref).abs().max().item<double>();
  EXPECT_GT(d, 0.0);   // rounded weights...
  EXPECT_LT(d, 0.05);  // ...but the same model
  EXPECT_EQ(config_hash(back->cfg), config_hash(cfg));
}

TEST(ModelDir, CorruptionGivesNamedErrors) {
  auto cfg = model_config_from_json(base_json(), "cfg");
  auto m = test::make_model(cfg, 3);
  TempDir dir;
  save_model_dir(dir.path, m);
  const std::string w = dir.path + "/model.safetensors";
  auto bytes = read_file(w);
  write_file_atomic(w, bytes.substr(0, bytes.size() - 100));
  auto msg = error_of([&] { load_model_dir(dir.path); });
  EXPECT_CONTAINS(msg, "model.safetensors");
  EXPECT_CONTAINS(msg, "final_norm.weight");  // the last tensor written
  EXPECT_CONTAINS(msg, "truncated");
  // A config that no longer matches the weights: name the tensor and both shapes.
  write_file_atomic(w, bytes);
  auto j = base_json();
  j["d_ff"] = 40;
  write_file_atomic(dir.path + "/config.json", j.dump());
  msg = error_of([&] { load_model_dir(dir.path); });
  EXPECT_CONTAINS(msg, "w_gate.weight");
  EXPECT_CONTAINS(msg, "[40, 32]");
  msg = error_of([&] { load_model_dir(dir.path + "/nope"); });
  EXPECT_CONTAINS(msg, "does not exist");
}

}  // namespace
}  // namespace phasekv

namespace phasekv {
namespace {

// The audit's request cache writes one answer from several workers at once: every writer of a
// path must succeed (each has its own temporary file) and the file must hold one whole answer.
TEST(AtomicWrite, ConcurrentWritersOfOnePathAllSucceedAndLeaveOneWholeFile) {
  TempDir dir;
  const std::string path = dir.path + "/same.json";
  std::atomic<int> failures{0};
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      for (int i = 0; i < 50; ++i) {
        try {
          write_file_atomic(path, std::string(1000, static_cast<char>('a' + w)));
        } catch (const Error&) {
          ++failures;
        }
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(failures.load(), 0);
  const std::string content = read_file(path);
  ASSERT_EQ(content.size(), 1000u);
  EXPECT_EQ(content.find_first_not_of(content[0]), std::string::npos);
  int leftovers = 0;
  for (const auto& e : std::filesystem::directory_iterator(dir.path))
    if (e.path().filename() != "same.json") ++leftovers;
  EXPECT_EQ(leftovers, 0);
}

}  // namespace
}  // namespace phasekv
