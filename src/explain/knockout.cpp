#include "explain/knockout.h"

#include <fmt/format.h>

#include <cmath>
#include <ostream>

#include "explain/common.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

KnockoutUnit knockout_unit_from_string(const std::string& s) {
  if (s == "head") return KnockoutUnit::kHead;
  if (s == "layer") return KnockoutUnit::kLayer;
  if (s == "both") return KnockoutUnit::kBoth;
  throw Error("--unit: '" + s + "' is not a knockout unit (allowed: head, layer, both)");
}

std::string to_string(KnockoutUnit u) {
  switch (u) {
    case KnockoutUnit::kHead:
      return "head";
    case KnockoutUnit::kLayer:
      return "layer";
    case KnockoutUnit::kBoth:
      return "both";
  }
  return "head";
}

KnockoutMeans calibrate_knockout(Decoder& model, const SweepOptions& o, int calibration) {
  if (calibration < 1)
    throw Error("--calibration is " + std::to_string(calibration) + " (allowed: >= 1)");
  const size_t L = model->blocks.size();
  KnockoutMeans m;
  torch::NoGradGuard no_grad;
  const int batch = std::max(1, o.batch);
  for (int start = 0; start < calibration; start += batch) {
    const int n = std::min(batch, calibration - start);
    std::vector<std::vector<int32_t>> contexts;
    for (int k = start; k < start + n; ++k) {
      const LogicalExample lg =
          make_logical_example(o.task, o.seed, kCalibrationIdBase + static_cast<uint64_t>(k));
      contexts.push_back(materialize(lg, o.modulus, k % o.modulus, o.padding, false).tokens);
    }
    const int64_t T = static_cast<int64_t>(contexts[0].size());
    auto tokens = torch::empty({n, T}, torch::kInt64);
    auto acc = tokens.accessor<int64_t, 2>();
    for (int b = 0; b < n; ++b)
      for (int64_t t = 0; t < T; ++t) acc[b][t] = contexts[static_cast<size_t>(b)][t];
    std::vector<AttentionProbe> probes(L);
    for (auto& p : probes) p.capture_final = true;
    model->hidden(tokens, &probes);
    for (size_t l = 0; l < L; ++l) {
      auto h = probes[l].heads.to(torch::kFloat64).sum(0), o_ = probes[l].out.to(torch::kFloat64).sum(0);
      if (m.heads.size() <= l) {
        m.heads.push_back(h);
        m.layer_out.push_back(o_);
      } else {
        m.heads[l] += h;
        m.layer_out[l] += o_;
      }
    }
  }
  for (size_t l = 0; l < L; ++l) {
    m.heads[l] = (m.heads[l] / calibration).to(torch::kFloat32);
    m.layer_out[l] = (m.layer_out[l] / calibration).to(torch::kFloat32);
  }
  return m;
}

std::vector<AttentionProbe> knockout_probes(const KnockoutMeans& means, const KnockoutTarget& t) {
  std::vector<AttentionProbe> probes(means.heads.size());
  AttentionProbe& p = probes.at(static_cast<size_t>(t.layer));
  if (t.kv_head >= 0) {
    p.replace_kv_heads = {t.kv_head};
    p.head_means = means.heads[static_cast<size_t>(t.layer)];
  } else {
    p.layer_mean = means.layer_out[static_cast<size_t>(t.layer)];
  }
  return probes;
}

namespace {

std::string join_ints(const std::vector<int>& v) {
  std::string out;
  for (int x : v) out += (out.empty() ? "" : ",") + std::to_string(x);
  return out;
}

std::vector<KnockoutTarget> make_targets(const ModelConfig& cfg, const KnockoutOptions& o) {
  const std::vector<int> layers = select_indices(o.layers, cfg.n_layers, "--layers");
  std::vector<KnockoutTarget> targets;
  for (int l : layers) {
    if (o.unit != KnockoutUnit::kLayer)
      for (int g = 0; g < cfg.n_kv_heads; ++g) targets.push_back({unit_name(l, g), l, g});
    if (o.unit != KnockoutUnit::kHead) targets.push_back({unit_name(l, -1), l, -1});
  }
  return targets;
}

}  // namespace

KnockoutResult run_knockout(LocalBackend& backend, const KnockoutOptions& o) {
  if (o.calibration < 1)
    throw Error("--calibration is " + std::to_string(o.calibration) + " (allowed: >= 1)");
  Decoder& model = backend.model();
  KnockoutResult result;
  result.targets = make_targets(model->cfg, o);
  nlohmann::json described;
  const EvalRecord identity = prepare_sweep(backend, o.sweep, &described);
  const int stride = sweep_stride(backend, o.sweep);
  result.modulus = o.sweep.modulus;
  result.fold = stride > 0 ? stride : o.sweep.modulus;
  const nlohmann::json settings = {{"calibration", o.calibration}};
  require_same_settings(o.sweep.out_dir, settings);

  if (o.sweep.progress)
    *o.sweep.progress << fmt::format("knockout: calibrating on {} prompts\n", o.calibration);
  const KnockoutMeans means = calibrate_knockout(model, o.sweep, o.calibration);

  std::vector<std::string> conditions{"clean"};
  std::map<std::string, KnockoutTarget> by_name;
  for (const auto& t : result.targets) {
    conditions.push_back(t.condition);
    by_name[t.condition] = t;
  }
  auto scorer = [&](Backend&, const std::string& condition,
                    const std::vector<ScoreRequest>& requests) {
    if (condition == "clean") return backend.score(requests);
    std::vector<AttentionProbe> probes = knockout_probes(means, by_name.at(condition));
    return backend.score(requests, &probes);
  };
  auto extra = [&](const std::string& condition) {
    nlohmann::json e = settings;
    if (condition != "clean") {
      const KnockoutTarget& t = by_name.at(condition);
      e["layer"] = t.layer;
      e["kv_head"] = t.kv_head >= 0 ? nlohmann::json(t.kv_head) : nlohmann::json(nullptr);
    }
    return e;
  };
  SweepMode mode(o.sweep, identity, conditions, scorer, extra);
  result.run = run_analysis(backend, mode, o.sweep);

  const Tally clean = tally(result.run, "clean", o.sweep.modulus);
  require_every_phase(clean, result.run.path);
  result.clean = summarize(clean.outcomes, o.sweep.modulus, stride, o.sweep.stats);
  for (const auto& t : result.targets)
    result.effects.push_back(summarize_paired(pair_conditions(result.run, "clean", t.condition),
                                              o.sweep.modulus, result.fold, o.sweep.stats));
  result.label = fmt::format("{} knockout ({} unit) {} M={}", identity.model, to_string(o.unit),
                             identity.padding, o.sweep.modulus);
  result.meta = analysis_meta(
      o.sweep, identity, described, result.run, "knockout",
      {{"stride", stride > 0 ? nlohmann::json(stride) : nlohmann::json(nullptr)},
       {"calibration", o.calibration},
       {"calibration_ids", fmt::format("{} + [0, {})", kCalibrationIdBase, o.calibration)},
       {"unit", to_string(o.unit)},
       {"position", "final (the target key, where the answer is predicted)"},
       {"replacement", "mean over the calibration prompts"}});
  return result;
}

nlohmann::json KnockoutResult::to_json() const {
  // The phases are folded mod the stride S; with the stride unknown they are not folded (fold =
  // M) and `stride` is null, as in summary.json. Files before the rename say "fold" (always set).
  const nlohmann::json stride =
      clean.stride > 0 ? nlohmann::json(fold) : nlohmann::json(nullptr);
  nlohmann::json units = nlohmann::json::array();
  for (size_t i = 0; i < targets.size(); ++i) {
    nlohmann::json u = effects[i].to_json();
    u["stride"] = stride;
    u["specialisation"]["stride"] = stride;
    u["condition"] = targets[i].condition;
    u["layer"] = targets[i].layer;
    u["kv_head"] = targets[i].kv_head >= 0 ? nlohmann::json(targets[i].kv_head)
                                           : nlohmann::json(nullptr);
    units.push_back(u);
  }
  return {{"analysis", "knockout"}, {"label", label}, {"modulus", modulus}, {"stride", stride},
          {"clean", clean.to_json()},  {"units", units}, {"meta", meta}};
}

std::string knockout_csv(const KnockoutResult& r) {
  auto num = [](double v) { return std::isnan(v) ? std::string() : fmt::format("{:.6g}", v); };
  std::string out =
      "condition,layer,kv_head,phase,n,acc_clean,acc,change_pp,rel_change_pct,rel_ci_lo,"
      "rel_ci_hi\n";
  for (size_t i = 0; i < r.targets.size(); ++i)
    for (const PairedPhaseRow& p : r.effects[i].phases)
      out += fmt::format("{},{},{},{},{},{},{},{},{},{},{}\n", r.targets[i].condition,
                         r.targets[i].layer,
                         r.targets[i].kv_head >= 0 ? std::to_string(r.targets[i].kv_head) : "",
                         p.r, p.n, num(p.acc_reference), num(p.acc_variant), num(p.change_pp),
                         p.rel_change_pct ? num(*p.rel_change_pct) : "",
                         num(p.rel_change_ci_pct.lo), num(p.rel_change_ci_pct.hi));
  return out;
}

Heatmap knockout_heatmap(const KnockoutResult& r) {
  Heatmap h;
  h.title = "knockout: relative change of accuracy by phase";
  h.caption = fmt::format("100 (ko - clean) / clean at the final position, {} examples; grey: "
                          "boundary phases",
                          r.clean.examples);
  h.x_label = fmt::format("phase r = target position mod {}", r.modulus);
  h.y_label = "layer.KV head";
  h.unit = " %";
  h.center = 0.0;
  h.limit = 100.0;
  for (int c = 0; c < r.modulus; ++c) {
    h.cols.push_back(std::to_string(c));
    if (r.clean.stride > 0 && c % r.clean.stride == r.clean.stride - 1) h.shaded_cols.push_back(c);
  }
  for (size_t i = 0; i < r.targets.size(); ++i) {
    h.rows.push_back(r.targets[i].condition);
    std::vector<double> row;
    for (const PairedPhaseRow& p : r.effects[i].phases)
      row.push_back(p.rel_change_pct ? *p.rel_change_pct : std::nan(""));
    h.values.push_back(row);
  }
  return h;
}

std::string knockout_table(const KnockoutResult& r) {
  std::string out = fmt::format("{}\nclean: mean {:.3f}, worst r={} {:.3f}, gap {}\n", r.label,
                                r.clean.mean_acc, r.clean.worst_phase, r.clean.worst_acc,
                                format_gap(r.clean));
  out += fmt::format("{:<8} {:>22} {:>26} {:>8}  {}\n", "unit", "mean drop pp [95% CI]",
                     "specialisation [95% CI]", "p", "verdict");
  for (size_t i = 0; i < r.targets.size(); ++i) {
    const PairedSummary& e = r.effects[i];
    out += fmt::format("{:<8} {:>6.1f} [{:>5.1f}, {:>5.1f}]  {:>9.2f} [{:>5.2f}, {:>5.2f}] {:>8} "
                       " {} (worst folded phases {})\n",
                       r.targets[i].condition, e.mean_drop_pp, e.mean_drop_ci_pp.lo,
                       e.mean_drop_ci_pp.hi, e.spec.index, e.spec.index_ci.lo, e.spec.index_ci.hi,
                       format_p(e.spec.p_value), e.spec.verdict,
                       join_ints(e.spec.worst_phases));
  }
  return out;
}

void write_knockout_outputs(const std::string& dir, const KnockoutResult& r) {
  write_file_atomic(dir + "/knockout.json", r.to_json().dump(2) + "\n");
  write_file_atomic(dir + "/knockout.csv", knockout_csv(r));
  write_file_atomic(dir + "/knockout.svg", heatmap_svg(knockout_heatmap(r)));
}

}  // namespace phasekv
