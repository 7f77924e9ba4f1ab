// DeepSeek-V4 config.json: HF keys read directly, written back as read, and every invalid value
// refused with an error naming the file, the key and what is allowed.
#include <gtest/gtest.h>

#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"
#include "v4/config.h"

namespace phasekv {
namespace {

using nlohmann::json;

// The keys of DeepSeek-V4-Flash's config.json (shapes shrunk), including YaRN and HF bookkeeping.
json flash_like() {
  return json::parse(R"({
    "architectures": ["DeepseekV4ForCausalLM"], "model_type": "deepseek_v4",
    "attention_bias": false, "attention_dropout": 0.0, "bos_token_id": 0, "eos_token_id": 1,
    "compress_ratios": [0, 4, 128], "compress_rope_theta": 160000.0,
    "hc_eps": 1e-06, "hc_mult": 4, "hc_sinkhorn_iters": 20, "head_dim": 64,
    "hidden_act": "silu", "hidden_size": 128, "index_head_dim": 64, "index_n_heads": 4,
    "index_topk": 512, "initializer_range": 0.02, "max_position_embeddings": 1048576,
    "moe_intermediate_size": 32, "n_routed_experts": 8, "n_shared_experts": 1,
    "norm_topk_prob": true, "num_attention_heads": 8, "num_experts_per_tok": 6,
    "num_hash_layers": 1, "num_hidden_layers": 3, "num_key_value_heads": 1,
    "num_nextn_predict_layers": 1, "o_groups": 4, "o_lora_rank": 16, "q_lora_rank": 32,
    "qk_rope_head_dim": 32, "rms_norm_eps": 1e-06,
    "rope_scaling": {"beta_fast": 32, "beta_slow": 1, "factor": 16,
                     "original_max_position_embeddings": 65536, "type": "yarn"},
    "rope_theta": 10000, "routed_scaling_factor": 1.5, "scoring_func": "sqrtsoftplus",
    "sliding_window": 128, "swiglu_limit": 10.0, "tie_word_embeddings": false,
    "topk_method": "noaux_tc", "torch_dtype": "bfloat16", "transformers_version": "4.57.1",
    "vocab_size": 1000})");
}

std::string error_of(const json& j) {
  return test::error_of([&] { v4::config_from_json(j, "dir/config.json"); });
}

TEST(V4Config, ReadsHfKeys) {
  const v4::V4Config c = v4::config_from_json(flash_like(), "config.json");
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 4, 128}));
  EXPECT_EQ(c.hc_sinkhorn_iters, 20);
  EXPECT_EQ(c.num_experts_per_tok, 6);
  EXPECT_DOUBLE_EQ(c.routed_scaling_factor, 1.5);
  EXPECT_TRUE(c.rope_scaling.enabled);
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 16.0);
  EXPECT_EQ(c.rope_scaling.original_max_position_embeddings, 65536);
  EXPECT_TRUE(c.overlap(1));
  EXPECT_FALSE(c.overlap(2));
  EXPECT_TRUE(v4::is_v4_config(flash_like()));
}

TEST(V4Config, WrittenBackAsRead) {
  const json in = flash_like();
  EXPECT_EQ(v4::config_to_json(v4::config_from_json(in, "config.json")), in);
  // null rope_scaling and an absent one both survive.
  json no_yarn = in;
  no_yarn["rope_scaling"] = nullptr;
  EXPECT_EQ(v4::config_to_json(v4::config_from_json(no_yarn, "c")), no_yarn);
  no_yarn.erase("rope_scaling");
  EXPECT_EQ(v4::config_to_json(v4::config_from_json(no_yarn, "c")), no_yarn);
  // And through a file.
  const auto dir = test::temp_dir("v4cfg");
  const std::string path = (dir / "config.json").string();
  const v4::V4Config tiny = v4::tiny_config();
  v4::write_config(path, tiny);
  EXPECT_EQ(v4::config_to_json(v4::read_config(path)), v4::config_to_json(tiny));
}

TEST(V4Config, BundledTinyMatchesLlamaCppTestShapes) {
  // configs/v4/tiny.json is what `phasekv init` reads for the parity model.
  const v4::V4Config c = v4::read_config(std::string(PHASEKV_SOURCE_DIR) + "/configs/v4/tiny.json");
  EXPECT_EQ(v4::config_to_json(c), v4::config_to_json(v4::tiny_config()));
  EXPECT_EQ(c.hidden_size, 512);
  EXPECT_EQ(c.compress_ratios, (std::vector<int64_t>{0, 0, 4, 128}));
}

TEST(V4Config, NamedErrors) {
  auto with = [](const char* key, json v) {
    json j = flash_like();
    j[key] = std::move(v);
    return error_of(j);
  };
  auto expect_has = [](const std::string& msg, const std::string& part) {
    EXPECT_CONTAINS(msg, part);
    EXPECT_CONTAINS(msg, "dir/config.json");
  };
  expect_has(with("my_key", 1), "unknown key 'my_key' (allowed:");
  expect_has(with("compress_ratios", json::array({0, 4})), "'compress_ratios' has 2 entries");
  expect_has(with("compress_ratios", json::array({0, 1, 4})), "allowed: 0 for a sliding-window");
  expect_has(with("num_key_value_heads", 2), "'num_key_value_heads' is 2 (allowed: 1");
  expect_has(with("scoring_func", "softmax"), "allowed: sqrtsoftplus");
  expect_has(with("o_groups", 3), "divisor of num_attention_heads");
  expect_has(with("qk_rope_head_dim", 65), "'qk_rope_head_dim' is 65");
  expect_has(with("num_experts_per_tok", 9), "1 to n_routed_experts = 8");
  expect_has(with("hidden_act", "gelu"), "'hidden_act' is \"gelu\" (allowed: \"silu\")");
  expect_has(with("hidden_size", "big"), "'hidden_size' has the wrong type");
  expect_has(with("quantization_config", json{{"fmt", "e4m3"}}), "quantization_config");
  expect_has(with("rope_scaling", json{{"type", "linear"}, {"factor", 2}}), "allowed: yarn");
  expect_has(with("index_head_dim", 16), "'index_head_dim' is 16");
}

}  // namespace
}  // namespace phasekv
