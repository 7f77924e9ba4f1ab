// attend_fast against attend_reference (the specification): outputs and gradients for every
// attention variant, whole models on both paths, and the bf16 autocast path.
#include <gtest/gtest.h>
#include <torch/csrc/autograd/function.h>

#include <set>
#include <string>
#include <vector>

#include "model/attend_fast.h"
#include "model/attend_reference.h"
#include "model/precision.h"
#include "test_util.h"

namespace phasekv {
namespace {

using test::all_variants;
using test::make_model;
using test::random_tokens;
using test::tiny_config;

using test::max_abs_diff;

double rel_error(const torch::Tensor& approx, const torch::Tensor& exact) {
  auto e = exact.to(torch::kFloat64);
  return ((approx.to(torch::kFloat64) - e).norm() / e.norm()).item<double>();
}

struct Case {
  std::string name;
  AttentionConfig a;
  int64_t n_kv;
};

// The attention configurations of all_variants(), plus the corners of the band: window and tail
// together, n_win wider than the sequence, a sink on queries that see nothing, every GQA group.
std::vector<Case> attention_cases() {
  std::vector<Case> cases;
  for (const auto& v : all_variants()) {
    for (size_t l = 0; l < v.cfg.layers.size(); ++l) {
      if (l > 0 && describe(v.cfg.layers[l]) == describe(v.cfg.layers[0])) continue;
      // The cores see one grid: a layer with per-KV-head grids is one case per grid group.
      for (const GridGroup& g : grid_groups(v.cfg, v.cfg.layers[l]))
        cases.push_back({v.name + "/layer" + std::to_string(l) + "/heads" +
                             std::to_string(g.head0),
                         g.attn, g.heads});
    }
  }
  AttentionConfig c;
  c.kind = AttentionKind::kChunked;
  c.stride = 4;
  c.width = 8;
  auto add = [&](const std::string& name, auto edit, int64_t n_kv = 2) {
    auto a = c;
    edit(a);
    cases.push_back({name, a, n_kv});
  };
  add("tail_nwin1", [](AttentionConfig& a) {
    a.uncompressed_tail = true;
    a.n_win = 1;
  });
  add("tail_nwin5_sink", [](AttentionConfig& a) {
    a.uncompressed_tail = true;
    a.n_win = 5;
    a.sink = true;
  });
  add("tail_S3_nwin2", [](AttentionConfig& a) {
    a.uncompressed_tail = true;
    a.stride = 3;
    a.width = 3;
    a.n_win = 2;
  });
  add("nwin0_sink_sees_nothing", [](AttentionConfig& a) {
    a.n_win = 0;
    a.sink = true;
  });
  add("nwin100_wider_than_T", [](AttentionConfig& a) { a.n_win = 100; });
  add("S1", [](AttentionConfig& a) {
    a.stride = 1;
    a.width = 1;
    a.n_win = 1;
  });
  for (int64_t kv : {1, 4}) {
    add(
        "gqa_kv" + std::to_string(kv),
        [](AttentionConfig& a) {
          a.n_win = 5;
          a.sink = true;
        },
        kv);
  }
  for (int n : {0, 1, 5, 100}) {
    AttentionConfig w;
    w.kind = AttentionKind::kWindow;
    w.n_win = n;
    cases.push_back({"window" + std::to_string(n), w, 2});
  }
  AttentionConfig f;
  cases.push_back({"full_kv1", f, 1});
  f.sink = true;
  cases.push_back({"full_sink", f, 4});
  return cases;
}

// Random inputs of one attend call in the training layout (positions 0..T-1).
struct Inputs {
  torch::Tensor q, pos, ek, ev, rk, rv, sink;
  std::vector<torch::Tensor> leaves() const {
    std::vector<torch::Tensor> out;
    for (const auto* t : {&q, &ek, &ev, &rk, &rv, &sink})
      if (t->defined()) out.push_back(*t);
    return out;
  }
};

bool uses_raw(const AttentionConfig& a) {
  return a.kind != AttentionKind::kChunked || a.n_win > 0 || a.uncompressed_tail;
}

Inputs make_inputs(const AttentionConfig& a, int64_t n_kv, int64_t T, uint64_t seed,
                   torch::ScalarType dtype = torch::kFloat32) {
  const int64_t B = 2, H = 4, hd = 8;
  torch::manual_seed(seed);
  auto opts = torch::TensorOptions().dtype(dtype).requires_grad(true);
  Inputs in;
  in.q = torch::randn({B, H, T, hd}, opts);
  in.pos = torch::arange(T, torch::kInt64);
  if (a.kind == AttentionKind::kChunked) {
    in.ek = torch::randn({B, n_kv, T / a.stride, hd}, opts);
    in.ev = torch::randn({B, n_kv, T / a.stride, hd}, opts);
  }
  if (uses_raw(a)) {
    in.rk = torch::randn({B, n_kv, T, hd}, opts);
    in.rv = torch::randn({B, n_kv, T, hd}, opts);
  }
  if (a.sink) in.sink = torch::randn({H}, opts);
  return in;
}

// attend_reference with attend_fast's signature (no entry selection, no entry mass).
torch::Tensor reference(const AttentionConfig& a, const torch::Tensor& q, const torch::Tensor& q_pos,
                        const torch::Tensor& ek, const torch::Tensor& ev, const torch::Tensor& rk,
                        const torch::Tensor& rv, const torch::Tensor& r_pos,
                        const torch::Tensor& sink) {
  return attend_reference(a, q, q_pos, ek, ev, rk, rv, r_pos, sink);
}

template <typename Fn>
torch::Tensor run(Fn attend_fn, const AttentionConfig& a, const Inputs& in) {
  return attend_fn(a, in.q, in.pos, in.ek, in.ev, in.rk, in.rv, in.pos, in.sink);
}

// Gradients of sum(out * probe) with respect to every input.
std::vector<torch::Tensor> grads(const torch::Tensor& out, const Inputs& in) {
  torch::manual_seed(17);
  auto probe = torch::randn(out.sizes(), out.options().requires_grad(false));
  auto leaves = in.leaves();
  return torch::autograd::grad({(out * probe).sum()}, leaves, {}, false, false, true);
}

// Forward and input gradients of attend_fast against attend_reference on one input set.
void expect_matches_reference(const AttentionConfig& a, const Inputs& in,
                              const std::string& where) {
  auto ref = run(reference, a, in);
  auto fast = run(attend_fast, a, in);
  ASSERT_EQ(fast.sizes(), ref.sizes()) << where;
  EXPECT_LE(max_abs_diff(fast, ref), 1e-5) << where;
  EXPECT_FALSE(fast.isnan().any().item<bool>()) << where;
  if (!ref.requires_grad()) return;  // no keys at all: constant zeros on both paths
  auto g_ref = grads(ref, in);
  if (!fast.requires_grad()) {
    // Nothing visible (window n_win = 0): the fast path returns constant zeros where the
    // reference multiplies by zero weights, so its gradients must all be zero.
    for (const auto& g : g_ref) {
      if (g.defined()) {
        EXPECT_EQ(g.abs().max().item<double>(), 0.0) << where;
      }
    }
    return;
  }
  auto g_fast = grads(fast, in);
  for (size_t i = 0; i < g_ref.size(); ++i) {
    if (!g_ref[i].defined() || !g_fast[i].defined()) {
      EXPECT_EQ(g_ref[i].defined(), g_fast[i].defined()) << where << " grad " << i;
      continue;
    }
    EXPECT_LE(max_abs_diff(g_fast[i], g_ref[i]), 1e-5) << where << " grad " << i;
    EXPECT_FALSE(g_fast[i].isnan().any().item<bool>()) << where << " grad " << i;
  }
}

TEST(AttendFast, MatchesReferenceAndGradientsForEveryVariant) {
  int compared = 0;
  for (const auto& c : attention_cases()) {
    // 50: the blocked band pads the last query block.
    for (int64_t T : {1, 3, 17, 50, 64}) {
      auto in = make_inputs(c.a, c.n_kv, T, static_cast<uint64_t>(T) * 31 + 7);
      expect_matches_reference(c.a, in, c.name + " T=" + std::to_string(T));
      ++compared;
    }
  }
  EXPECT_GT(compared, 100);
}

// Sequences long enough for several query blocks: causal blocks (T > 512), wide bands.
TEST(AttendFast, LongSequencesMatchReference) {
  AttentionConfig full;
  expect_matches_reference(full, make_inputs(full, 2, 600, 1), "full T=600");
  AttentionConfig win;
  win.kind = AttentionKind::kWindow;
  win.n_win = 20;
  expect_matches_reference(win, make_inputs(win, 1, 300, 2), "window20 T=300");
  AttentionConfig ch;
  ch.kind = AttentionKind::kChunked;
  ch.n_win = 40;
  ch.uncompressed_tail = true;
  ch.sink = true;
  expect_matches_reference(ch, make_inputs(ch, 2, 301, 3), "chunked n_win=40 tail T=301");
}

TEST(AttendFast, DoublePrecisionAgreesToRoundoff) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.width = 8;
  a.n_win = 5;
  a.sink = true;
  a.uncompressed_tail = true;
  auto in = make_inputs(a, 2, 45, 3, torch::kFloat64);
  auto ref = run(reference, a, in), fast = run(attend_fast, a, in);
  EXPECT_EQ(fast.scalar_type(), torch::kFloat64);
  EXPECT_LE(max_abs_diff(fast, ref), 1e-12);
}

TEST(AttendFast, QueriesThatSeeNothingOutputZero) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.n_win = 0;
  a.sink = true;
  auto in = make_inputs(a, 2, 9, 4);
  auto out = run(attend_fast, a, in);
  // Entry 0 becomes visible at t = S - 1 = 3: queries 0..2 see nothing, the sink aside.
  EXPECT_EQ(out.narrow(2, 0, 3).abs().max().item<double>(), 0.0);
  EXPECT_GT(out.narrow(2, 3, 6).abs().min().item<double>(), 0.0);
}

// The ops that produced `t`: the names of the nodes of its autograd graph, depth first. Two calls
// that ran the same code build the same graph.
std::vector<std::string> autograd_ops(const torch::Tensor& t) {
  std::vector<std::string> names;
  std::set<const torch::autograd::Node*> seen;
  std::vector<torch::autograd::Node*> stack{t.grad_fn().get()};
  while (!stack.empty()) {
    torch::autograd::Node* n = stack.back();
    stack.pop_back();
    if (n == nullptr || !seen.insert(n).second) continue;
    names.push_back(n->name());
    for (const auto& e : n->next_edges()) stack.push_back(e.function.get());
  }
  return names;
}

// A streaming call (queries at 9..12 after an earlier chunk, raw keys at 7..12) has no band
// structure, so attend_fast hands it to attend_reference. Nothing public says which path ran; the
// test observes it: the result is the reference's bit for bit and comes out of the same autograd
// graph. The control shows that the graph tells the paths apart: the training layout of the same
// layer (queries and raw keys at 0..T-1) takes the fast path and builds another graph.
TEST(AttendFast, StreamingLayoutFallsBackToReference) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.n_win = 3;
  torch::manual_seed(5);
  auto leaf = [](std::vector<int64_t> shape) { return torch::randn(shape).requires_grad_(); };
  auto q = leaf({1, 4, 4, 8}), q_pos = torch::arange(9, 13, torch::kInt64);
  auto ek = leaf({1, 2, 3, 8}), ev = leaf({1, 2, 3, 8});
  auto rk = leaf({1, 2, 6, 8}), rv = leaf({1, 2, 6, 8});
  auto r_pos = torch::arange(7, 13, torch::kInt64);
  auto ref = attend_reference(a, q, q_pos, ek, ev, rk, rv, r_pos, {});
  auto fast = attend_fast(a, q, q_pos, ek, ev, rk, rv, r_pos, {});
  EXPECT_TRUE(torch::equal(fast, ref)) << max_abs_diff(fast, ref);
  EXPECT_EQ(autograd_ops(fast), autograd_ops(ref));

  auto t_pos = torch::arange(0, 4, torch::kInt64);
  auto tek = leaf({1, 2, 1, 8}), tev = leaf({1, 2, 1, 8});
  auto trk = leaf({1, 2, 4, 8}), trv = leaf({1, 2, 4, 8});
  auto train_ref = attend_reference(a, q, t_pos, tek, tev, trk, trv, t_pos, {});
  auto train_fast = attend_fast(a, q, t_pos, tek, tev, trk, trv, t_pos, {});
  EXPECT_NE(autograd_ops(train_fast), autograd_ops(train_ref));
  EXPECT_LE(max_abs_diff(train_fast, train_ref), 1e-5);  // the same attention, computed otherwise
}

TEST(AttendFast, PathSwitchAndGuard) {
  EXPECT_EQ(attention_path(), AttentionPath::kFast);  // the training forward's default
  {
    AttentionPathGuard g(AttentionPath::kReference);
    EXPECT_EQ(attention_path(), AttentionPath::kReference);
  }
  EXPECT_EQ(attention_path(), AttentionPath::kFast);
}

// Logits and every parameter gradient of a whole model, fast path against reference.
TEST(AttendFast, DecoderForwardAndGradientsMatchReference) {
  for (const auto& v : all_variants()) {
    auto m = make_model(v.cfg, 11);
    for (int64_t T : {17, 64}) {
      auto tokens = torch::cat(
          {random_tokens(T, v.cfg.vocab_size, 1), random_tokens(T, v.cfg.vocab_size, 2)});
      auto run_path = [&](AttentionPath path) {
        AttentionPathGuard g(path);
        m->zero_grad();
        auto logits = m->forward(tokens);
        torch::nn::functional::cross_entropy(logits.view({-1, v.cfg.vocab_size}), tokens.flatten())
            .backward();
        std::vector<torch::Tensor> out{logits.detach()};
        for (auto& p : m->parameters())  // unused parameters (none on either path) stay undefined
          out.push_back(p.grad().defined() ? p.grad().clone() : torch::zeros_like(p));
        return out;
      };
      auto ref = run_path(AttentionPath::kReference), fast = run_path(AttentionPath::kFast);
      const std::string where = v.name + " T=" + std::to_string(T);
      EXPECT_LE(max_abs_diff(fast[0], ref[0]), 1e-5) << where << " logits";
      for (size_t i = 1; i < ref.size(); ++i)
        EXPECT_LE(max_abs_diff(fast[i], ref[i]), 1e-5) << where << " grad " << i;
    }
  }
}

TEST(Precision, GuardNestsAndRestores) {
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  {
    PrecisionGuard outer(Precision::kBf16, /*force=*/true);
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
    {
      PrecisionGuard inner(Precision::kF32);
      EXPECT_FALSE(at::autocast::is_cpu_enabled());
    }
    EXPECT_TRUE(at::autocast::is_cpu_enabled());
    auto y = torch::matmul(torch::randn({4, 8}), torch::randn({8, 2}));
    EXPECT_EQ(y.scalar_type(), torch::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_cpu_enabled());
  if (!bf16_native()) {
    EXPECT_EQ(resolve_precision(Precision::kBf16), Precision::kF32);
  }
  EXPECT_EQ(resolve_precision(Precision::kBf16, true), Precision::kBf16);
}

ModelConfig bf16_test_config(const AttentionConfig& a) {
  auto cfg = tiny_config(a, 1);
  cfg.d_model = 64;
  cfg.head_dim = 16;
  cfg.d_ff = 128;
  return cfg;
}

TEST(Precision, Bf16ForwardIsCloseToF32) {
  AttentionConfig ch;
  ch.kind = AttentionKind::kChunked;
  ch.width = 8;
  ch.n_win = 5;
  ch.sink = true;
  for (const auto& a : {AttentionConfig{}, ch}) {
    auto cfg = bf16_test_config(a);
    auto m = make_model(cfg, 21);
    auto tokens =
        torch::cat({random_tokens(64, cfg.vocab_size, 3), random_tokens(64, cfg.vocab_size, 4)});
    torch::NoGradGuard no_grad;
    auto f32 = m->forward(tokens);
    torch::Tensor bf16;
    {
      PrecisionGuard g(Precision::kBf16, /*force=*/true);
      bf16 = m->forward(tokens);
    }
    EXPECT_EQ(bf16.scalar_type(), torch::kBFloat16);  // logits from a bf16 matmul
    EXPECT_LT(rel_error(bf16, f32), 0.03) << describe(a);
    for (auto& p : m->parameters()) EXPECT_EQ(p.scalar_type(), torch::kFloat32);
  }
}

TEST(Precision, AttendFastBf16KeepsSoftmaxInF32) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.n_win = 5;
  a.sink = true;
  auto in = make_inputs(a, 2, 64, 8);
  auto ref = run(reference, a, in);
  torch::Tensor out;
  {
    PrecisionGuard g(Precision::kBf16, /*force=*/true);
    out = run(attend_fast, a, in);
  }
  EXPECT_EQ(out.scalar_type(), torch::kBFloat16);
  EXPECT_LT(rel_error(out, ref), 0.02);
}

TEST(Precision, Bf16TrainingStepsReduceTheLoss) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.n_win = 1;
  auto cfg = bf16_test_config(a);
  auto m = make_model(cfg, 5);
  m->train();
  auto tokens =
      torch::cat({random_tokens(48, cfg.vocab_size, 9), random_tokens(48, cfg.vocab_size, 10)});
  auto input = tokens.narrow(1, 0, 47), target = tokens.narrow(1, 1, 47);
  torch::optim::Adam opt(m->parameters(), torch::optim::AdamOptions(1e-2));
  auto step = [&] {
    torch::Tensor loss;
    {
      PrecisionGuard g(Precision::kBf16, /*force=*/true);
      auto logits = m->forward(input).to(torch::kFloat32);  // the loss in f32
      loss = torch::nn::functional::cross_entropy(logits.reshape({-1, cfg.vocab_size}),
                                                  target.flatten());
    }
    opt.zero_grad();
    loss.backward();
    for (auto& p : m->parameters()) EXPECT_EQ(p.grad().scalar_type(), torch::kFloat32);
    opt.step();
    return loss.item<double>();
  };
  const double first = step();
  double last = first;
  for (int i = 0; i < 30; ++i) last = step();
  EXPECT_LT(last, 0.8 * first);
}

}  // namespace
}  // namespace phasekv
