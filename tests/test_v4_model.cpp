// The DeepSeek-V4 model: checkpoint round trips and named errors, causality, finite-difference
// gradients, and `phasekv init` / `phasekv logits` on a V4 directory.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>

#include "io/safetensors.h"
#include "test_util.h"
#include "test_v4_util.h"
#include "util/error.h"
#include "util/fs.h"
#include "v4/model_dir.h"

namespace phasekv {
namespace {

torch::Tensor tokens_for(int64_t T, int64_t vocab, uint64_t seed) {
  return test::random_tokens(T, vocab, seed).squeeze(0);
}

TEST(V4Model, TestShapesRunAndAreFinite) {
  v4::V4Model m(v4::tiny_config());
  m.init_random(1);
  torch::NoGradGuard g;
  auto logits = m.forward(tokens_for(12, 128, 2));
  EXPECT_EQ(logits.sizes(), (std::vector<int64_t>{12, 128}));
  EXPECT_TRUE(torch::isfinite(logits).all().item<bool>());
}

TEST(V4Model, Causal) {
  v4::V4Model m = test::v4_small_model(3);
  torch::NoGradGuard g;
  const int64_t T = 40;  // 10 ratio-4 entries (top-k 2 of them), 5 ratio-8 entries
  auto a = tokens_for(T, 32, 4);
  auto la = m.forward(a);
  for (int64_t cut : {0, 3, 7, 8, 20, 39}) {
    auto b = a.clone();
    b.narrow(0, cut + 1, T - cut - 1).copy_(tokens_for(T - cut - 1, 32, 100 + cut));
    auto lb = m.forward(b);
    EXPECT_EQ(test::max_abs_diff(la.narrow(0, 0, cut + 1), lb.narrow(0, 0, cut + 1)), 0.0)
        << "cut " << cut;
    if (cut + 1 < T) {
      EXPECT_GT(test::max_abs_diff(la[cut + 1], lb[cut + 1]), 0.0);
    }
  }
}

// Prefill in pieces == the full forward, at every two-piece split and for fixed chunk sizes, in
// f64 (the indexer keeps 2 of up to 10 entries, so a different selection would show).
TEST(V4Model, StreamingEqualsFullAtEverySplit) {
  v4::V4Model m = test::v4_small_model(21);
  m.to(torch::kFloat64);
  torch::NoGradGuard g;
  const int64_t T = 40;
  auto tokens = tokens_for(T, 32, 22);
  auto full = m.forward(tokens);
  auto pieces = [&](const std::vector<int64_t>& cuts) {
    v4::V4Cache cache;
    std::vector<torch::Tensor> out;
    int64_t at = 0;
    for (int64_t cut : cuts) {
      out.push_back(m.forward(tokens.narrow(0, at, cut - at), cache));
      at = cut;
      // The cache holds what later tokens can read, no more.
      for (int64_t i = 0; i < m.cfg.num_hidden_layers; ++i) {
        EXPECT_LE(cache.layers[i].raw_kv.size(0), m.cfg.sliding_window - 1);
        if (m.cfg.compress_ratios[i] > 0) {
          EXPECT_LT(cache.layers[i].entries.kv.size(0), 2 * m.cfg.compress_ratios[i]);
        }
      }
    }
    return torch::cat(out);
  };
  for (int64_t s = 1; s < T; ++s)
    EXPECT_LT(test::max_abs_diff(pieces({s, T}), full), 1e-10) << "split at " << s;
  for (int64_t chunk : {1, 3, 4, 5, 8, 9}) {
    std::vector<int64_t> cuts;
    for (int64_t at = chunk; at < T + chunk; at += chunk) cuts.push_back(std::min(at, T));
    EXPECT_LT(test::max_abs_diff(pieces(cuts), full), 1e-10) << "chunk " << chunk;
  }
}

// Several sequences at once (the training loop's batches): each row is the single-sequence
// forward up to matmul rounding, and the expert loads are the rows' together.
TEST(V4Model, ForwardBatchEqualsRowByRow) {
  v4::V4Model m = test::v4_small_model(17);
  const torch::Tensor tokens = test::random_tokens(3 * 13, 32, 4).view({3, 13});
  torch::NoGradGuard g;
  std::vector<torch::Tensor> loads;
  const torch::Tensor batch = m.forward_batch(tokens, &loads);
  ASSERT_EQ(batch.sizes(), at::IntArrayRef({3, 13, 32}));
  std::vector<torch::Tensor> want_loads(m.cfg.num_hidden_layers);
  for (int64_t b = 0; b < 3; ++b) {
    v4::V4Cache cache;
    const torch::Tensor row = m.forward(tokens[b], cache);
    EXPECT_LT(test::max_abs_diff(batch[b], row), 1e-5) << "row " << b;
    for (size_t i = 0; i < want_loads.size(); ++i)
      if (cache.expert_load[i].defined())
        want_loads[i] =
            want_loads[i].defined() ? want_loads[i] + cache.expert_load[i] : cache.expert_load[i];
  }
  ASSERT_EQ(loads.size(), want_loads.size());
  for (size_t i = 0; i < loads.size(); ++i) {
    ASSERT_EQ(loads[i].defined(), want_loads[i].defined()) << "layer " << i;
    if (loads[i].defined()) {
      EXPECT_TRUE(torch::equal(loads[i], want_loads[i])) << "layer " << i;
    }
  }
  EXPECT_THROW(m.forward_batch(tokens[0]), Error);
}

// The batched attention (attention_forward_batch: windows, overlapping and plain compressors, the
// indexer keeping 2 of up to 10 entries, in one set of ops) against the streaming code path row by
// row, in f64: the same logits and the same gradient for every tensor.
TEST(V4Model, ForwardBatchGradientsEqualRowByRow) {
  v4::V4Model m = test::v4_small_model(23);
  m.to(torch::kFloat64);
  const int64_t B = 3, T = 40;
  const torch::Tensor tokens = test::random_tokens(B * T, 32, 8).view({B, T});
  const torch::Tensor r = torch::randn({B, T, 32}, torch::kFloat64);
  auto grads = [&](bool batched) {
    for (torch::Tensor& t : m.parameters()) t.requires_grad_(true).mutable_grad() = torch::Tensor();
    torch::Tensor logits;
    if (batched) {
      logits = m.forward_batch(tokens);
    } else {
      std::vector<torch::Tensor> rows;
      for (int64_t b = 0; b < B; ++b) rows.push_back(m.forward(tokens[b]));
      logits = torch::stack(rows);
    }
    (logits * r).sum().backward();
    std::map<std::string, torch::Tensor> out{{"logits", logits.detach()}};
    for (const auto& [name, t] : m.tensors)
      if (t.is_floating_point() && t.grad().defined()) out[name] = t.grad().clone();
    return out;
  };
  const auto batched = grads(true), rows = grads(false);
  ASSERT_EQ(batched.size(), rows.size());
  EXPECT_GT(batched.size(), 30u);
  for (const auto& [name, g] : rows) {
    ASSERT_TRUE(batched.count(name)) << name;
    EXPECT_LT(test::max_abs_diff(batched.at(name), g), 1e-10 * (1 + g.abs().max().item<double>()))
        << name;
  }
  for (torch::Tensor& t : m.parameters()) t.requires_grad_(false);
}

// Central differences of sum(logits * R) against autograd, in f64, on a few elements of each kind
// of tensor (the indexer's are left out: selection carries no gradient).
TEST(V4Model, FiniteDifferenceGradients) {
  v4::V4Model m = test::v4_small_model(5);
  m.to(torch::kFloat64);
  auto tokens = tokens_for(18, 32, 6);
  auto R = torch::randn({18, 32}, torch::kFloat64);
  auto loss = [&] { return (m.forward(tokens) * R).sum(); };
  for (auto& t : m.parameters()) t.requires_grad_(true);
  loss().backward();
  const std::vector<std::string> names = {"embed.weight",
                                          "layers.0.hc_attn_fn",
                                          "layers.0.hc_attn_scale",
                                          "layers.1.hc_ffn_base",
                                          "layers.1.attn.wq_a.weight",
                                          "layers.1.attn.wkv.weight",
                                          "layers.1.attn.attn_sink",
                                          "layers.1.attn.compressor.wkv.weight",
                                          "layers.1.attn.compressor.ape",
                                          "layers.2.attn.compressor.wgate.weight",
                                          "layers.2.attn.wo_a.weight",
                                          "layers.2.ffn.experts.1.w1.weight",
                                          "layers.0.ffn.shared_experts.w2.weight",
                                          "layers.2.ffn.gate.weight",
                                          "hc_head_fn",
                                          "norm.weight"};
  auto gen = at::make_generator<at::CPUGeneratorImpl>(12);
  torch::NoGradGuard g;
  for (const auto& name : names) {
    auto& t = m.tensors.at(name);
    auto flat = t.view(-1);
    for (int k = 0; k < 3; ++k) {
      const int64_t i = torch::randint(flat.numel(), {1}, gen).item<int64_t>();
      const double h = 1e-6, x0 = flat[i].item<double>();
      flat[i] = x0 + h;
      const double up = loss().item<double>();
      flat[i] = x0 - h;
      const double down = loss().item<double>();
      flat[i] = x0;
      const double fd = (up - down) / (2 * h), ad = t.grad().view(-1)[i].item<double>();
      EXPECT_NEAR(ad, fd, 1e-5 * std::max(1.0, std::abs(fd))) << name << "[" << i << "]";
    }
  }
}

TEST(V4ModelDir, RoundTripF32AndBf16) {
  v4::V4Model m = test::v4_small_model(13);
  auto tokens = tokens_for(20, 32, 14);
  torch::NoGradGuard g;
  const auto dir = test::temp_dir("v4dir");
  v4::save_v4_dir(dir.string(), m);
  v4::V4Model back = v4::load_v4_dir(dir.string());
  for (const auto& [name, t] : m.tensors)
    EXPECT_TRUE(torch::equal(back.tensors.at(name), t)) << name;
  EXPECT_EQ(v4::config_to_json(back.cfg), v4::config_to_json(m.cfg));
  EXPECT_TRUE(v4::is_v4_model_dir(dir.string()));
  // bf16: every tensor is its bf16 rounding, the tables stay exact.
  const auto dir16 = test::temp_dir("v4dir16");
  v4::save_v4_dir(dir16.string(), m, torch::kBFloat16);
  v4::V4Model b16 = v4::load_v4_dir(dir16.string());
  for (const auto& [name, t] : m.tensors) {
    auto want = t.is_floating_point() ? t.to(torch::kBFloat16).to(torch::kFloat32) : t;
    EXPECT_TRUE(torch::equal(b16.tensors.at(name), want)) << name;
  }
  EXPECT_LT(test::max_abs_diff(b16.forward(tokens), m.forward(tokens)), 0.5);
}

TEST(V4ModelDir, NamedErrors) {
  v4::V4Model m = test::v4_small_model(15);
  const auto dir = test::temp_dir("v4bad");
  v4::save_v4_dir(dir.string(), m);
  const std::string file = (dir / "model.safetensors").string();
  SafetensorsFile f = load_safetensors(file);
  auto rewrite = [&](auto edit) {
    NamedTensors out(f.tensors.begin(), f.tensors.end());
    edit(out);
    save_safetensors(file, out);
  };
  rewrite([](NamedTensors& t) {
    t.erase(std::find_if(t.begin(), t.end(),
                         [](auto& p) { return p.first == "layers.1.attn.compressor.ape"; }));
  });
  EXPECT_CONTAINS(test::v4_load_error(dir),
                  "missing tensor 'layers.1.attn.compressor.ape' (expected shape "
                  "[4, 16])");
  rewrite([](NamedTensors& t) {
    for (auto& [n, x] : t)
      if (n == "layers.1.attn.compressor.ape") x = torch::zeros({4, 8});
  });
  EXPECT_CONTAINS(test::v4_load_error(dir),
                  "'layers.1.attn.compressor.ape' has shape [4, 8] (expected [4, "
                  "16]");
  // MTP tensors and a hash layer's unused selection bias are skipped; anything else is refused.
  rewrite([](NamedTensors& t) {
    t.emplace_back("mtp.0.attn.wkv.weight", torch::zeros({2}));
    t.emplace_back("layers.0.ffn.gate.bias", torch::zeros({3}));
  });
  EXPECT_EQ(test::v4_load_error(dir), "");
  rewrite([](NamedTensors& t) { t.emplace_back("layers.0.attn.wq.weight", torch::zeros({2})); });
  EXPECT_CONTAINS(test::v4_load_error(dir), "unexpected tensor 'layers.0.attn.wq.weight'");
  rewrite([](NamedTensors& t) {
    for (auto& [n, x] : t)
      if (n == "layers.0.ffn.gate.tid2eid") x = torch::full_like(x, 3);
  });
  EXPECT_CONTAINS(test::v4_load_error(dir), "expert ids outside [0, 3)");
}

TEST(V4Cli, InitThenLogits) {
  const auto dir = test::temp_dir("v4cli");
  const std::string bin = PHASEKV_BINARY, model = (dir / "m").string();
  const std::string config = (dir / "config.json").string();
  v4::write_config(config, test::v4_small_config());
  auto init = test::run_command(bin + " init --config " + config + " --out " + model + " --seed 3");
  ASSERT_EQ(init.status, 0) << init.err;
  auto run = test::run_command(bin + " logits --model " + model + " --tokens 1,2,3,4,5 --out " +
                               (dir / "l.json").string());
  ASSERT_EQ(run.status, 0) << run.err;
  auto j = read_json_file((dir / "l.json").string());
  v4::V4Model m = v4::load_v4_dir(model);
  torch::NoGradGuard g;
  auto want = m.forward(torch::tensor({1, 2, 3, 4, 5}, torch::kInt64)).to(torch::kFloat64);
  ASSERT_EQ(j["logits"].size(), 5u);
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t v = 0; v < 32; ++v)
      EXPECT_EQ(j["logits"][t][v].get<double>(), want[t][v].item<double>());
  auto stream = test::run_command(bin + " logits --model " + model +
                                  " --tokens 1,2,3,4,5 --stream --chunk 2");
  ASSERT_EQ(stream.status, 0) << stream.err;
  auto js = nlohmann::json::parse(stream.out);
  EXPECT_EQ(js["mode"], "stream");
  for (int64_t t = 0; t < 5; ++t)
    for (int64_t v = 0; v < 32; ++v)
      EXPECT_NEAR(js["logits"][t][v].get<double>(), want[t][v].item<double>(), 1e-5);
}

}  // namespace
}  // namespace phasekv
