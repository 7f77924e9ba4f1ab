// DeepSeek-V4's configuration, read directly from a Hugging Face config.json written for
// DeepseekV4ForCausalLM (the keys and names are HF's, so a user's real checkpoint directory loads
// as it is). Every key is checked: an unknown key, a value of the wrong type or a combination the
// architecture cannot run throws phasekv::Error naming the file, the key and what is allowed.
// Keys phasekv does not use (token ids, dtype, ...) are kept verbatim and written back, so a
// config read and written again is the same JSON object.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace phasekv::v4 {

// rope_scaling = {"type": "yarn", ...}: YaRN on the compressed layers' RoPE only (DeepSeek's
// reference and llama.cpp both leave the sliding-window layers unscaled).
struct YarnConfig {
  bool enabled = false;
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32.0, beta_slow = 1.0;
  // The value as read (discarded: the key was absent), written back while the fields above still
  // match it, so that "type" vs "rope_type" and null vs absent survive a round trip.
  nlohmann::json source = nlohmann::json(nlohmann::json::value_t::discarded);
  bool same_fields(const YarnConfig& o) const {
    return enabled == o.enabled && factor == o.factor &&
           original_max_position_embeddings == o.original_max_position_embeddings &&
           beta_fast == o.beta_fast && beta_slow == o.beta_slow;
  }
};

struct V4Config {
  int64_t vocab_size = 128;
  int64_t hidden_size = 512;  // d
  int64_t num_hidden_layers = 4;
  int64_t num_attention_heads = 8;  // H query heads; one KV head (K = V)
  int64_t num_key_value_heads = 1;
  int64_t head_dim = 64;          // hd: query, key and value width
  int64_t qk_rope_head_dim = 32;  // rd: RoPE on the last rd dims of each head
  int64_t q_lora_rank = 64;
  int64_t o_lora_rank = 32;
  int64_t o_groups = 8;
  std::vector<int64_t> compress_ratios = {0, 0, 4, 128};  // 0: sliding window only
  double rope_theta = 10000.0;
  double compress_rope_theta = 160000.0;
  YarnConfig rope_scaling;
  int64_t sliding_window = 32;
  int64_t index_n_heads = 64;
  int64_t index_head_dim = 128;
  int64_t index_topk = 512;
  int64_t hc_mult = 4;
  int64_t hc_sinkhorn_iters = 2;
  double hc_eps = 1e-6;
  int64_t n_routed_experts = 2;
  int64_t num_experts_per_tok = 2;
  int64_t n_shared_experts = 1;
  int64_t moe_intermediate_size = 1024;
  std::string scoring_func = "sqrtsoftplus";
  double routed_scaling_factor = 1.0;
  bool norm_topk_prob = true;
  double swiglu_limit = 10.0;  // <= 0: no clamp
  int64_t num_hash_layers = 0;
  double rms_norm_eps = 1e-5;
  int64_t max_position_embeddings = 4096;
  int64_t num_nextn_predict_layers = 0;  // MTP layers: read and kept, not run
  // Keys read for checking only or carried through unchanged (bos_token_id, dtype, ...).
  nlohmann::json passthrough = nlohmann::json::object();

  // The compressor of layer i has two overlapping lanes (and the layer an indexer) iff ratio 4,
  // as in DeepSeek's reference.
  bool overlap(int64_t layer) const { return compress_ratios.at(layer) == 4; }
  bool has_indexer(int64_t layer) const { return compress_ratios.at(layer) == 4; }
  int64_t mix_dim() const { return (2 + hc_mult) * hc_mult; }
};

// The shapes of llama.cpp's tests/test-llama-archs.cpp deepseek4 model (vocab 128, d 512, 8 heads
// of 64, ratios 0,0,4,128, ...): the model the parity check converts.
V4Config tiny_config();

// The model's stride (phasekv's name for the compression ratio, README glossary): the one nonzero
// compress ratio when all compressed layers share it, else 0 (none, or several: unknown, as for
// phasekv's own models with mixed strides; the blind period test finds the period).
int chunked_stride(const V4Config& cfg);

// Throws Error naming `where`, the key and what is allowed.
V4Config config_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json config_to_json(const V4Config& cfg);
V4Config read_config(const std::string& path);
void write_config(const std::string& path, const V4Config& cfg);
// Whether a config.json names DeepseekV4ForCausalLM (architectures) or model_type deepseek_v4.
bool is_v4_config(const nlohmann::json& j);
// is_v4_config of a file; false when it cannot be read or parsed (its own loader says why).
bool is_v4_config_file(const std::string& path);

}  // namespace phasekv::v4
