// A DeepSeek-V4 config small enough for gradient checks and sub-second tests, with every component
// switched on: a sliding-window layer, an overlapping ratio-4 layer with its indexer (top-k below
// the entry count), a non-overlapping ratio-8 layer, a hash-routed first layer, a shared expert.
#pragma once
#include <filesystem>
#include <string>

#include "util/error.h"
#include "v4/config.h"
#include "v4/model.h"
#include "v4/model_dir.h"

namespace phasekv::test {

inline v4::V4Config v4_small_config() {
  v4::V4Config c = v4::tiny_config();
  c.vocab_size = 32;
  c.hidden_size = 16;
  c.num_hidden_layers = 3;
  c.num_attention_heads = 4;
  c.head_dim = 8;
  c.qk_rope_head_dim = 4;
  c.q_lora_rank = 8;
  c.o_lora_rank = 4;
  c.o_groups = 2;
  c.compress_ratios = {0, 4, 8};
  c.sliding_window = 6;
  c.index_n_heads = 2;
  c.index_head_dim = 8;
  c.index_topk = 2;
  c.hc_mult = 4;
  c.hc_sinkhorn_iters = 3;
  c.n_routed_experts = 3;
  c.num_experts_per_tok = 2;
  c.n_shared_experts = 1;
  c.moe_intermediate_size = 8;
  c.num_hash_layers = 1;
  c.routed_scaling_factor = 1.5;
  c.swiglu_limit = 1.0;  // low, so that the clamp is active on random weights
  return c;
}

inline v4::V4Model v4_small_model(uint64_t seed, v4::V4Config c = v4_small_config()) {
  v4::V4Model m(std::move(c));
  m.init_random(seed);
  return m;
}

// The message with which load_v4_dir refuses `dir` ("" when it loads).
inline std::string v4_load_error(const std::filesystem::path& dir) {
  try {
    v4::load_v4_dir(dir.string());
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace phasekv::test
