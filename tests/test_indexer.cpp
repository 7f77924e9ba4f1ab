// The CSA indexer and top-k selection (docs/ARCHITECTURE.md section 5, "Indexer"): causal and
// deterministic selection, equality with dense attention when k covers every entry, streaming
// equal to the full forward at every prefill split, and gradients.
#include <gtest/gtest.h>

#include "model/attend_indexed.h"
#include "model/attend_reference.h"
#include "model/attention.h"
#include "model/indexer.h"
#include "model/visibility.h"
#include "runtime/session.h"
#include "test_util.h"
#include "util/error.h"

namespace phasekv {
namespace {

using test::make_model;
using test::max_abs_diff;
using test::random_tokens;

AttentionConfig indexed(int k, int width = 8) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = width;
  a.n_win = 2;
  a.index_topk = k;
  return a;
}

// Random scores for queries [t0, t0 + Tq) (a chunk of a prefill that starts at t0): the selection
// holds min(k, visible) visible entries, never an invisible one, and each selected entry scores
// at least as high as every visible entry left out.
TEST(Indexer, SelectsTheTopKVisibleEntriesAtEveryPositionAndChunk) {
  const int64_t E = 12;
  for (int k : {1, 3, 100}) {
    const auto a = indexed(k);
    for (int64_t t0 : {0, 3, 4, 17, 33}) {
      const int64_t Tq = 15;
      auto q_pos = torch::arange(t0, t0 + Tq, torch::kInt64);
      torch::manual_seed(t0 + k);
      auto scores = torch::randn({2, Tq, E});
      auto sel = select_entries(a, scores, q_pos);
      auto vis = entry_visibility(a, q_pos, 0, E);
      for (int64_t b = 0; b < 2; ++b)
        for (int64_t i = 0; i < Tq; ++i) {
          const int64_t t = t0 + i, visible = std::min(visible_entries(a, t), E);
          auto row = sel[b][i];
          const std::string where =
              "k=" + std::to_string(k) + " t=" + std::to_string(t) + " b=" + std::to_string(b);
          EXPECT_FALSE((row & ~vis[i]).any().item<bool>()) << where << ": invisible entry";
          EXPECT_EQ(row.sum().item<int64_t>(), std::min<int64_t>(k, visible)) << where;
          if (visible > 0 && k < visible) {
            auto s = scores[b][i];
            double lowest_in = s.masked_select(row).min().item<double>();
            double highest_out = s.masked_select(~row & vis[i]).max().item<double>();
            EXPECT_GE(lowest_in, highest_out) << where;
          }
        }
    }
  }
}

// Equal scores (an untrained indexer whose ReLUs are all 0) go to the lower entry index.
TEST(Indexer, BreaksTiesTowardTheLowerEntry) {
  const auto a = indexed(2);
  auto q_pos = torch::arange(0, 40, torch::kInt64);
  auto sel = select_entries(a, torch::zeros({1, 40, 10}), q_pos);
  for (int64_t t = 0; t < 40; ++t) {
    const int64_t visible = std::min<int64_t>(visible_entries(a, t), 10);
    auto expect = torch::arange(10, torch::kInt64) < std::min<int64_t>(2, visible);
    EXPECT_TRUE(torch::equal(sel[0][t], expect)) << "t=" << t;
  }
  // Partial ties: entries 1, 3 and 4 share the top score; k = 2 keeps 1 and 3.
  auto s = torch::tensor({0.5f, 2.0f, 1.0f, 2.0f, 2.0f}).view({1, 1, 5});
  auto one = select_entries(a, s, torch::tensor({int64_t{39}}));
  EXPECT_TRUE(torch::equal(one[0][0], torch::tensor({false, true, false, true, false})));
}

// The streaming core reads each query's gathered top-k entries; it equals the masked reference
// with the same selection for chunks starting at t0 (queries that see fewer than k entries, none,
// a sink, raw keys of earlier chunks, 2 query heads per KV head), and top_entries holds exactly
// select_entries' set.
TEST(Indexer, GatheredTopKEqualsTheMaskedReference) {
  const int64_t B = 2, Hkv = 2, G = 2, hd = 8, E = 12;
  for (bool sink : {false, true})
    for (int k : {1, 3, 100})
      for (int64_t t0 : {0, 5, 33}) {
        auto a = indexed(k);
        a.sink = sink;
        // The raw tokens a streaming chunk holds: the window before it and its own.
        const int64_t Tq = 16, r0 = std::max<int64_t>(0, t0 - a.n_win), R = t0 + Tq - r0;
        torch::manual_seed(100 * k + t0 + sink);
        auto q_pos = torch::arange(t0, t0 + Tq, torch::kInt64);
        auto r_pos = torch::arange(r0, t0 + Tq, torch::kInt64);
        auto q = torch::randn({B, Hkv * G, Tq, hd}), ek = torch::randn({B, Hkv, E, hd});
        auto ev = torch::randn({B, Hkv, E, hd}), rk = torch::randn({B, Hkv, R, hd});
        auto rv = torch::randn({B, Hkv, R, hd}), scores = torch::randn({B, Tq, E});
        auto sk = sink ? torch::randn({Hkv * G}) : torch::Tensor();
        const std::string where = "k=" + std::to_string(k) + " t0=" + std::to_string(t0) +
                                  " sink=" + std::to_string(sink);
        auto top = top_entries(a, scores, q_pos);
        ASSERT_EQ(top.index.size(-1), std::min<int64_t>(k, E)) << where;
        auto mask = select_entries(a, scores, q_pos);
        EXPECT_TRUE(torch::equal(top.valid.sum(-1), mask.sum(-1))) << where;
        EXPECT_TRUE(mask.gather(-1, top.index).eq(top.valid).all().item<bool>()) << where;
        auto ref = attend_reference(a, q, q_pos, ek, ev, rk, rv, r_pos, sk, mask);
        auto got = attend_gathered(a, q, q_pos, ek, ev, rk, rv, r_pos, sk, top);
        EXPECT_LE(max_abs_diff(got, ref), 1e-5) << where;
      }
}

// The layers of `to` get the parameters of `from` they share by name (an indexed model over a
// dense one: everything but the indexer).
void copy_shared(const Decoder& from, Decoder& to) {
  torch::NoGradGuard g;
  auto src = from->named_parameters();
  for (auto& p : to->named_parameters())
    if (auto* s = src.find(p.key())) p.value().copy_(*s);
}

// k at least the number of entries: the indexer selects them all and the layer is the dense one.
// A small k changes the output exactly where a query sees more than k entries.
TEST(Indexer, TopKCoveringEveryEntryEqualsDenseAttention) {
  ModelConfig dense = test::tiny_config(indexed(0));
  dense.n_layers = 1;
  dense.layers.resize(1);
  const int64_t T = 40;
  auto tokens = random_tokens(T, dense.vocab_size, 3);
  auto m_dense = make_model(dense, 7);
  torch::NoGradGuard g;
  auto ref = m_dense->forward(tokens)[0];
  for (int k : {1, 2, static_cast<int>(T / 4), 1000}) {
    ModelConfig cfg = dense;
    cfg.layers[0].index_topk = k;
    auto m = make_model(cfg, 9);
    copy_shared(m_dense, m);
    auto out = m->forward(tokens)[0];
    for (int64_t t = 0; t < T; ++t) {
      const bool all = visible_entries(cfg.layers[0], t) <= k;
      const double diff = max_abs_diff(out[t], ref[t]);
      if (all)
        EXPECT_LE(diff, 1e-5) << "k=" << k << " t=" << t;
      else
        EXPECT_GT(diff, 1e-4) << "k=" << k << " t=" << t << ": the selection changed nothing";
    }
  }
}

// Prefill the first `first` tokens, then feed the rest in one chunk and, separately, token by
// token: every split of the V4-style stack (its top-2 set changes at most entries) equals the
// full forward.
TEST(Indexer, StreamingEqualsFullForwardAtEveryPrefillSplit) {
  const auto cfg = test::v4_style_config();
  auto m = make_model(cfg, 13);
  const int64_t T = 42;
  auto tokens = random_tokens(T, cfg.vocab_size, 5)[0];
  std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + T);
  torch::Tensor full;
  {
    torch::NoGradGuard g;
    full = m->forward(tokens.unsqueeze(0))[0];
  }
  for (int64_t first = 1; first < T; ++first) {
    Session chunked(m), decoded(m);
    auto a = chunked.feed({ids.begin(), ids.begin() + first});
    auto b = chunked.feed({ids.begin() + first, ids.end()});
    EXPECT_LE(max_abs_diff(torch::cat({a, b}), full), 1e-4) << "split " << first;
    std::vector<torch::Tensor> rows{decoded.feed({ids.begin(), ids.begin() + first})};
    for (int64_t t = first; t < T; ++t)
      rows.push_back(decoded.decode(ids[static_cast<size_t>(t)]).unsqueeze(0));
    EXPECT_LE(max_abs_diff(torch::cat(rows), full), 1e-4) << "prefill " << first << " + decode";
  }
}

// A moved grid (grid_offset o > 0) with a top-k below the number of entries: the indexer's
// compressor pools on the layer's grid (entry j from tokens [jS+S-W-o, jS+S-o)) in the full
// forward as in the streaming cache. At S = 3 the full forward of every prefix length T (for
// o = 2, floor((T+o)/S)*S > T at two lengths in three, so keys pooled on the unmoved grid would
// need tokens past T) equals the rows streamed token by token, and every prefill split equals
// the full forward. Shared payloads over two lanes with vector gates (odd k) and per-slot maps
// with scalar gates (even k); the dense twin (top-k covering every entry) must differ, so the
// selection is exercised. Per-KV-head offsets cannot carry an indexer (one selection needs one
// grid: ConfigErrorsNameTheKey).
TEST(Indexer, MovedGridFullForwardEqualsStreamingAtEveryLengthAndSplit) {
  const int64_t T = 20;
  for (int o : {1, 2})
    for (int k : {1, 2, 3, 4}) {
      auto a = indexed(k, k % 2 == 1 ? 6 : 3);
      a.stride = 3;
      a.grid_offset = o;
      a.index_heads = 2;
      a.index_dim = 6;
      if (k % 2 == 1)
        a.gate = GateKind::kVector;
      else
        a.payload = PayloadKind::kPerSlot;
      auto cfg = test::tiny_config(a);
      cfg.rope_dims = 4;
      const std::string where = "o=" + std::to_string(o) + " k=" + std::to_string(k);
      auto m = make_model(cfg, 31);
      auto tokens = random_tokens(T, cfg.vocab_size, 6)[0];
      std::vector<int64_t> ids(tokens.data_ptr<int64_t>(), tokens.data_ptr<int64_t>() + T);
      Session decoded(m);
      std::vector<torch::Tensor> rows;
      for (int64_t t = 0; t < T; ++t) rows.push_back(decoded.decode(ids[static_cast<size_t>(t)]));
      auto streamed = torch::stack(rows);
      torch::Tensor full;
      {
        torch::NoGradGuard g;
        for (int64_t n = 1; n <= T; ++n) {
          try {
            full = m->forward(tokens.narrow(0, 0, n).unsqueeze(0))[0];
          } catch (const Error& e) {
            ADD_FAILURE() << where << " T=" << n << ": " << e.what();
            full = torch::Tensor();
            continue;
          }
          EXPECT_LE(max_abs_diff(full, streamed.narrow(0, 0, n)), 1e-4) << where << " T=" << n;
        }
        if (!full.defined()) continue;  // the throw at T is reported above
        auto dense_cfg = cfg;
        for (auto& l : dense_cfg.layers) l.index_topk = 1000;
        auto dense = make_model(dense_cfg, 31)->forward(tokens.unsqueeze(0))[0];
        EXPECT_GT(max_abs_diff(full, dense), 1e-3) << where << ": the selection changed nothing";
      }
      for (int64_t first = 1; first < T; ++first) {
        Session chunked(m);
        auto x = chunked.feed({ids.begin(), ids.begin() + first});
        auto y = chunked.feed({ids.begin() + first, ids.end()});
        EXPECT_LE(max_abs_diff(torch::cat({x, y}), full), 1e-4) << where << " split " << first;
      }
    }
}

bool is_indexer(const std::string& name) {
  return name.find(".index.") != std::string::npos;
}

// f64 central differences. The output's gradient flows through the selected entries to every
// attention parameter but the indexer's (the selection is piecewise constant: zero gradient and
// zero finite difference); the indexer's loss reaches only the indexer's parameters (its target
// depends on the others, but is detached: their gradient from it is 0).
TEST(Indexer, GradientsMatchFiniteDifferences) {
  const auto cfg = test::v4_style_config();
  auto m = make_model(cfg, 17, torch::kFloat64);
  auto tokens = random_tokens(26, cfg.vocab_size, 2);
  torch::manual_seed(3);
  auto probe = torch::randn({1, 26, cfg.vocab_size}, torch::kFloat64);
  auto output_loss = [&] { return (m->forward(tokens) * probe).sum(); };
  auto indexer_loss = [&] {
    m->hidden(tokens);
    return m->index_loss();
  };
  m->train();
  for (bool index_side : {false, true}) {
    auto loss_fn = [&] { return index_side ? indexer_loss() : output_loss(); };
    m->zero_grad();
    auto l = loss_fn();
    ASSERT_TRUE(l.defined());
    l.backward();
    int checked = 0;
    for (auto& item : m->named_parameters()) {
      const auto& name = item.key();
      if (name.find("layers.1.attn.") == std::string::npos) continue;  // the indexed layer
      auto p = item.value();
      auto flat = p.view({-1});
      const bool own = is_indexer(name) == index_side;
      const auto grad = p.grad().defined() ? p.grad().view({-1}) : torch::zeros_like(flat);
      for (int64_t idx : {int64_t{0}, flat.numel() / 2, flat.numel() - 1}) {
        const std::string where =
            (index_side ? "index loss " : "output ") + name + "[" + std::to_string(idx) + "]";
        if (!own) {
          EXPECT_EQ(grad[idx].item<double>(), 0.0) << where;
          if (index_side) continue;  // the detached target moves: no finite difference to match
        }
        const double eps = 1e-6, orig = flat[idx].item<double>();
        auto set = [&](double v) {
          torch::NoGradGuard g;
          flat[idx] = v;
        };
        set(orig + eps);
        const double up = loss_fn().item<double>();
        set(orig - eps);
        const double down = loss_fn().item<double>();
        set(orig);
        const double fd = (up - down) / (2 * eps), an = grad[idx].item<double>();
        EXPECT_NEAR(an, fd, 1e-6 + 1e-5 * std::abs(fd)) << where;
        ++checked;
      }
    }
    EXPECT_GT(checked, index_side ? 8 : 20);
  }
  // Grad mode off or evaluation mode: no indexer loss is computed.
  m->eval();
  m->hidden(tokens);
  EXPECT_FALSE(m->index_loss().defined());
}

// The indexer's own cache (keys only, one head of width index_dim) is part of the layer's bytes
// (Streaming.CacheBytesMatchTheoryAndStayBounded checks the session holds exactly these).
TEST(Indexer, CacheBytesIncludeTheIndexerKeys) {
  const auto cfg = test::v4_style_config();
  const auto& csa = cfg.layers[1];
  auto with = cache_bytes_theory(cfg, csa, 4096, 4);
  auto dense = csa;
  dense.index_topk = 0;
  auto without = cache_bytes_theory(cfg, dense, 4096, 4);
  // 1024 entries of index_dim f32 keys, and the indexer's pending tokens.
  EXPECT_EQ(with.entries - without.entries, 1024 * csa.index_dim * 4);
  EXPECT_GT(with.pending, without.pending);
}

TEST(Indexer, ConfigErrorsNameTheKey) {
  auto parse = [](nlohmann::json layer) {
    nlohmann::json j = {{"n_layers", 1}, {"layers", {layer}}};
    try {
      model_config_from_json(j, "cfg.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  nlohmann::json ch = {{"kind", "chunked"}, {"stride", 4}, {"width", 8}, {"index_topk", 2}};
  EXPECT_EQ(parse(ch), "");
  EXPECT_CONTAINS(parse({{"kind", "full"}, {"index_topk", 2}}),
                  "layers[0]: 'index_topk' applies to chunked layers only");
  auto bad = ch;
  bad["index_topk"] = -1;
  EXPECT_CONTAINS(parse(bad), "'index_topk' must be >= 0");
  bad = ch;
  bad["index_dim"] = 7;
  EXPECT_CONTAINS(parse(bad), "'index_dim' must be an even number >= 2");
  bad = ch;
  bad["index_heads"] = 0;
  EXPECT_CONTAINS(parse(bad), "'index_heads' must be >= 1");
  bad = ch;
  bad["kv_head_offsets"] = {1};
  EXPECT_CONTAINS(parse(bad), "needs one grid: remove 'kv_head_offsets'");
  // Written back (with its indexer's shape) only when indexed.
  auto c = model_config_from_json({{"n_layers", 1}, {"layers", {ch}}}, "cfg.json");
  auto j = model_config_to_json(c);
  EXPECT_EQ(j["layers"][0]["index_topk"], 2);
  EXPECT_EQ(j["layers"][0]["index_dim"], 16);
  ch["index_topk"] = 0;
  c = model_config_from_json({{"n_layers", 1}, {"layers", {ch}}}, "cfg.json");
  EXPECT_FALSE(model_config_to_json(c)["layers"][0].contains("index_topk"));
}

}  // namespace
}  // namespace phasekv
