#include "explain/gate_cycle.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "explain/common.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

int check_cyclable(const ModelConfig& cfg, const std::vector<int>& layers,
                   const std::vector<int>& heads) {
  std::vector<int> chosen = layers;
  if (chosen.empty())
    for (int l = 0; l < cfg.n_layers; ++l)
      if (cfg.layers[static_cast<size_t>(l)].kind == AttentionKind::kChunked) chosen.push_back(l);
  if (chosen.empty())
    throw Error("gate-cycle: the model has no chunked layer (only full or window attention), so "
                "it has no compressor gates to cycle");
  select_indices(heads, cfg.n_kv_heads, "--heads");
  int stride = 0;
  for (int l : select_indices(chosen, cfg.n_layers, "--layers")) {
    const AttentionConfig& a = cfg.layers[static_cast<size_t>(l)];
    if (a.kind != AttentionKind::kChunked)
      throw Error(fmt::format("--layers: layer {} is not chunked (allowed: the chunked layers)", l));
    if (a.width != a.stride)
      throw Error(fmt::format(
          "gate-cycle: layer {} has W = {} != S = {}; cycling the gates moves phases only when "
          "every window is one block (W = S)",
          l, a.width, a.stride));
    if (a.grid_offset != 0)
      throw Error(fmt::format("gate-cycle: layer {} has grid_offset {}; the cycle's phases are "
                              "counted on the unshifted grid (allowed: layers with grid_offset 0)",
                              l, a.grid_offset));
    if (!a.kv_head_offsets.empty())
      throw Error(fmt::format("gate-cycle: layer {} has per-KV-head grids (kv_head_offsets); the "
                              "cycle's phases are counted on one unshifted grid (allowed: layers "
                              "without kv_head_offsets)",
                              l));
    if (a.gate == GateKind::kMean)
      throw Error(fmt::format("gate-cycle: layer {} has mean gates (uniform averaging): there "
                              "are no gate parameters to cycle (allowed: scalar, vector)",
                              l));
    if (a.gate == GateKind::kVector && !a.gate_bias)
      throw Error(fmt::format("gate-cycle: layer {} has vector gates without a bias: its gate map "
                              "is one per lane, so nothing is offset-specific",
                              l));
    if (stride > 0 && a.stride != stride)
      throw Error("gate-cycle: the selected layers have different strides (select one stride "
                  "with --layers)");
    stride = a.stride;
  }
  return stride;
}

void cycle_gates(Decoder& model, int delta, const std::vector<int>& layers,
                 const std::vector<int>& heads_in) {
  const ModelConfig& cfg = model->cfg;
  check_cyclable(cfg, layers, heads_in);
  std::vector<int> chosen = layers;
  if (chosen.empty())
    for (int l = 0; l < cfg.n_layers; ++l)
      if (cfg.layers[static_cast<size_t>(l)].kind == AttentionKind::kChunked) chosen.push_back(l);
  const std::vector<int> heads = select_indices(heads_in, cfg.n_kv_heads, "--heads");
  torch::NoGradGuard no_grad;
  for (int l : chosen) {
    auto& comp = model->blocks[static_cast<size_t>(l)]->attn->comp;
    const bool scalar = comp->cfg.gate == GateKind::kScalar;
    // Dim 0 is the slot; dim 1 the KV head (scalar gate [W, Hkv, D], biases [W, Hkv(, hd)]).
    auto roll = [&](torch::Tensor& t) {
      if (!t.defined()) return;
      for (int g : heads) {
        auto slice = t.select(1, g);
        slice.copy_(torch::roll(slice, {delta}, {0}));
      }
    };
    if (scalar) {
      roll(comp->gate_k);
      roll(comp->gate_v);
    }
    roll(comp->bias_k);
    roll(comp->bias_v);
  }
}

std::string delta_condition(int delta) {
  return delta == 0 ? "d0" : fmt::format("d{:+d}", delta);
}

GateCycleResult run_gate_cycle(LocalBackend& backend, const GateCycleOptions& o) {
  Decoder& model = backend.model();
  GateCycleResult result;
  result.stride = check_cyclable(model->cfg, o.layers, o.heads);
  if (o.deltas.empty()) throw Error("--delta: give at least one shift, e.g. --delta=-1,1,2");
  std::vector<int> deltas;
  for (int d : o.deltas) {
    if (d == 0) throw Error("--delta: 0 is the unshifted model, which every run includes");
    if (std::find(deltas.begin(), deltas.end(), d) == deltas.end()) deltas.push_back(d);
  }
  if (o.sweep.modulus % result.stride != 0)
    throw Error(fmt::format("--modulus {} is not a multiple of the stride {}", o.sweep.modulus,
                            result.stride));
  for (int l = 0; l < model->cfg.n_layers && o.layers.empty(); ++l)
    if (model->cfg.layers[static_cast<size_t>(l)].kind == AttentionKind::kChunked)
      result.layers.push_back(l);
  if (!o.layers.empty()) result.layers = select_indices(o.layers, model->cfg.n_layers, "--layers");
  result.heads = select_indices(o.heads, model->cfg.n_kv_heads, "--heads");
  result.modulus = o.sweep.modulus;
  nlohmann::json described;
  const EvalRecord identity = prepare_sweep(backend, o.sweep, &described);
  const nlohmann::json settings = {{"cycled_layers", result.layers},
                                   {"cycled_heads", result.heads}};
  require_same_settings(o.sweep.out_dir, settings);

  std::vector<std::string> conditions{delta_condition(0)};
  std::map<std::string, int> by_name{{"d0", 0}};
  for (int d : deltas) {
    conditions.push_back(delta_condition(d));
    by_name[delta_condition(d)] = d;
  }
  auto scorer = [&](Backend&, const std::string& condition,
                    const std::vector<ScoreRequest>& requests) {
    const int d = by_name.at(condition);
    if (d == 0) return backend.score(requests);
    cycle_gates(model, d, result.layers, result.heads);
    std::vector<ScoreResult> out;
    try {
      out = backend.score(requests);
    } catch (...) {
      cycle_gates(model, -d, result.layers, result.heads);
      throw;
    }
    cycle_gates(model, -d, result.layers, result.heads);
    return out;
  };
  auto extra = [&](const std::string& condition) {
    nlohmann::json e = settings;
    e["delta"] = by_name.at(condition);
    return e;
  };
  SweepMode mode(o.sweep, identity, conditions, scorer, extra);
  result.run = run_analysis(backend, mode, o.sweep);

  std::map<int, std::vector<PhaseOutcome>> shifted;
  std::vector<PhaseOutcome> reference;
  for (const auto& c : conditions) {
    const Tally t = tally(result.run, c, o.sweep.modulus);
    require_every_phase(t, result.run.path);
    const PhaseSummary s = summarize(t.outcomes, o.sweep.modulus, result.stride, o.sweep.stats);
    const int d = by_name.at(c);
    if (d == 0) {
      result.reference = s;
      reference = t.outcomes;
    } else {
      result.shifted[d] = s;
      shifted[d] = t.outcomes;
    }
  }
  result.fit = fit_cycle(reference, shifted, o.sweep.modulus, result.stride, o.sweep.stats);
  result.label = fmt::format("{} gate-cycle {} M={}", identity.model, identity.padding,
                             o.sweep.modulus);
  result.meta = analysis_meta(o.sweep, identity, described, result.run, "gate_cycle",
                              {{"deltas", deltas}, {"layers", result.layers}, {"heads", result.heads}});
  return result;
}

nlohmann::json GateCycleResult::to_json() const {
  nlohmann::json by_delta = nlohmann::json::object();
  for (const auto& [d, s] : shifted) by_delta[delta_condition(d)] = s.to_json();
  return {{"analysis", "gate_cycle"},
          {"label", label},
          {"modulus", modulus},
          {"stride", stride},
          {"layers", layers},
          {"heads", heads},
          {"reference", reference.to_json()},
          {"shifted", by_delta},
          {"fit", fit.to_json()},
          {"meta", meta}};
}

PlaneChart gate_cycle_chart(const GateCycleResult& r) {
  PlaneChart c;
  c.title = "gate cycling: observed vs predicted accuracy change";
  c.caption = fmt::format("phases folded mod {}; rings: boundary phase {} (not in R^2 interior = {})",
                          r.stride, r.stride - 1,
                          std::isnan(r.fit.r2_interior) ? std::string("n/a")
                                                        : fmt::format("{:.2f}", r.fit.r2_interior));
  c.x_label = "predicted change A_0((r-D) mod S) - A_0(r)";
  c.y_label = "observed change A_D(r) - A_0(r)";
  c.lo = -1.0;
  c.hi = 1.0;
  for (int d : r.fit.deltas) {
    PlaneSeries s{fmt::format("D = {:+d}", d), {}, false};
    for (const CyclePoint& p : r.fit.points)
      if (p.delta == d)
        s.points.push_back({p.predicted_change, p.observed_change, p.boundary,
                            fmt::format("D={:+d} r={}: A_0 {:.3f}, observed {:.3f}, predicted "
                                        "{:.3f}{}",
                                        d, p.r, p.reference_acc, p.observed_acc, p.predicted_acc,
                                        p.boundary ? " (boundary)" : "")});
    c.series.push_back(s);
  }
  return c;
}

std::string gate_cycle_table(const GateCycleResult& r) {
  auto r2 = [](double v) { return std::isnan(v) ? std::string("n/a") : fmt::format("{:.2f}", v); };
  std::string out = fmt::format("{}\nA_0 by phase mod {}:", r.label, r.stride);
  for (double a : r.fit.reference_acc) out += fmt::format(" {:.3f}", a);
  out += "\n";
  for (int d : r.fit.deltas) {
    out += fmt::format("D = {:+d}: observed", d);
    for (const CyclePoint& p : r.fit.points)
      if (p.delta == d) out += fmt::format(" {:.3f}", p.observed_acc);
    out += "  predicted";
    for (const CyclePoint& p : r.fit.points)
      if (p.delta == d) out += fmt::format(" {:.3f}", p.predicted_acc);
    out += fmt::format("  R^2 interior {}\n", r2(r.fit.r2_interior_by_delta.at(d)));
  }
  out += fmt::format(
      "R^2 interior {} [{}, {}] over {} points; all phases {} [{}, {}]\nboundary phase {} "
      "accuracy:",
      r2(r.fit.r2_interior), r2(r.fit.r2_interior_ci.lo), r2(r.fit.r2_interior_ci.hi),
      r.fit.n_interior, r2(r.fit.r2_all), r2(r.fit.r2_all_ci.lo), r2(r.fit.r2_all_ci.hi),
      r.stride - 1);
  for (const auto& [d, a] : r.fit.boundary_acc) out += fmt::format(" D={:+d} {:.3f}", d, a);
  return out + "\n";
}

void write_gate_cycle_outputs(const std::string& dir, const GateCycleResult& r) {
  write_file_atomic(dir + "/gate_cycle.json", r.to_json().dump(2) + "\n");
  std::string csv =
      "delta,phase,reference_acc,observed_acc,predicted_acc,observed_change,predicted_change,"
      "boundary\n";
  for (const CyclePoint& p : r.fit.points)
    csv += fmt::format("{},{},{:.6g},{:.6g},{:.6g},{:.6g},{:.6g},{}\n", p.delta, p.r,
                       p.reference_acc, p.observed_acc, p.predicted_acc, p.observed_change,
                       p.predicted_change, p.boundary ? 1 : 0);
  write_file_atomic(dir + "/gate_cycle.csv", csv);
  write_file_atomic(dir + "/gate_cycle.svg", plane_svg(gate_cycle_chart(r)));
}

}  // namespace phasekv
