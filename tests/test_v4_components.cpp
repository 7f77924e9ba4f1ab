// DeepSeek-V4's components against small cases worked out by hand or by an independent loop.
#include <gtest/gtest.h>

#include <cmath>

#include "test_util.h"
#include "test_v4_util.h"
#include "v4/attention.h"
#include "v4/compressor.h"
#include "v4/hyper.h"
#include "v4/moe.h"
#include "v4/rope.h"

namespace phasekv {
namespace {

TEST(V4Sinkhorn, RowsAndColumnsSumToOne) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(3);
  auto c = torch::randn({5, 4, 4}, gen, torch::kFloat64) * 3;
  auto m = v4::hc_sinkhorn(c, 300, 1e-9);
  EXPECT_LT(test::max_abs_diff(m.sum(-2), torch::ones({5, 4})), 1e-8);  // columns, last step
  EXPECT_LT(test::max_abs_diff(m.sum(-1), torch::ones({5, 4})), 1e-6);  // rows, converged
  EXPECT_GT(m.min().item<double>(), 0.0);
}

TEST(V4Sinkhorn, OneIterationByHand) {
  // softmax over each row (dst), + eps, then each column divided by its sum + eps.
  auto c = torch::tensor({0.0, std::log(3.0), 0.0, 0.0}, torch::kFloat64).view({1, 2, 2});
  auto m = v4::hc_sinkhorn(c, 1, 0.0);
  // rows after softmax: [1/4, 3/4], [1/2, 1/2]; column sums 3/4 and 5/4.
  auto want = torch::tensor({(0.25) / 0.75, 0.75 / 1.25, 0.5 / 0.75, 0.5 / 1.25}, torch::kFloat64);
  EXPECT_LT(test::max_abs_diff(m.flatten(), want), 1e-12);
}

TEST(V4Rope, InterleavedPairsOnTheLastDims) {
  v4::RopeParams p;
  p.dims = 2;
  p.base = 10000.0f;
  auto x = torch::tensor({1.0, 2.0, 1.0, 0.0}, torch::kFloat64).view({1, 4});
  auto y = v4::rope_apply(x, v4::rope_table(p, {1}, torch::kFloat64));
  // Position 1, pair 0: angle 1 rad on (x2, x3) = (1, 0); the first two dims carry no position.
  auto want =
      torch::tensor({1.0, 2.0, double(std::cos(1.0f)), double(std::sin(1.0f))}, torch::kFloat64);
  EXPECT_LT(test::max_abs_diff(y.flatten(), want), 1e-7);
  auto x4 = torch::randn({3, 2, 8}, torch::kFloat64);
  p.dims = 4;
  auto t = v4::rope_table(p, {0, 5, 700}, torch::kFloat64);
  EXPECT_LT(test::max_abs_diff(v4::rope_apply(v4::rope_apply(x4, t), t, true), x4), 1e-6);
}

TEST(V4Rope, YarnRampBetweenExtrapolationAndInterpolation) {
  v4::V4Config c = v4::tiny_config();
  c.qk_rope_head_dim = 64;
  c.rope_scaling.enabled = true;
  c.rope_scaling.factor = 16;
  c.rope_scaling.original_max_position_embeddings = 65536;
  const v4::RopeParams p = v4::layer_rope(c, 2);  // a compressed layer
  EXPECT_FLOAT_EQ(p.base, 160000.0f);
  EXPECT_FLOAT_EQ(p.freq_scale, 1.0f / 16);
  EXPECT_EQ(v4::layer_rope(c, 0).ext_factor, 0.0f);  // sliding-window layers: no YaRN
  auto t = v4::rope_table(p, {1000}, torch::kFloat64);
  auto angle = torch::atan2(t.sin, t.cos).flatten();
  // Pair 0 (fastest) extrapolates: angle = 1000 mod 2 pi; the slowest pair interpolates:
  // 1000 * base^(-62/64) / 16.
  EXPECT_NEAR(angle[0].item<double>(), std::remainder(1000.0, 2 * M_PI), 1e-3);
  EXPECT_NEAR(angle[31].item<double>(), 1000.0 * std::pow(160000.0, -62.0 / 64) / 16, 1e-5);
  // A pure rotation: the magnitude factor cancels.
  EXPECT_LT(test::max_abs_diff(t.cos.pow(2) + t.sin.pow(2), torch::ones({1, 32})), 1e-6);
}

TEST(V4Compressor, VisibleFromTheTokenCompletingTheBlock) {
  auto v = v4::entry_visible(0, 9, 2, 4);
  for (int64_t t = 0; t < 9; ++t)
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_EQ(v[t][j].item<bool>(), t >= 4 * j + 3) << "t=" << t << " j=" << j;
}

// Entries computed by a plain loop over blocks, slots and channels, rope off.
torch::Tensor entries_by_loop(const torch::Tensor& y, const v4::CompressorWeights& w, int64_t r,
                              bool overlap) {
  const int64_t width = w.norm.size(0), n = y.size(0) / r;
  auto kv = torch::matmul(y, w.wkv.t());
  auto g = torch::matmul(y, w.wgate.t());
  auto out = torch::zeros({n, width}, torch::kFloat64);
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < width; ++ch) {
      std::vector<std::pair<double, double>> slots;  // (gate, value)
      for (int64_t s = 0; s < r; ++s) {
        const int64_t t = b * r + s, own = overlap ? width + ch : ch;
        slots.push_back(
            {g[t][own].item<double>() + w.ape[s][own].item<double>(), kv[t][own].item<double>()});
        if (overlap && b > 0)
          slots.push_back({g[t - r][ch].item<double>() + w.ape[s][ch].item<double>(),
                           kv[t - r][ch].item<double>()});
      }
      double mx = -1e300, z = 0, acc = 0;
      for (auto& s : slots) mx = std::max(mx, s.first);
      for (auto& s : slots) z += std::exp(s.first - mx), acc += std::exp(s.first - mx) * s.second;
      out[b][ch] = acc / z;
    }
  return v4::rms_norm(out, 1e-6, w.norm);
}

v4::CompressorWeights random_compressor(int64_t d, int64_t width, int64_t r, int64_t lanes) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(11);
  auto o = torch::kFloat64;
  return {torch::randn({lanes * width, d}, gen, o), torch::randn({lanes * width, d}, gen, o),
          torch::randn({r, lanes * width}, gen, o), torch::rand({width}, gen, o) + 0.5};
}

TEST(V4Compressor, OverlapAndBlockZeroByLoop) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(5);
  auto y = torch::randn({14, 6}, gen, torch::kFloat64);
  v4::RopeParams no_rope;  // dims 0
  for (bool overlap : {true, false}) {
    const int64_t r = overlap ? 4 : 3;
    auto w = random_compressor(6, 5, r, overlap ? 2 : 1);
    auto got = v4::compress_entries(y, w, r, overlap, no_rope, 1e-6);
    ASSERT_EQ(got.size(0), 14 / r);
    EXPECT_LT(test::max_abs_diff(got, entries_by_loop(y, w, r, overlap)), 1e-10) << overlap;
  }
  // Block 0's previous half is empty: entry 0 ignores everything but tokens 0..3's second lane.
  auto w = random_compressor(6, 5, 4, 2);
  auto a = v4::compress_entries(y, w, 4, true, no_rope, 1e-6);
  auto y2 = y.clone();
  y2.narrow(0, 4, 10).zero_();
  auto b = v4::compress_entries(y2, w, 4, true, no_rope, 1e-6);
  EXPECT_LT(test::max_abs_diff(a[0], b[0]), 1e-12);
  EXPECT_GT(test::max_abs_diff(a[1], b[1]), 1e-3);
}

TEST(V4Compressor, EntriesRotatedAtTheirBlockStart) {
  auto gen = at::make_generator<at::CPUGeneratorImpl>(6);
  auto y = torch::randn({8, 6}, gen, torch::kFloat64);
  auto w = random_compressor(6, 4, 4, 2);
  v4::RopeParams rope;
  rope.dims = 2;
  rope.base = 100.0f;
  auto plain = v4::compress_entries(y, w, 4, true, v4::RopeParams{}, 1e-6);
  auto rotated = v4::compress_entries(y, w, 4, true, rope, 1e-6);
  auto want = v4::rope_apply(plain, v4::rope_table(rope, {0, 4}, torch::kFloat64));
  EXPECT_LT(test::max_abs_diff(rotated, want), 1e-12);
}

TEST(V4Indexer, TopKPicksTheBestVisibleEntries) {
  v4::V4Model m = test::v4_small_model(7);
  m.to(torch::kFloat64);
  const auto& c = m.cfg;
  const int64_t T = 30, layer = 1;  // ratio 4: 7 entries
  auto gen = at::make_generator<at::CPUGeneratorImpl>(8);
  auto y = torch::randn({T, c.hidden_size}, gen, torch::kFloat64);
  auto qr = torch::randn({T, c.q_lora_rank}, gen, torch::kFloat64);
  auto visible = v4::entry_visible(0, T, T / 4, 4);
  v4::CompressorCache keys_cache;
  auto picked = v4::indexer_select(c, m.tensors, layer, y, qr, 0, visible, keys_cache);
  // The scores, recomputed from the definition.
  const v4::RopeParams rope = v4::layer_rope(c, layer);
  auto keys = v4::compress_entries(y,
                                   {m.tensors.at("layers.1.attn.indexer.compressor.wkv.weight"),
                                    m.tensors.at("layers.1.attn.indexer.compressor.wgate.weight"),
                                    m.tensors.at("layers.1.attn.indexer.compressor.ape"),
                                    m.tensors.at("layers.1.attn.indexer.compressor.norm.weight")},
                                   4, true, rope, c.rms_norm_eps);
  std::vector<int64_t> pos(T);
  for (int64_t t = 0; t < T; ++t) pos[t] = t;
  auto q = v4::rope_apply(torch::matmul(qr, m.tensors.at("layers.1.attn.indexer.wq_b.weight").t())
                              .view({T, c.index_n_heads, c.index_head_dim}),
                          v4::rope_table(rope, pos, torch::kFloat64));
  auto hw = torch::matmul(y, m.tensors.at("layers.1.attn.indexer.weights_proj.weight").t());
  for (int64_t t = 0; t < T; ++t) {
    const int64_t n_vis = (t + 1) / 4;
    std::vector<std::pair<double, int64_t>> scores;
    for (int64_t j = 0; j < n_vis; ++j) {
      double s = 0;
      for (int64_t h = 0; h < c.index_n_heads; ++h)
        s += std::max(0.0, q[t][h].dot(keys[j]).item<double>()) * hw[t][h].item<double>();
      scores.push_back({s, j});
    }
    std::sort(scores.rbegin(), scores.rend());
    const int64_t k = std::min<int64_t>(c.index_topk, n_vis);
    EXPECT_EQ(picked[t].sum().item<int64_t>(), k) << "t=" << t;
    // Ties (relu zeros) may be broken either way: compare the picked scores with the best k.
    std::vector<double> got;
    for (const auto& [score, j] : scores)
      if (picked[t][j].item<bool>()) got.push_back(score);
    ASSERT_EQ(static_cast<int64_t>(got.size()), k) << "t=" << t;
    for (int64_t i = 0; i < k; ++i) EXPECT_NEAR(got[i], scores[i].first, 1e-9) << "t=" << t;
  }
}

TEST(V4Moe, HashLayersRouteByTheTable) {
  v4::V4Model m = test::v4_small_model(9);
  auto& table = m.tensors.at("layers.0.ffn.gate.tid2eid");
  auto tokens = torch::tensor({3, 17, 3, 30}, torch::kInt64);
  auto y = torch::randn({4, m.cfg.hidden_size});
  const v4::Routing r = v4::moe_route(m.cfg, m.tensors, 0, y, tokens);
  EXPECT_TRUE(torch::equal(r.experts, table.index_select(0, tokens)));
  // Weights: the chosen experts' sqrt-softplus scores, normalised, times the scaling factor.
  auto s =
      torch::sqrt(torch::softplus(torch::matmul(y, m.tensors.at("layers.0.ffn.gate.weight").t())));
  auto chosen = s.gather(1, r.experts);
  EXPECT_LT(test::max_abs_diff(r.weights, chosen / chosen.sum(1, true) * 1.5), 1e-6);
  // Rewriting the table reroutes the token.
  table[17] = torch::tensor({2, 0}, torch::kInt64);
  EXPECT_TRUE(torch::equal(v4::moe_route(m.cfg, m.tensors, 0, y, tokens).experts[1],
                           torch::tensor({2, 0}, torch::kInt64)));
}

TEST(V4Moe, SelectionBiasChoosesButDoesNotWeigh) {
  v4::V4Model m = test::v4_small_model(10);
  auto y = torch::randn({5, m.cfg.hidden_size});
  auto tokens = torch::zeros({5}, torch::kInt64);
  m.tensors.at("layers.2.ffn.gate.bias").copy_(torch::tensor({0.0, 100.0, 100.0}));
  const v4::Routing r = v4::moe_route(m.cfg, m.tensors, 2, y, tokens);
  auto sorted = std::get<0>(r.experts.sort(1));
  EXPECT_TRUE(torch::equal(sorted, torch::tensor({1, 2}).repeat({5, 1})));
  EXPECT_LT(test::max_abs_diff(r.weights.sum(1), torch::full({5}, 1.5)), 1e-6);
}

TEST(V4Moe, ClampedSwiglu) {
  v4::TensorMap w;
  w["e.w1.weight"] = torch::tensor({{1.0}, {1.0}}, torch::kFloat64);
  w["e.w3.weight"] = torch::tensor({{1.0}, {-1.0}}, torch::kFloat64);
  w["e.w2.weight"] = torch::tensor({{1.0, 0.0}}, torch::kFloat64);  // the first unit alone
  auto y = torch::tensor({{5.0}}, torch::kFloat64);
  // Limit 2: gate min(5, 2) = 2, up clamp(5, -2, 2) = 2. Limit 0: no clamp.
  const double silu2 = 2.0 / (1.0 + std::exp(-2.0));
  EXPECT_NEAR(v4::swiglu_ffn(w, "e.", y, 2.0).item<double>(), silu2 * 2.0, 1e-12);
  const double silu5 = 5.0 / (1.0 + std::exp(-5.0));
  EXPECT_NEAR(v4::swiglu_ffn(w, "e.", y, 0.0).item<double>(), silu5 * 5.0, 1e-12);
}

}  // namespace
}  // namespace phasekv
