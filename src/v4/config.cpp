#include "v4/config.h"

#include <fmt/format.h>

#include <set>

#include "util/error.h"
#include "util/fs.h"
#include "util/json_read.h"

namespace phasekv::v4 {
namespace {

using json_read::read;
using nlohmann::json;

// Every scalar key, one line each: reading, writing and the allowed-key list all walk this.
template <typename Config, typename F>
void for_each_scalar(Config& c, F&& f) {
  f("vocab_size", c.vocab_size);
  f("hidden_size", c.hidden_size);
  f("num_hidden_layers", c.num_hidden_layers);
  f("num_attention_heads", c.num_attention_heads);
  f("num_key_value_heads", c.num_key_value_heads);
  f("head_dim", c.head_dim);
  f("qk_rope_head_dim", c.qk_rope_head_dim);
  f("q_lora_rank", c.q_lora_rank);
  f("o_lora_rank", c.o_lora_rank);
  f("o_groups", c.o_groups);
  f("rope_theta", c.rope_theta);
  f("compress_rope_theta", c.compress_rope_theta);
  f("sliding_window", c.sliding_window);
  f("index_n_heads", c.index_n_heads);
  f("index_head_dim", c.index_head_dim);
  f("index_topk", c.index_topk);
  f("hc_mult", c.hc_mult);
  f("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  f("hc_eps", c.hc_eps);
  f("n_routed_experts", c.n_routed_experts);
  f("num_experts_per_tok", c.num_experts_per_tok);
  f("n_shared_experts", c.n_shared_experts);
  f("moe_intermediate_size", c.moe_intermediate_size);
  f("scoring_func", c.scoring_func);
  f("routed_scaling_factor", c.routed_scaling_factor);
  f("norm_topk_prob", c.norm_topk_prob);
  f("swiglu_limit", c.swiglu_limit);
  f("num_hash_layers", c.num_hash_layers);
  f("rms_norm_eps", c.rms_norm_eps);
  f("max_position_embeddings", c.max_position_embeddings);
  f("num_nextn_predict_layers", c.num_nextn_predict_layers);
}

// Keys carried through unchanged: HF bookkeeping, or settings whose only allowed value is
// checked in check_passthrough (hidden_act, tie_word_embeddings, ...). Transformers 5's
// rope_parameters / compress_rope_parameters restate rope_theta, compress_rope_theta and
// rope_scaling; phasekv reads the latter three, as llama.cpp's converter does.
const std::set<std::string> kPassthroughKeys = {"architectures",
                                                "model_type",
                                                "auto_map",
                                                "bos_token_id",
                                                "eos_token_id",
                                                "pad_token_id",
                                                "dtype",
                                                "torch_dtype",
                                                "transformers_version",
                                                "initializer_range",
                                                "attention_dropout",
                                                "use_cache",
                                                "output_router_logits",
                                                "pretraining_tp",
                                                "first_k_dense_replace",
                                                "intermediate_size",
                                                "kv_lora_rank",
                                                "n_group",
                                                "topk_group",
                                                "qk_nope_head_dim",
                                                "partial_rotary_factor",
                                                "rope_parameters",
                                                "compress_rope_parameters",
                                                "hidden_act",
                                                "tie_word_embeddings",
                                                "attention_bias",
                                                "rope_interleave",
                                                "topk_method",
                                                "expert_dtype",
                                                "experimental_attention_variant",
                                                "enable_hyper_connections",
                                                "quantization_config",
                                                "v_head_dim"};

const std::set<std::string> kYarnKeys = {
    "type", "rope_type", "factor", "original_max_position_embeddings", "beta_fast", "beta_slow"};

[[noreturn]] void bad(const std::string& where, const std::string& key, const std::string& what) {
  throw Error(where + ": key '" + key + "' " + what);
}

// DeepSeek-V4's release: FP8 e4m3 weights in 128x128 blocks with E8M0 (power-of-two) scales, the
// routed experts in MXFP4 when expert_dtype is "fp4". The loader dequantizes exactly that
// (v4/dequant.h); any other scheme would be read wrongly, so it is refused key by key.
const json kDeepSeekV4Quantization = {{"quant_method", "fp8"},
                                      {"fmt", "e4m3"},
                                      {"scale_fmt", "ue8m0"},
                                      {"activation_scheme", "dynamic"},
                                      {"weight_block_size", {128, 128}}};

void check_quantization(const json& j, const std::string& where) {
  if (j.contains("expert_dtype") && !j.at("expert_dtype").is_null() &&
      j.at("expert_dtype") != "fp4" && j.at("expert_dtype") != "fp8")
    bad(where, "expert_dtype", "is " + j.at("expert_dtype").dump() + R"( (allowed: "fp4", "fp8"))");
  if (!j.contains("quantization_config") || j.at("quantization_config").is_null()) return;
  const json& q = j.at("quantization_config");
  const std::string allowed = " (allowed: DeepSeek-V4's " + kDeepSeekV4Quantization.dump() + ")";
  if (!q.is_object()) bad(where, "quantization_config", "is " + q.dump() + allowed);
  for (auto it = q.begin(); it != q.end(); ++it) {
    if (!kDeepSeekV4Quantization.contains(it.key()))
      bad(where, "quantization_config." + it.key(), "is not read" + allowed);
    if (it.value() != kDeepSeekV4Quantization.at(it.key()))
      bad(where, "quantization_config." + it.key(),
          "is " + it.value().dump() + " (allowed: " + kDeepSeekV4Quantization.at(it.key()).dump() +
              ", as DeepSeek-V4 ships)");
  }
  for (auto it = kDeepSeekV4Quantization.begin(); it != kDeepSeekV4Quantization.end(); ++it)
    if (!q.contains(it.key()))
      bad(where, "quantization_config." + it.key(), "is missing" + allowed);
}

// A passthrough key whose value changes the architecture must hold the one value phasekv runs.
void check_passthrough(const json& j, const std::string& where) {
  auto must_be = [&](const char* key, const json& allowed) {
    if (j.contains(key) && j.at(key) != allowed)
      bad(where, key, "is " + j.at(key).dump() + " (allowed: " + allowed.dump() + ")");
  };
  must_be("hidden_act", "silu");
  must_be("tie_word_embeddings", false);
  must_be("attention_bias", false);
  must_be("rope_interleave", true);
  must_be("topk_method", "noaux_tc");
  check_quantization(j, where);
}

YarnConfig read_yarn(const json& j, const std::string& where) {
  YarnConfig y;
  if (!j.contains("rope_scaling")) return y;
  y.source = j.at("rope_scaling");
  if (y.source.is_null()) return y;
  const std::string w = where + ": rope_scaling";
  json_read::check_keys(j.at("rope_scaling"), kYarnKeys, w);
  const json& r = j.at("rope_scaling");
  std::string type = r.value("type", r.value("rope_type", std::string()));
  if (type != "yarn")
    throw Error(w + ": type '" + type + "' is not supported (allowed: yarn, or rope_scaling null)");
  y.enabled = true;
  read(r, "factor", y.factor, w);
  read(r, "original_max_position_embeddings", y.original_max_position_embeddings, w);
  read(r, "beta_fast", y.beta_fast, w);
  read(r, "beta_slow", y.beta_slow, w);
  if (!(y.factor >= 1.0)) bad(w, "factor", fmt::format("is {} (allowed: >= 1)", y.factor));
  if (y.original_max_position_embeddings < 1)
    bad(w, "original_max_position_embeddings", "must be given and >= 1");
  return y;
}

void read_typed(const json& j, V4Config& c, const std::string& w) {
  for_each_scalar(c, [&](const char* key, auto& v) { read(j, key, v, w); });
  if (j.contains("compress_ratios")) {
    const json& r = j.at("compress_ratios");
    if (!r.is_array()) bad(w, "compress_ratios", "must be a list of integers, one per layer");
    c.compress_ratios.clear();
    for (const json& v : r) {
      if (!v.is_number_integer())
        bad(w, "compress_ratios", "holds " + v.dump() + " (allowed: integers 0, or >= 2)");
      c.compress_ratios.push_back(v.get<int64_t>());
    }
  }
  c.rope_scaling = read_yarn(j, w);
}

void require(bool ok, const std::string& where, const std::string& key, const std::string& what) {
  if (!ok) bad(where, key, what);
}

void validate(const V4Config& c, const std::string& w) {
  auto positive = [&](const char* key, int64_t v) {
    require(v >= 1, w, key, fmt::format("is {} (allowed: >= 1)", v));
  };
  positive("vocab_size", c.vocab_size);
  positive("hidden_size", c.hidden_size);
  positive("num_hidden_layers", c.num_hidden_layers);
  positive("num_attention_heads", c.num_attention_heads);
  positive("head_dim", c.head_dim);
  positive("q_lora_rank", c.q_lora_rank);
  positive("o_lora_rank", c.o_lora_rank);
  positive("o_groups", c.o_groups);
  positive("sliding_window", c.sliding_window);
  positive("hc_mult", c.hc_mult);
  positive("hc_sinkhorn_iters", c.hc_sinkhorn_iters);
  positive("n_routed_experts", c.n_routed_experts);
  positive("moe_intermediate_size", c.moe_intermediate_size);
  positive("max_position_embeddings", c.max_position_embeddings);
  require(c.num_key_value_heads == 1, w, "num_key_value_heads",
          fmt::format("is {} (allowed: 1; DeepSeek-V4 has one KV head with K = V)",
                      c.num_key_value_heads));
  require(
      c.qk_rope_head_dim >= 0 && c.qk_rope_head_dim % 2 == 0 && c.qk_rope_head_dim <= c.head_dim, w,
      "qk_rope_head_dim",
      fmt::format("is {} (allowed: even, 0 to head_dim = {})", c.qk_rope_head_dim, c.head_dim));
  require(c.num_attention_heads % c.o_groups == 0, w, "o_groups",
          fmt::format("is {} (allowed: a divisor of num_attention_heads = {})", c.o_groups,
                      c.num_attention_heads));
  require(static_cast<int64_t>(c.compress_ratios.size()) == c.num_hidden_layers, w,
          "compress_ratios",
          fmt::format("has {} entries (allowed: one per layer, num_hidden_layers = {})",
                      c.compress_ratios.size(), c.num_hidden_layers));
  bool any_indexer = false;
  for (int64_t r : c.compress_ratios) {
    require(r == 0 || r >= 2, w, "compress_ratios",
            fmt::format("holds {} (allowed: 0 for a sliding-window layer, or a ratio >= 2)", r));
    any_indexer = any_indexer || r == 4;
  }
  if (any_indexer) {
    positive("index_n_heads", c.index_n_heads);
    positive("index_topk", c.index_topk);
    require(c.index_head_dim >= c.qk_rope_head_dim, w, "index_head_dim",
            fmt::format("is {} (allowed: >= qk_rope_head_dim = {}: the indexer's queries and keys "
                        "rotate their last qk_rope_head_dim dims)",
                        c.index_head_dim, c.qk_rope_head_dim));
  }
  require(c.num_experts_per_tok >= 1 && c.num_experts_per_tok <= c.n_routed_experts, w,
          "num_experts_per_tok",
          fmt::format("is {} (allowed: 1 to n_routed_experts = {})", c.num_experts_per_tok,
                      c.n_routed_experts));
  require(c.n_shared_experts >= 0, w, "n_shared_experts", "must be >= 0");
  require(c.num_hash_layers >= 0 && c.num_hash_layers <= c.num_hidden_layers, w, "num_hash_layers",
          fmt::format("is {} (allowed: 0 to num_hidden_layers = {})", c.num_hash_layers,
                      c.num_hidden_layers));
  require(c.scoring_func == "sqrtsoftplus", w, "scoring_func",
          "is '" + c.scoring_func + "' (allowed: sqrtsoftplus)");
  require(c.rms_norm_eps > 0 && c.hc_eps > 0, w, c.rms_norm_eps > 0 ? "hc_eps" : "rms_norm_eps",
          "must be > 0");
  require(c.rope_theta > 0 && c.compress_rope_theta > 0, w,
          c.rope_theta > 0 ? "compress_rope_theta" : "rope_theta", "must be > 0");
  require(c.num_nextn_predict_layers >= 0, w, "num_nextn_predict_layers", "must be >= 0");
}

}  // namespace

V4Config tiny_config() {
  V4Config c;
  c.passthrough = {{"architectures", {"DeepseekV4ForCausalLM"}}, {"model_type", "deepseek_v4"}};
  return c;
}

V4Config config_from_json(const json& j, const std::string& where) {
  std::set<std::string> allowed = {"compress_ratios", "rope_scaling"};
  V4Config defaults;
  for_each_scalar(defaults, [&](const char* key, auto&) { allowed.insert(key); });
  allowed.insert(kPassthroughKeys.begin(), kPassthroughKeys.end());
  json_read::check_keys(j, allowed, where);
  check_passthrough(j, where);
  V4Config c;
  read_typed(j, c, where);
  validate(c, where);
  for (auto it = j.begin(); it != j.end(); ++it)
    if (kPassthroughKeys.count(it.key())) c.passthrough[it.key()] = it.value();
  return c;
}

json config_to_json(const V4Config& c) {
  json j = c.passthrough;
  for_each_scalar(c, [&](const char* key, const auto& v) { j[key] = v; });
  j["compress_ratios"] = c.compress_ratios;
  YarnConfig as_read;
  if (!c.rope_scaling.source.is_discarded())
    as_read = read_yarn({{"rope_scaling", c.rope_scaling.source}}, "rope_scaling");
  if (!c.rope_scaling.source.is_discarded() && as_read.same_fields(c.rope_scaling))
    j["rope_scaling"] = c.rope_scaling.source;
  else if (c.rope_scaling.enabled)
    j["rope_scaling"] = {
        {"type", "yarn"},
        {"factor", c.rope_scaling.factor},
        {"original_max_position_embeddings", c.rope_scaling.original_max_position_embeddings},
        {"beta_fast", c.rope_scaling.beta_fast},
        {"beta_slow", c.rope_scaling.beta_slow}};
  return j;
}

V4Config read_config(const std::string& path) {
  return config_from_json(read_json_file(path), path);
}

void write_config(const std::string& path, const V4Config& cfg) {
  write_file_atomic(path, config_to_json(cfg).dump(2) + "\n");
}

bool is_v4_config(const json& j) {
  if (!j.is_object()) return false;
  if (j.contains("model_type") && j.at("model_type") == "deepseek_v4") return true;
  if (j.contains("architectures") && j.at("architectures").is_array())
    for (const json& a : j.at("architectures"))
      if (a == "DeepseekV4ForCausalLM") return true;
  return false;
}

bool is_v4_config_file(const std::string& path) {
  try {
    return is_v4_config(read_json_file(path));
  } catch (const std::exception&) {
    return false;
  }
}

int chunked_stride(const V4Config& cfg) {
  std::set<int64_t> ratios;
  for (int64_t r : cfg.compress_ratios)
    if (r > 0) ratios.insert(r);
  return ratios.size() == 1 ? static_cast<int>(*ratios.begin()) : 0;
}

}  // namespace phasekv::v4
