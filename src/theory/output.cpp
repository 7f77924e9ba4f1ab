#include "theory/output.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <map>
#include <tuple>

#include "report/report.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::theory {

namespace {

std::string model_caption(const ModelConfig& m) {
  return fmt::format("m={} S={} L={} N={} kappa={} eps={} gamma={} beta={} rho={} seed={}",
                     m.heads, m.stride, m.chunks, m.vocab, m.kappa, m.epsilon, m.gamma, m.beta,
                     m.rho, m.seed);
}

std::vector<double> times(const FlowResult& r) {
  std::vector<double> t;
  for (const FlowRecord& rec : r.records) t.push_back(rec.t);
  return t;
}

}  // namespace

std::string gates_svg(const FlowResult& r) {
  LineChart c;
  c.title = "Each head concentrates: mean p^K(r_h) and p^V(r_h + 1) over flow time";
  c.caption = model_caption(r.model) + "; solid: key, dashed: value";
  c.x_label = "flow time t";
  c.y_label = "mean gate weight";
  c.y_lo = 0.0;
  c.y_hi = 1.0;
  const int S = r.model.stride;
  for (size_t h = 0; h < r.heads.size(); ++h) {
    const int rh = r.heads[h].r;
    LineSeries key, value;
    key.label = fmt::format("head {} key, r = {}", h, rh);
    value.label = fmt::format("head {} value, r = {}", h, rh + 1);
    key.x = value.x = times(r);
    key.colour = value.colour = static_cast<int>(h);
    value.dashed = true;
    for (const FlowRecord& rec : r.records) {
      key.y.push_back(rec.eval.mean_gate[0][h][rh]);
      value.y.push_back(rh + 1 < S ? rec.eval.mean_gate[1][h][rh + 1] : 0.0);
    }
    c.series.push_back(std::move(key));
    c.series.push_back(std::move(value));
  }
  return line_svg(c);
}

std::string concentration_svg(const FlowResult& r) {
  LineChart c;
  c.title = "Effective number of offsets exp(H) of each head's gates";
  c.caption = model_caption(r.model) + "; solid: key, dashed: value; static exp(H(E[p]))";
  c.x_label = "flow time t";
  c.y_label = "exp(entropy), 1 = one-hot, S = uniform";
  c.y_lo = 1.0;
  c.y_hi = r.model.stride;
  for (size_t h = 0; h < r.heads.size(); ++h)
    for (int b = 0; b < 2; ++b) {
      LineSeries s;
      s.label = fmt::format("head {} {}", h, b == 0 ? "key" : "value");
      s.x = times(r);
      s.colour = static_cast<int>(h);
      s.dashed = b == 1;
      for (const FlowRecord& rec : r.records) s.y.push_back(rec.eval.static_eff[b][h]);
      c.series.push_back(std::move(s));
    }
  return line_svg(c);
}

std::string accuracy_svg(const FlowResult& r) {
  LineChart c;
  c.title = "Retrieval accuracy per queried position r*";
  std::string weak;
  for (size_t i = 0; i < r.covered.size(); ++i)
    if (!r.covered[i]) weak += (weak.empty() ? "" : ", ") + std::to_string(i);
  c.caption = model_caption(r.model) +
              (weak.empty() ? "; every position covered" : "; weak spots at r* = " + weak);
  c.x_label = "flow time t";
  c.y_label = "top-1 accuracy of the successor";
  c.y_lo = 0.0;
  c.y_hi = 1.0;
  for (int p = 0; p + 1 < r.model.stride; ++p) {
    LineSeries s;
    std::string pickers;
    for (size_t h = 0; h < r.heads.size(); ++h)
      if (r.heads[h].concentrated && r.heads[h].r == p)
        pickers += (pickers.empty() ? "" : ",") + std::to_string(h);
    s.label = fmt::format("r* = {} ({})", p, pickers.empty() ? "no head" : "head " + pickers);
    s.x = times(r);
    for (const FlowRecord& rec : r.records) s.y.push_back(rec.eval.accuracy[p]);
    c.series.push_back(std::move(s));
  }
  return line_svg(c);
}

std::string coverage_svg(const SweepResult& s) {
  LineChart c;
  c.title = "P(all S - 1 non-final positions covered) against the number of heads m";
  c.caption = fmt::format(
      "{} seeds per point, 95% Wilson intervals; dashed: heads picking uniformly and "
      "independently; L={} kappa={} gamma={} beta={}",
      s.config.seeds, s.config.base.chunks, s.config.base.kappa, s.config.base.gamma,
      s.config.base.beta);
  c.x_label = "heads m";
  c.y_label = "probability that every position is covered";
  c.y_lo = 0.0;
  c.y_hi = 1.0;
  c.x_integer_ticks = true;
  std::map<std::tuple<int, int, double>, size_t> index;
  std::map<int, size_t> baseline;  // stride -> series
  for (const CoverageRow& r : s.rows) {
    const auto key = std::make_tuple(r.stride, r.vocab, r.rho);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, c.series.size()).first;
      LineSeries ls;
      ls.label = fmt::format("S={} N={} rho={}", r.stride, r.vocab, r.rho);
      ls.markers = true;
      c.series.push_back(std::move(ls));
    }
    LineSeries& ls = c.series[it->second];
    ls.x.push_back(r.heads);
    ls.y.push_back(r.p);
    ls.lo.push_back(r.ci_lo);
    ls.hi.push_back(r.ci_hi);
  }
  // Colour by series; the baselines after them, one per stride over the union of m values.
  for (size_t i = 0; i < c.series.size(); ++i) c.series[i].colour = static_cast<int>(i);
  for (const CoverageRow& r : s.rows) {
    auto it = baseline.find(r.stride);
    if (it == baseline.end()) {
      it = baseline.emplace(r.stride, c.series.size()).first;
      LineSeries ls;
      ls.label = fmt::format("random picks, S={}", r.stride);
      ls.dashed = true;
      ls.colour = 6;  // black
      c.series.push_back(std::move(ls));
    }
    LineSeries& ls = c.series[it->second];
    if (std::find(ls.x.begin(), ls.x.end(), r.heads) == ls.x.end()) {
      ls.x.push_back(r.heads);
      ls.y.push_back(r.baseline);
    }
  }
  return line_svg(c);
}

namespace {

std::vector<std::string> write_all(
    const std::string& dir, const std::vector<std::pair<std::string, std::string>>& files) {
  std::filesystem::create_directories(dir);
  std::vector<std::string> paths;
  for (const auto& [name, content] : files) {
    paths.push_back((std::filesystem::path(dir) / name).string());
    write_file_atomic(paths.back(), content);
  }
  return paths;
}

}  // namespace

std::vector<std::string> write_flow_outputs(const std::string& dir, const FlowResult& r) {
  return write_all(dir, {{"theory.json", to_json(r).dump(1) + "\n"},
                         {"gates.csv", gates_csv(r)},
                         {"concentration.csv", concentration_csv(r)},
                         {"accuracy.csv", accuracy_csv(r)},
                         {"gates.svg", gates_svg(r)},
                         {"concentration.svg", concentration_svg(r)},
                         {"accuracy.svg", accuracy_svg(r)}});
}

std::vector<std::string> write_sweep_outputs(const std::string& dir, const SweepResult& s) {
  return write_all(dir, {{"sweep.json", to_json(s).dump(1) + "\n"},
                         {"runs.csv", runs_csv(s)},
                         {"coverage.csv", coverage_csv(s.rows)},
                         {"coverage.svg", coverage_svg(s)}});
}

}  // namespace phasekv::theory
