// Shared helpers for the model tests: tiny configs for every attention variant.
#pragma once
#include <string>
#include <vector>

#include "config/model_config.h"
#include "model/decoder.h"
#include "train/tasks.h"

namespace phasekv::test {

inline ModelConfig tiny_config(const AttentionConfig& a, int n_kv_heads = 2) {
  ModelConfig c;
  c.vocab_size = 32;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = 8;
  c.d_ff = 48;
  c.max_context = 512;
  c.layers.assign(2, a);
  return c;
}

// A small key-value task: vocabulary 5 + 8 + 8 + 8 = 29, 3 records, 24 tokens; a sweep context
// is context_len - 1 + M - 1 = 22 + M tokens.
inline TaskConfig small_kv_task() {
  TaskConfig c;
  c.n_keys = 8;
  c.n_values = 8;
  c.n_filler = 8;
  c.n_records = 3;
  c.context_len = 24;
  return c;
}

// A tiny chunked model (S = W = 4, n_win 1) over small_kv_task()'s vocabulary.
inline ModelConfig small_kv_model_config(int max_context) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 1;
  ModelConfig cfg = tiny_config(a);
  cfg.vocab_size = task_vocab(small_kv_task()).vocab_size();
  cfg.max_context = max_context;
  return cfg;
}

struct Variant {
  std::string name;
  ModelConfig cfg;
};

// Every attention variant the engine supports, each in a tiny 2-layer model.
inline std::vector<Variant> all_variants() {
  std::vector<Variant> v;
  AttentionConfig full;
  v.push_back({"full", tiny_config(full)});
  AttentionConfig win;
  win.kind = AttentionKind::kWindow;
  win.n_win = 3;
  v.push_back({"window3", tiny_config(win)});
  for (GateKind g : {GateKind::kScalar, GateKind::kVector, GateKind::kMean}) {
    for (int width : {4, 8}) {
      AttentionConfig a;
      a.kind = AttentionKind::kChunked;
      a.stride = 4;
      a.width = width;
      a.gate = g;
      a.n_win = 1;
      v.push_back({"chunked_" + to_string(g) + "_W" + std::to_string(width), tiny_config(a)});
    }
  }
  AttentionConfig c;
  c.kind = AttentionKind::kChunked;
  c.stride = 4;
  c.width = 4;
  auto add = [&](const std::string& name, AttentionConfig a, int kv = 2) {
    v.push_back({name, tiny_config(a, kv)});
  };
  {
    auto a = c;
    a.n_win = 0;
    add("chunked_nwin0", a);
  }
  {
    auto a = c;
    a.n_win = 5;
    a.sink = true;
    add("chunked_sink_nwin5", a);
  }
  {
    auto a = c;
    a.uncompressed_tail = true;
    a.n_win = 0;
    add("chunked_tail", a);
  }
  {
    auto a = c;
    a.gate_bias = false;
    a.tied_kv_gates = true;
    add("chunked_nobias_tied", a);
  }
  {
    auto a = c;
    a.entry_norm = false;
    a.entry_rope = EntryRope::kNone;
    add("chunked_nonorm_norope", a);
  }
  {
    auto a = c;
    a.entry_rope = EntryRope::kPrev;
    a.n_win = 2;
    add("chunked_rope_prev", a);
  }
  {
    // q/k/v projection biases (Qwen2 style), also on the lane >= 1 projections of W = 2S.
    auto a = c;
    a.width = 8;
    auto cfg = tiny_config(a);
    cfg.qkv_bias = true;
    v.push_back({"chunked_W8_qkv_bias", cfg});
    auto f = tiny_config(AttentionConfig{});
    f.qkv_bias = true;
    v.push_back({"full_qkv_bias", f});
  }
  {
    auto a = c;
    a.entry_rope = EntryRope::kLast;
    add("chunked_rope_last", a, 1);
  }
  {
    auto a = c;
    a.stride = 6;
    a.width = 8;
    a.gate = GateKind::kVector;
    add("chunked_W8S6_vector", a);
  }
  {
    auto a = c;
    a.stride = 3;
    a.width = 9;
    add("chunked_W9S3_3lanes", a, 4);
  }
  {
    auto a = c;
    auto cfg = tiny_config(a);
    cfg.layers[0] = AttentionConfig{};  // hybrid: full then chunked
    cfg.rope_dims = 4;                  // partial RoPE
    cfg.qk_norm = false;
    v.push_back({"hybrid_partial_rope_noqknorm", cfg});
  }
  return v;
}

inline Decoder make_model(const ModelConfig& cfg, uint64_t seed,
                          torch::ScalarType dtype = torch::kFloat32) {
  torch::manual_seed(seed);
  Decoder m(cfg);
  m->init_weights(seed);
  // Non-zero biases and sinks so the tests exercise them (init leaves them at 0).
  torch::NoGradGuard g;
  for (auto& p : m->named_parameters()) {
    const std::string& k = p.key();
    const bool proj_bias = k.size() > 5 && k.compare(k.size() - 5, 5, ".bias") == 0;
    if (proj_bias || k.find(".bias_") != std::string::npos || k.find(".sink") != std::string::npos)
      p.value().copy_(torch::randn(p.value().sizes()) * 0.5);
  }
  m->to(dtype);
  m->eval();
  return m;
}

inline torch::Tensor random_tokens(int64_t T, int64_t vocab, uint64_t seed) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(seed);
  return torch::randint(vocab, {1, T}, gen, torch::kInt64);
}

}  // namespace phasekv::test
