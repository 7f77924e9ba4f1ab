// The explanation analyses (src/explain, docs/EXPLANATION.md): the model's knockout/capture probe,
// the paired statistics and their verdicts, gate concentration, gate cycling, and the generated
// page. Model-level checks run on the bundled pair (models/kv-chunked, models/kv-full), whose
// behaviour is known: the chunked model's only weak phase is the boundary r = 3 mod 4.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "backend/local_backend.h"
#include "explain/explanation.h"
#include "explain/gate_cycle.h"
#include "explain/gates.h"
#include "explain/knockout.h"
#include "model/model_dir.h"
#include "task/task_file.h"
#include "test_util.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using test::temp_dir;

std::string bundled(const std::string& name) {
  return std::string(PHASEKV_SOURCE_DIR) + "/models/" + name;
}

SweepOptions bundled_sweep(const std::string& model, const std::string& out, int examples) {
  SweepOptions o;
  o.task = load_task_config(model);
  o.examples = examples;
  o.modulus = 8;
  o.padding = PaddingMode::kPrefix;
  o.out_dir = out;
  o.batch = 64;
  o.stats.bootstrap_reps = 200;
  o.stats.permutations = 200;
  o.model_meta = {{"model_dir", model}, {"command", "phasekv (test)"}, {"cpu", "test CPU"}};
  return o;
}

// ---- the probe ----

TEST(AttentionProbe, EmptyProbeIsThePlainForwardAndReplacementTouchesOnlyTheLastPosition) {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 1;
  ModelConfig cfg = test::tiny_config(a, 2);
  Decoder m = test::make_model(cfg, 3);
  torch::NoGradGuard g;
  auto tokens = torch::randint(0, cfg.vocab_size, {2, 13}, torch::kInt64);
  auto plain = m->hidden(tokens);
  std::vector<AttentionProbe> probes(2);
  probes[0].capture_final = true;
  probes[1].capture_final = true;
  auto captured = m->hidden(tokens, &probes);
  EXPECT_TRUE(torch::equal(plain, captured));
  ASSERT_EQ(probes[1].heads.sizes(), (std::vector<int64_t>{2, cfg.n_heads, cfg.head_dim}));
  ASSERT_EQ(probes[1].out.sizes(), (std::vector<int64_t>{2, cfg.d_model}));

  // Replacing KV head 1's query heads of layer 1 by the captured values of sequence 0 is the
  // identity for sequence 0 and changes only the last position of sequence 1.
  std::vector<AttentionProbe> ko(2);
  ko[1].replace_kv_heads = {1};
  ko[1].head_means = probes[1].heads[0];
  auto knocked = m->hidden(tokens, &ko);
  EXPECT_LT((knocked[0] - plain[0]).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(knocked[1].narrow(0, 0, 12), plain[1].narrow(0, 0, 12)));
  EXPECT_GT((knocked[1][12] - plain[1][12]).abs().max().item<double>(), 1e-4);

  // Whole-layer replacement by sequence 0's attention output: same pattern.
  std::vector<AttentionProbe> layer(2);
  layer[0].layer_mean = probes[0].out[0];
  auto replaced = m->hidden(tokens, &layer);
  EXPECT_LT((replaced[0] - plain[0]).abs().max().item<double>(), 1e-5);
  EXPECT_TRUE(torch::equal(replaced[1].narrow(0, 0, 12), plain[1].narrow(0, 0, 12)));
  EXPECT_GT((replaced[1][12] - plain[1][12]).abs().max().item<double>(), 1e-4);
}

// ---- paired statistics ----

// Every example at every phase: reference always right, the variant wrong with probability
// fail[r].
std::vector<PairedOutcome> simulate_pairs(const std::vector<double>& fail, int examples,
                                          uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<PairedOutcome> out;
  for (int e = 0; e < examples; ++e)
    for (int r = 0; r < static_cast<int>(fail.size()); ++r)
      out.push_back({e, r, true, u(rng) >= fail[r]});
  return out;
}

TEST(PairedStats, LossAtTwoPhasesIsPhaseSpecificAndUniformLossIsAgnostic) {
  SummaryOptions o;
  o.bootstrap_reps = 300;
  o.permutations = 300;
  // M = 8, S = 4: the variant fails at phases 1 and 2 (and 5, 6) only.
  const auto specific =
      summarize_paired(simulate_pairs({0, 0.8, 0.8, 0, 0, 0.8, 0.8, 0}, 200, 1), 8, 4, o);
  EXPECT_EQ(specific.spec.verdict, "phase-specific");
  EXPECT_NEAR(specific.spec.index, 1.0, 1e-9);  // all the loss in the two worst phases
  auto worst = specific.spec.worst_phases;
  std::sort(worst.begin(), worst.end());
  EXPECT_EQ(worst, (std::vector<int>{1, 2}));
  EXPECT_LT(specific.spec.p_value, 0.01);
  EXPECT_NEAR(specific.phases[1].rel_change_pct.value(), -80.0, 6.0);
  EXPECT_LT(specific.phases[1].rel_change_ci_pct.hi, -70.0);
  EXPECT_DOUBLE_EQ(specific.phases[0].rel_change_pct.value(), 0.0);

  const auto agnostic = summarize_paired(simulate_pairs(std::vector<double>(8, 0.6), 200, 2), 8, 4, o);
  EXPECT_EQ(agnostic.spec.verdict, "phase-agnostic");
  EXPECT_LT(agnostic.spec.index, 0.1);
  EXPECT_GT(agnostic.mean_drop_ci_pp.lo, 50.0);

  const auto none = summarize_paired(simulate_pairs(std::vector<double>(8, 0.0), 50, 3), 8, 4, o);
  EXPECT_EQ(none.spec.verdict, "no effect");
  EXPECT_TRUE(std::isnan(none.spec.index));
}

TEST(PairedStats, RejectsBadInput) {
  EXPECT_THROW(summarize_paired({}, 8, 4), Error);
  EXPECT_THROW(summarize_paired(simulate_pairs({0, 0, 0}, 5, 1), 3, 2), Error);  // 2 !| 3
  EXPECT_THROW(summarize_paired({{0, 9, true, true}}, 8, 4), Error);
}

TEST(CycleStats, AProfileThatMovesWithTheShiftFitsAndOneThatDoesNotFails) {
  SummaryOptions o;
  o.bootstrap_reps = 200;
  const std::vector<double> base = {0.9, 0.2, 0.9, 0.5};
  auto shifted_profile = [&](int d) {
    std::vector<double> p(4);
    for (int r = 0; r < 4; ++r) p[r] = base[((r - d) % 4 + 4) % 4];
    return p;
  };
  const auto ref = test::simulate_outcomes(base, 400, 1);
  std::map<int, std::vector<PhaseOutcome>> moved{{1, test::simulate_outcomes(shifted_profile(1), 400, 2)},
                                                 {2, test::simulate_outcomes(shifted_profile(2), 400, 3)}};
  const CycleFit fit = fit_cycle(ref, moved, 4, 4, o);
  EXPECT_GT(fit.r2_interior, 0.9);
  EXPECT_GT(fit.r2_interior_ci.lo, 0.7);
  EXPECT_EQ(fit.n_interior, 6);
  std::map<int, std::vector<PhaseOutcome>> still{{1, test::simulate_outcomes(base, 400, 4)}};
  EXPECT_LT(fit_cycle(ref, still, 4, 4, o).r2_interior, 0.0);
  EXPECT_NEAR(r_squared({1, 2, 3}, {1, 2, 3}), 1.0, 1e-12);
  EXPECT_TRUE(std::isnan(r_squared({1, 1}, {1, 2})));
  EXPECT_THROW(fit_cycle(ref, moved, 4, 1, o), Error);
}

// ---- knockout on the bundled models ----

TEST(Knockout, TheChunkedModelDependsOnEveryLayerAndTheControlNotOnLayer0) {
  LocalBackend chunked = LocalBackend::from_dir(bundled("kv-chunked"), 1, 64);
  const auto dir = temp_dir("knockout");
  KnockoutOptions o;
  o.sweep = bundled_sweep(bundled("kv-chunked"), (dir / "chunked").string(), 40);
  o.calibration = 32;
  const KnockoutResult r = run_knockout(chunked, o);
  ASSERT_EQ(r.targets.size(), 2u);  // 1 KV head per layer
  EXPECT_EQ(r.targets[1].condition, "L1.H0");
  for (const auto& e : r.effects) {
    EXPECT_GT(e.mean_drop_ci_pp.lo, 50.0);  // knocking either layer out removes retrieval
    for (const auto& p : e.phases) EXPECT_LT(p.acc_variant, 0.4) << "phase " << p.r;
  }
  EXPECT_LT(r.clean.phases[3].acc, 0.7);  // the known boundary weak spot
  EXPECT_GT(r.clean.phases[1].acc, 0.9);
  // Outputs, and a resume that scores nothing.
  write_knockout_outputs(o.sweep.out_dir, r);
  EXPECT_CONTAINS(test::slurp(dir / "chunked" / "knockout.svg"), "L1.H0");
  EXPECT_CONTAINS(test::slurp(dir / "chunked" / "knockout.csv"), "L0.H0,0,0,3,40,");
  const KnockoutResult again = run_knockout(chunked, o);
  EXPECT_EQ(again.run.scored, 0);
  EXPECT_EQ(again.effects[1].mean_drop_pp, r.effects[1].mean_drop_pp);
  // Another calibration size must not resume these records.
  o.calibration = 16;
  EXPECT_THROW(run_knockout(chunked, o), Error);

  LocalBackend full = LocalBackend::from_dir(bundled("kv-full"), 1, 64);
  KnockoutOptions f;
  f.sweep = bundled_sweep(bundled("kv-full"), (dir / "full").string(), 40);
  f.sweep.stride = 4;
  f.calibration = 32;
  f.unit = KnockoutUnit::kLayer;
  const KnockoutResult rf = run_knockout(full, f);
  ASSERT_EQ(rf.targets.size(), 2u);
  EXPECT_EQ(rf.targets[0].condition, "L0");
  EXPECT_EQ(rf.effects[0].spec.verdict, "no effect");
  EXPECT_LT(std::abs(rf.effects[0].mean_drop_pp), 3.0);
  EXPECT_GT(rf.effects[1].mean_drop_ci_pp.lo, 50.0);
  EXPECT_EQ(rf.effects[1].spec.verdict, "phase-agnostic");
}

// ---- gates ----

TEST(Gates, OneHotIsOneUniformIsWAndContentSelectionIsPerWindowOnly) {
  EXPECT_DOUBLE_EQ(effective_slots({0, 1, 0, 0}), 1.0);
  EXPECT_NEAR(effective_slots({0.25, 0.25, 0.25, 0.25}), 4.0, 1e-12);
  // Same slot in every entry: static 1, per-entry 1.
  auto same = torch::zeros({10, 1, 4}, torch::kFloat64);
  same.select(2, 2).fill_(1.0);
  auto c = concentration(same);
  EXPECT_NEAR(c.static_conc, 1.0, 1e-12);
  EXPECT_NEAR(c.per_entry, 1.0, 1e-12);
  EXPECT_NEAR(c.profile[2], 1.0, 1e-12);
  // One-hot on a different slot in each entry (content): per-entry 1, static W.
  auto content = torch::zeros({8, 1, 4}, torch::kFloat64);
  for (int n = 0; n < 8; ++n) content[n][0][n % 4] = 1.0;
  c = concentration(content);
  EXPECT_NEAR(c.per_entry, 1.0, 1e-12);
  EXPECT_NEAR(c.static_conc, 4.0, 1e-12);
  // Uniform: both W.
  c = concentration(torch::full({5, 3, 4}, 0.25, torch::kFloat64));
  EXPECT_NEAR(c.per_entry, 4.0, 1e-12);
  EXPECT_NEAR(c.static_conc, 4.0, 1e-12);
}

GatesOptions small_gates_options() {
  GatesOptions o;
  o.task = test::small_kv_task();
  o.contexts = 8;
  o.modulus = 4;
  o.batch = 4;
  return o;
}

TEST(Gates, AMeanGateIsUniformAndADominantBiasIsOneHotOnItsSlot) {
  ModelConfig cfg = test::small_kv_model_config(128);
  cfg.layers[0].gate = GateKind::kMean;
  Decoder m = test::make_model(cfg, 5);
  {
    torch::NoGradGuard g;
    auto& comp = m->blocks[1]->attn->comp;
    comp->bias_k.zero_();
    comp->bias_k.select(0, 2).fill_(60.0);  // key gate: slot 2 wins in every window
    comp->bias_v.zero_();
    comp->bias_v.select(0, 3).fill_(60.0);  // value gate: one slot later
  }
  const auto gates = measure_gates(m, small_gates_options());
  ASSERT_EQ(gates.size(), 8u);  // 2 layers x {key, value} x 2 KV heads
  for (const auto& g : gates) {
    if (g.layer == 0) {
      EXPECT_NEAR(g.c.static_conc, 4.0, 1e-9) << g.name();
      EXPECT_NEAR(g.c.per_entry, 4.0, 1e-9) << g.name();
      EXPECT_EQ(g.shared, g.side == "value");
    } else {
      EXPECT_NEAR(g.c.static_conc, 1.0, 1e-6) << g.name();
      EXPECT_NEAR(g.c.per_entry, 1.0, 1e-6) << g.name();
      EXPECT_EQ(g.peak_slot, g.side == "key" ? 2 : 3) << g.name();
    }
  }
  // Over checkpoints: two copies of the weights, ordered by their step.
  const auto dir = temp_dir("gates");
  save_model_dir((dir / "m").string(), m);
  for (const char* ck : {"ck-200", "ck-100"}) {
    fs::create_directories(dir / "cks" / ck);
    fs::copy_file(dir / "m" / "model.safetensors", dir / "cks" / ck / "model.safetensors");
  }
  const GatesResult r = run_gates(m, small_gates_options(), (dir / "cks").string());
  ASSERT_EQ(r.trajectory.size(), 3u);
  EXPECT_EQ(r.trajectory[0].step, 100);
  EXPECT_EQ(r.trajectory[2].name, "model");
  write_gates_outputs(dir.string(), r);
  EXPECT_CONTAINS(test::slurp(dir / "gates_plane.svg"), "<path");

  AttentionConfig full;
  Decoder f = test::make_model(test::tiny_config(full), 1);
  EXPECT_THROW(measure_gates(f, small_gates_options()), Error);
  EXPECT_THROW(run_gates(m, small_gates_options(), (dir / "nothing").string()), Error);
}

// ---- gate cycling ----

TEST(GateCycle, CyclingByWIsTheIdentityAndMinusDRestoresBitForBit) {
  ModelConfig cfg = test::small_kv_model_config(128);
  Decoder m = test::make_model(cfg, 7);
  std::vector<torch::Tensor> before;
  for (const auto& p : m->parameters()) before.push_back(p.clone());
  auto same = [&] {
    size_t i = 0;
    for (const auto& p : m->parameters())
      if (!torch::equal(p, before[i++])) return false;
    return true;
  };
  auto& comp = m->blocks[0]->attn->comp;
  const auto gate = comp->gate_k.clone(), bias = comp->bias_v.clone();
  cycle_gates(m, 4, {}, {});
  EXPECT_TRUE(same());
  cycle_gates(m, 1, {}, {1});
  EXPECT_FALSE(same());
  // Head 1's slot i now holds what slot i-1 held (key and value gates); head 0 is untouched.
  for (int i = 0; i < 4; ++i) {
    EXPECT_TRUE(torch::equal(comp->gate_k[i][1], gate[(i + 3) % 4][1])) << i;
    EXPECT_TRUE(torch::equal(comp->bias_v[i][1], bias[(i + 3) % 4][1])) << i;
    EXPECT_TRUE(torch::equal(comp->gate_k[i][0], gate[i][0])) << i;
  }
  cycle_gates(m, -1, {}, {1});
  EXPECT_TRUE(same());

  AttentionConfig w8;
  w8.kind = AttentionKind::kChunked;
  w8.stride = 4;
  w8.width = 8;
  EXPECT_THROW(check_cyclable(test::tiny_config(w8), {}, {}), Error);
  EXPECT_THROW(check_cyclable(test::tiny_config(AttentionConfig{}), {}, {}), Error);
  EXPECT_THROW(check_cyclable(cfg, {}, {2}), Error);  // 2 KV heads: 0, 1
}

TEST(GateCycle, ShiftByWReproducesTheUnshiftedRecordsAndLayer0MovesTheWeakSpot) {
  LocalBackend backend = LocalBackend::from_dir(bundled("kv-chunked"), 1, 64);
  const auto dir = temp_dir("cycle");
  GateCycleOptions o;
  o.sweep = bundled_sweep(bundled("kv-chunked"), (dir / "w").string(), 30);
  o.deltas = {4};
  const GateCycleResult r = run_gate_cycle(backend, o);
  int compared = 0;
  for (const auto& [key, rec] : r.run.latest) {
    if (rec.condition != "d+4") continue;
    const EvalRecord& ref = r.run.latest.at({"d0", rec.example_id, rec.phase});
    EXPECT_EQ(rec.prediction, ref.prediction);
    // The same weights, to float rounding: the two conditions' requests reach the model in
    // batches of different composition, and a row's GEMM result can differ in its last bits with
    // the batch size (the product's path is chosen per shape class, kernels/gemm_choice.h).
    ASSERT_TRUE(rec.target_logprob && ref.target_logprob);
    EXPECT_NEAR(*rec.target_logprob, *ref.target_logprob, 1e-5);  // f32 logits: ~1e-7 relative
    ++compared;
  }
  EXPECT_EQ(compared, 30 * 8);
  // Nothing moved: every observed and predicted change is 0, and R^2 (0/0) is undefined.
  EXPECT_TRUE(std::isnan(r.fit.r2_all));
  EXPECT_EQ(r.fit.boundary_acc.at(4), r.fit.boundary_acc.at(0));

  // Cycling layer 0 by +2 moves the interior weak spot: A_2(1) ~ A_0(3), the boundary's 0.5.
  GateCycleOptions l0;
  l0.sweep = bundled_sweep(bundled("kv-chunked"), (dir / "l0").string(), 40);
  l0.deltas = {2};
  l0.layers = {0};
  const GateCycleResult m = run_gate_cycle(backend, l0);
  EXPECT_GT(m.fit.reference_acc[1], 0.9);
  const CyclePoint& p = m.fit.points[1];  // D = +2, r = 1
  ASSERT_EQ(p.r, 1);
  EXPECT_LT(p.observed_acc, 0.3);
  EXPECT_LT(m.fit.boundary_acc.at(2), 0.2);  // and the boundary stays weak
  write_gate_cycle_outputs((dir / "l0").string(), m);

  // The page from these outputs.
  ExplanationOptions e;
  e.dirs = {(dir / "l0").string()};
  e.out = (dir / "doc" / "EXPLANATION.md").string();
  e.command = "phasekv explain report ...";
  write_explanation(e);
  const std::string page = test::slurp(e.out);
  EXPECT_CONTAINS(page, "## Gate cycling");
  EXPECT_CONTAINS(page, "does not recover under 1 of 1 shifts");
  EXPECT_CONTAINS(page, "(EXPLANATION/kv-chunked-gate_cycle.svg)");
  EXPECT_TRUE(fs::exists(dir / "doc" / "EXPLANATION" / "kv-chunked-gate_cycle.svg"));
  EXPECT_THROW(load_analysis(dir.string()), Error);
}

}  // namespace
}  // namespace phasekv
