// The idealised model of `phasekv theory`: its analytic gradient against finite differences, the
// sample loss against a closed form, the fast exact-embedding path against the general one, a
// flow that concentrates, coverage on hand-built cases, the sweep's bookkeeping and the CLI's
// flag errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "report/report.h"
#include "test_util.h"
#include "theory/flow.h"
#include "theory/model.h"
#include "theory/output.h"
#include "theory/sweep.h"
#include "util/error.h"

namespace phasekv::theory {
namespace {

ModelConfig small_config(double epsilon) {
  ModelConfig c;
  c.heads = 2;
  c.stride = 3;
  c.chunks = 3;
  c.vocab = 12;
  c.kappa = 0.3;
  c.epsilon = epsilon;
  c.gamma = 3.0;
  c.beta = 2.0;
  c.rho = 1.0;
  c.contexts = 5;
  return c;
}

// Central differences on every parameter, both embedding paths.
TEST(Theory, GradientMatchesFiniteDifferences) {
  for (double eps : {0.0, 0.05}) {
    const ModelConfig c = small_config(eps);
    const Model model(c);
    const auto p = random_start(c, 7);
    const auto sample = sample_contexts(c.contexts, c.chunks, c.stride, c.vocab, 9);
    std::vector<double> g;
    model.loss_and_grad(p, sample, &g);
    ASSERT_EQ(g.size(), p.size());
    double largest = 0.0;
    for (size_t i = 0; i < p.size(); ++i) {
      auto q = p;
      const double h = 1e-5;
      q[i] += h;
      const double up = model.loss_and_grad(q, sample, nullptr);
      q[i] -= 2 * h;
      const double down = model.loss_and_grad(q, sample, nullptr);
      const double fd = (up - down) / (2 * h);
      EXPECT_NEAR(g[i], fd, 1e-8 + 1e-6 * std::abs(fd)) << "epsilon " << eps << " parameter " << i;
      largest = std::max(largest, std::abs(g[i]));
    }
    EXPECT_GT(largest, 1e-3) << "a vanishing gradient would pass trivially";
  }
}

// With uniform gates (c = 0) and exact embeddings every context gives the same loss, known in
// closed form: any Monte Carlo sample is exact there.
TEST(Theory, UniformGatesMatchTheClosedForm) {
  ModelConfig c;
  c.heads = 3;
  c.stride = 4;
  c.chunks = 4;
  c.vocab = 40;
  c.rho = 0.0;
  const Model model(c);
  const auto p = random_start(c, 1);
  for (double v : p) ASSERT_EQ(v, 0.0);
  const double closed = uniform_gate_loss(c);
  for (uint64_t seed : {3u, 4u})
    EXPECT_NEAR(model.loss_and_grad(p, sample_contexts(7, 4, 4, 40, seed), nullptr), closed, 1e-12);
  c.chunks = 1;  // one chunk: all attention on it
  EXPECT_NEAR(Model(c).loss_and_grad(p, sample_contexts(3, 1, 4, 40, 5), nullptr),
              uniform_gate_loss(c), 1e-12);
}

// Gates that depend on the position only (c along u) give every context the same loss too: the
// fixed sample is exact for them; token-specific components make it a sample estimate.
TEST(Theory, PositionOnlyGatesMakeTheSampleExact) {
  ModelConfig c = small_config(0.0);
  const Model model(c);
  std::vector<double> p(model.n_params(), 0.0);
  const size_t d = static_cast<size_t>(embedding_dim(c));
  for (int b = 0; b < 2; ++b)
    for (int h = 0; h < c.heads; ++h)
      for (int r = 0; r < c.stride; ++r) p[gate_index(c, b, h, r) * d] = 0.7 * (r + h) - b;
  const double a = model.loss_and_grad(p, sample_contexts(4, 3, 3, 12, 1), nullptr);
  const double b = model.loss_and_grad(p, sample_contexts(9, 3, 3, 12, 2), nullptr);
  EXPECT_NEAR(a, b, 1e-12);
  p[1] = 0.5;  // a token-specific component: now samples differ
  EXPECT_GT(std::abs(model.loss_and_grad(p, sample_contexts(4, 3, 3, 12, 1), nullptr) -
                     model.loss_and_grad(p, sample_contexts(9, 3, 3, 12, 2), nullptr)),
            1e-6);
}

// The O(L S) logits for exact embeddings agree with the general O(N L S) ones (forced by a
// negligible epsilon) at the same gate logits theta.
TEST(Theory, ExactPathMatchesGeneralPath) {
  const ModelConfig ce = small_config(0.0);
  const ModelConfig cg = small_config(1e-13);
  const Model exact(ce), general(cg);
  ASSERT_TRUE(exact.embeddings().exact);
  ASSERT_FALSE(general.embeddings().exact);
  const auto sample = sample_contexts(6, ce.chunks, ce.stride, ce.vocab, 3);
  // Random logits theta per gate; parameters that realise them on each path.
  const auto theta_src = random_start(small_config(1e-13), 11);  // N numbers per gate
  const int n = ce.vocab;
  const size_t gates = theta_src.size() / n;
  std::vector<double> pe(exact.n_params(), 0.0), pg(general.n_params(), 0.0);
  const auto& E = general.embeddings().emb;
  for (size_t g = 0; g < gates; ++g) {
    const double* th = &theta_src[g * n];
    for (int a = 0; a < n; ++a) pe[g * (n + 1) + a + 1] = 3.0 * th[a];  // exact: theta_a = c_{a+1}
    for (int a = 0; a < n; ++a) {  // general: forward substitution, E lower triangular
      double s = 3.0 * th[a];
      for (int k = 0; k < a; ++k) s -= E[static_cast<size_t>(a) * n + k] * pg[g * n + k];
      pg[g * n + a] = s / E[static_cast<size_t>(a) * n + a];
    }
  }
  const auto te = exact.gate_logits(pe), tg = general.gate_logits(pg);
  for (size_t i = 0; i < te.size(); ++i) ASSERT_NEAR(te[i], tg[i], 1e-9);
  EXPECT_NEAR(exact.loss_and_grad(pe, sample, nullptr), general.loss_and_grad(pg, sample, nullptr),
              1e-9);
  const auto a = exact.probe(pe, sample), b = general.probe(pg, sample);
  for (size_t r = 0; r < a.accuracy.size(); ++r) {
    EXPECT_EQ(a.accuracy[r], b.accuracy[r]) << r;
    EXPECT_NEAR(a.target_prob[r], b.target_prob[r], 1e-9) << r;
  }
}

// One head from a fixed seed: the flow puts its key on one position r_h and its value on r_h + 1;
// that position is retrieved and every other non-final position is a weak spot.
TEST(Theory, FlowConcentratesEachHead) {
  ModelConfig c;
  c.heads = 1;
  c.stride = 4;
  c.chunks = 4;
  c.vocab = 32;
  c.contexts = 32;
  c.seed = 5;
  FlowConfig f;
  f.time = 600;
  f.eval_contexts = 64;
  f.record_every = 25;
  const FlowResult r = run_flow(c, f);
  ASSERT_EQ(r.heads.size(), 1u);
  const HeadOutcome& h = r.heads[0];
  EXPECT_LT(h.r, c.stride - 1);
  EXPECT_GT(h.key, 0.9);
  EXPECT_GT(h.value, 0.9);
  EXPECT_TRUE(h.concentrated);
  const auto& last = r.records.back().eval;
  EXPECT_LT(last.static_eff[0][0], 1.5);  // from about S at the start
  EXPECT_GT(r.records.front().eval.static_eff[0][0], 3.5);
  for (int p = 0; p + 1 < c.stride; ++p) {
    if (p == h.r) {
      EXPECT_GT(last.accuracy[p], 0.95);
      EXPECT_TRUE(r.covered[p]);
    } else {
      EXPECT_LT(last.accuracy[p], 0.05) << p;
      EXPECT_FALSE(r.covered[p]);
    }
  }
  EXPECT_FALSE(r.all_covered);
  EXPECT_EQ(r.distinct_positions, 1);
  EXPECT_LT(r.records.back().train_loss, r.records.front().train_loss);
}

// Euler at the default step and fourth-order Runge-Kutta agree: the step follows the flow. Time
// 300 is mid-transition, where the two differ most (about 0.012 in a gate weight).
TEST(Theory, EulerFollowsRungeKutta) {
  ModelConfig c;
  c.heads = 2;
  c.vocab = 24;
  c.contexts = 16;
  FlowConfig f;
  f.time = 300;
  f.eval_contexts = 16;
  f.record_every = 1000;
  const FlowResult euler = run_flow(c, f);
  f.integrator = "rk4";
  const FlowResult rk4 = run_flow(c, f);
  const auto& a = euler.records.back().eval.mean_gate;
  const auto& b = rk4.records.back().eval.mean_gate;
  for (int br = 0; br < 2; ++br)
    for (int h = 0; h < c.heads; ++h)
      for (int r = 0; r < c.stride; ++r) EXPECT_NEAR(a[br][h][r], b[br][h][r], 0.03);
}

// Hand-set position-only gates: heads 0 and 1 both on r = 0 (key) and 1 (value), S = 4. Position
// 0 is retrieved, 1 and 2 are weak spots, one distinct position.
TEST(Theory, HeadsOnTheSamePositionLeaveWeakSpots) {
  ModelConfig c;
  c.heads = 2;
  c.stride = 4;
  c.chunks = 4;
  c.vocab = 64;
  const Model model(c);
  std::vector<double> p(model.n_params(), 0.0);
  const size_t d = static_cast<size_t>(embedding_dim(c));
  for (int h = 0; h < 2; ++h) {
    p[gate_index(c, 0, h, 0) * d] = 12.0;  // c along u: theta = sqrt(kappa) c_0 = 12
    p[gate_index(c, 1, h, 1) * d] = 12.0;
  }
  const auto probe = model.probe(p, sample_contexts(16, 4, 4, 64, 1));
  FlowResult r;
  classify(probe, 0.9, r);
  ASSERT_EQ(r.heads.size(), 2u);
  for (const HeadOutcome& h : r.heads) {
    EXPECT_EQ(h.r, 0);
    EXPECT_GT(h.key, 0.99);
    EXPECT_TRUE(h.concentrated);
  }
  EXPECT_EQ(probe.accuracy[0], 1.0);
  EXPECT_EQ(probe.accuracy[1], 0.0);
  EXPECT_EQ(probe.accuracy[2], 0.0);
  EXPECT_EQ(r.covered, (std::vector<bool>{true, false, false}));
  EXPECT_EQ(r.picked, (std::vector<bool>{true, false, false}));
  EXPECT_FALSE(r.all_covered);
  EXPECT_EQ(r.distinct_positions, 1);
  // Move head 1 to r = 2 (value on 3): positions 0 and 2 covered, 1 stays weak.
  p[gate_index(c, 0, 1, 0) * d] = 0.0;
  p[gate_index(c, 1, 1, 1) * d] = 0.0;
  p[gate_index(c, 0, 1, 2) * d] = 12.0;
  p[gate_index(c, 1, 1, 3) * d] = 12.0;
  classify(model.probe(p, sample_contexts(16, 4, 4, 64, 1)), 0.9, r);
  EXPECT_EQ(r.covered, (std::vector<bool>{true, false, true}));
  EXPECT_EQ(r.distinct_positions, 2);
}

// n! S(m, n) / n^m against counting all n^m assignments.
TEST(Theory, RandomCoverProbabilityCountsSurjections) {
  EXPECT_NEAR(random_cover_probability(3, 3), 6.0 / 27.0, 1e-12);
  EXPECT_DOUBLE_EQ(random_cover_probability(2, 3), 0.0);
  EXPECT_DOUBLE_EQ(random_cover_probability(1, 1), 1.0);
  for (int n = 1; n <= 4; ++n)
    for (int m = 1; m <= 6; ++m) {
      int total = 1, onto = 0;
      for (int k = 0; k < m; ++k) total *= n;
      for (int code = 0; code < total; ++code) {
        int seen = 0;
        for (int k = 0, x = code; k < m; ++k, x /= n) seen |= 1 << (x % n);
        onto += seen == (1 << n) - 1 ? 1 : 0;
      }
      EXPECT_NEAR(random_cover_probability(m, n), static_cast<double>(onto) / total, 1e-12)
          << "m " << m << " n " << n;
    }
}

TEST(Theory, CoverageRowsGroupRuns) {
  std::vector<SweepRun> runs;
  for (int m : {1, 3})
    for (int i = 0; i < 4; ++i) {
      SweepRun r;
      r.heads = m;
      r.stride = 4;
      r.vocab = 32;
      r.rho = 0.1;
      r.seed_index = i;
      r.result.all_covered = m == 3 && i < 3;
      r.result.covered = {true, r.result.all_covered, r.result.all_covered};
      r.result.distinct_positions = r.result.all_covered ? 3 : 1;
      r.result.concentration_time = 100.0 * (i + 1);
      runs.push_back(r);
    }
  const auto rows = coverage_rows(runs);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].heads, 1);
  EXPECT_EQ(rows[0].covered, 0);
  EXPECT_DOUBLE_EQ(rows[0].mean_weak, 2.0);
  EXPECT_EQ(rows[1].runs, 4);
  EXPECT_EQ(rows[1].covered, 3);
  EXPECT_DOUBLE_EQ(rows[1].p, 0.75);
  EXPECT_DOUBLE_EQ(rows[1].mean_distinct, 2.5);
  EXPECT_DOUBLE_EQ(rows[1].mean_weak, 0.5);
  EXPECT_DOUBLE_EQ(rows[1].mean_concentration_time, 250.0);
  EXPECT_NEAR(rows[1].baseline, 6.0 / 27.0, 1e-12);
  EXPECT_LT(rows[1].ci_lo, 0.75);
  EXPECT_GT(rows[1].ci_hi, 0.75);
}

// A tiny sweep end to end, with its files.
TEST(Theory, SmallSweepWritesItsFiles) {
  SweepConfig s;
  s.heads = {1, 2};
  s.strides = {3};
  s.vocabs = {16};
  s.rhos = {0.05};
  s.seeds = 2;
  s.base.chunks = 3;
  s.base.contexts = 16;
  s.flow.time = 1200;
  s.flow.eval_contexts = 32;
  s.flow.stop_when_concentrated = true;
  const SweepResult r = run_sweep(s);
  ASSERT_EQ(r.runs.size(), 4u);
  ASSERT_EQ(r.rows.size(), 2u);
  // Two non-final positions: one head covers one of them, two heads (from a small start and
  // N = 16, where heads repel) cover both.
  EXPECT_EQ(r.rows[0].covered, 0);
  EXPECT_EQ(r.rows[1].covered, 2);
  const auto dir = test::temp_dir("theory_sweep");
  const auto paths = write_sweep_outputs(dir.string(), r);
  ASSERT_EQ(paths.size(), 4u);
  for (const auto& p : paths) EXPECT_TRUE(std::filesystem::exists(p)) << p;
  const std::string svg = test::slurp(dir / "coverage.svg");
  EXPECT_CONTAINS(svg, "<svg");
  EXPECT_CONTAINS(svg, "random picks, S=3");
  EXPECT_CONTAINS(test::slurp(dir / "coverage.csv"), "3,16,0.05,2,2,2,1.0000");
}

TEST(Theory, LineChartIsWellFormed) {
  LineChart c;
  c.title = "t <1>";
  c.x_label = "x";
  c.y_label = "y";
  c.series.push_back({"a & b", {0, 1, 2}, {0.1, 0.5, 0.9}, {}, {}, false, true, -1});
  c.series.push_back({"dashed", {0, 2}, {1, 0}, {0.9, 0}, {1, 0.1}, true, false, 6});
  const std::string svg = line_svg(c);
  EXPECT_EQ(svg.rfind("<svg", 0), 0u);
  EXPECT_CONTAINS(svg, "</svg>");
  EXPECT_CONTAINS(svg, "t &lt;1&gt;");
  EXPECT_CONTAINS(svg, "a &amp; b");
  size_t groups = 0;
  for (size_t p = svg.find("class=\"series\""); p != std::string::npos;
       p = svg.find("class=\"series\"", p + 1))
    ++groups;
  EXPECT_EQ(groups, 2u);
  EXPECT_CONTAINS(svg, "stroke-dasharray");
  c.series[0].y.pop_back();
  EXPECT_THROW(line_svg(c), Error);
  EXPECT_THROW(line_svg(LineChart{}), Error);
}

TEST(Theory, BadSettingsNameTheFlag) {
  auto message = [](auto fn) {
    try {
      fn();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  ModelConfig c;
  c.heads = 0;
  EXPECT_EQ(message([&] { validate(c); }), "--heads must be in [1, 64], got 0");
  c = ModelConfig{};
  c.vocab = 10;
  EXPECT_CONTAINS(message([&] { validate(c); }),
                  "--vocab must be at least --chunks x --stride = 16");
  c = ModelConfig{};
  c.vocab = 64;
  c.epsilon = 0.45;
  EXPECT_CONTAINS(message([&] { Model m(c); }), "--epsilon 0.45 is too large");
  FlowConfig f;
  f.integrator = "rk2";
  EXPECT_EQ(message([&] { validate(f); }), "--integrator must be euler or rk4, got 'rk2'");
  f = FlowConfig{};
  f.dt = 0;
  EXPECT_EQ(message([&] { validate(f); }), "--dt must be in (0, 100], got 0");
  // Through the command line: a non-zero exit and the message.
  const auto dir = test::temp_dir("theory_cli");
  const std::string log = (dir / "log").string();
  const std::string cmd = std::string(PHASEKV_BINARY) + " theory --stride 1 --out " +
                          (dir / "o").string() + " > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd.c_str()), 0);
  EXPECT_CONTAINS(test::slurp(log), "--stride must be in [2, 64], got 1");
  const std::string cmd2 = std::string(PHASEKV_BINARY) + " theory sweep --seeds 0 --out " +
                           (dir / "o").string() + " > " + log + " 2>&1";
  EXPECT_NE(std::system(cmd2.c_str()), 0);
  EXPECT_CONTAINS(test::slurp(log), "--seeds must be in [1, 100000], got 0");
}

}  // namespace
}  // namespace phasekv::theory
