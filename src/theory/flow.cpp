#include "theory/flow.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ostream>
#include <set>

#include "util/error.h"
#include "util/rng.h"

namespace phasekv::theory {

void validate(const FlowConfig& f) {
  if (f.integrator != "euler" && f.integrator != "rk4")
    throw Error("--integrator must be euler or rk4, got '" + f.integrator + "'");
  if (!(f.dt > 0.0 && f.dt <= 100.0))
    throw Error(fmt::format("--dt must be in (0, 100], got {}", f.dt));
  if (!(f.time >= 0.0 && f.time <= 1e7))
    throw Error(fmt::format("--time must be in [0, 1e7], got {}", f.time));
  if (f.time / f.dt > 1e7) throw Error("--time / --dt must be at most 1e7 steps");
  if (f.record_every < 1 || f.record_every > 1000000)
    throw Error(fmt::format("--record-every must be in [1, 1000000], got {}", f.record_every));
  if (f.eval_contexts < 1 || f.eval_contexts > (1 << 20))
    throw Error(fmt::format("--eval-contexts must be in [1, 1048576], got {}", f.eval_contexts));
  if (!(f.threshold > 0.0 && f.threshold < 1.0))
    throw Error(fmt::format("--threshold must be in (0, 1), got {}", f.threshold));
}

void classify(const Model::Probe& probe, double threshold, FlowResult& out) {
  const int S = static_cast<int>(probe.accuracy.size()) + 1;
  const auto& key = probe.mean_gate[0];
  const auto& value = probe.mean_gate[1];
  out.heads.clear();
  out.covered.assign(static_cast<size_t>(S - 1), false);
  out.picked.assign(static_cast<size_t>(S - 1), false);
  std::set<int> distinct;
  out.all_concentrated = true;
  for (size_t h = 0; h < key.size(); ++h) {
    HeadOutcome o;
    o.r = static_cast<int>(std::max_element(key[h].begin(), key[h].end()) - key[h].begin());
    o.key = key[h][o.r];
    o.value = o.r + 1 < S ? value[h][o.r + 1] : 0.0;
    o.concentrated = o.key >= threshold && o.value >= threshold;
    if (o.concentrated) {
      out.picked[o.r] = true;
      distinct.insert(o.r);
    } else {
      out.all_concentrated = false;
    }
    out.heads.push_back(o);
  }
  out.distinct_positions = static_cast<int>(distinct.size());
  out.all_covered = true;
  for (int r = 0; r + 1 < S; ++r) {
    out.covered[r] = probe.accuracy[r] >= 0.5;
    out.all_covered = out.all_covered && out.covered[r];
  }
}

namespace {

void axpy(std::vector<double>& y, double a, const std::vector<double>& x) {
  for (size_t i = 0; i < y.size(); ++i) y[i] += a * x[i];
}

}  // namespace

FlowResult run_flow(const ModelConfig& mc, const FlowConfig& fc, std::ostream* progress) {
  validate(fc);
  const auto t0 = std::chrono::steady_clock::now();
  const Model model(mc);
  // Independent streams for the training sample, the evaluation sample and the start.
  const auto train = sample_contexts(mc.contexts, mc.chunks, mc.stride, mc.vocab,
                                     seed_for(mc.seed, 1));
  const auto eval = sample_contexts(fc.eval_contexts, mc.chunks, mc.stride, mc.vocab,
                                    seed_for(mc.seed, 2));
  std::vector<double> c = random_start(mc, seed_for(mc.seed, 3));
  FlowResult out;
  out.model = mc;
  out.flow = fc;
  const int steps = static_cast<int>(std::ceil(fc.time / fc.dt - 1e-9));
  std::vector<double> g, k1, k2, k3, k4, tmp;
  for (int step = 0;; ++step) {
    const double loss = model.loss_and_grad(c, train, &g);
    if (!std::isfinite(loss))
      throw Error(fmt::format(
          "theory: the loss is not finite at step {} (t = {}); lower --dt", step, step * fc.dt));
    const bool last = step == steps;
    if (step % fc.record_every == 0 || last) {
      FlowRecord rec{step, step * fc.dt, loss, model.probe(c, eval)};
      if (progress) {
        *progress << fmt::format("t = {:8.2f}  loss {:.5f}  eval {:.5f}  acc", rec.t, loss,
                                 rec.eval.loss);
        for (double a : rec.eval.accuracy) *progress << fmt::format(" {:.2f}", a);
        *progress << "\n";
      }
      FlowResult now;
      classify(rec.eval, fc.threshold, now);
      out.records.push_back(std::move(rec));
      if (now.all_concentrated && out.concentration_time < 0) {
        out.concentration_time = out.records.back().t;
        if (fc.stop_when_concentrated) break;
      }
    }
    if (last) break;
    if (fc.integrator == "euler") {
      axpy(c, -fc.dt, g);
    } else {  // classic fourth-order Runge-Kutta on dc/dt = -grad L
      k1 = g;
      tmp = c;
      axpy(tmp, -0.5 * fc.dt, k1);
      model.loss_and_grad(tmp, train, &k2);
      tmp = c;
      axpy(tmp, -0.5 * fc.dt, k2);
      model.loss_and_grad(tmp, train, &k3);
      tmp = c;
      axpy(tmp, -fc.dt, k3);
      model.loss_and_grad(tmp, train, &k4);
      for (size_t i = 0; i < c.size(); ++i)
        c[i] -= fc.dt / 6.0 * (k1[i] + 2.0 * k2[i] + 2.0 * k3[i] + k4[i]);
    }
  }
  const double conc_time = out.concentration_time;
  classify(out.records.back().eval, fc.threshold, out);
  out.concentration_time = conc_time;
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

double random_cover_probability(int m, int n) {
  if (n <= 0) return 1.0;
  if (m < n) return 0.0;
  // sum_k (-1)^k C(n, k) ((n - k) / n)^m
  double p = 0.0, binom = 1.0;
  for (int k = 0; k <= n; ++k) {
    p += (k % 2 ? -1.0 : 1.0) * binom * std::pow(static_cast<double>(n - k) / n, m);
    binom = binom * (n - k) / (k + 1);
  }
  return std::clamp(p, 0.0, 1.0);
}

nlohmann::json to_json(const FlowResult& r, bool with_records) {
  using nlohmann::json;
  const ModelConfig& m = r.model;
  const FlowConfig& f = r.flow;
  json j;
  j["model"] = {{"heads", m.heads},   {"stride", m.stride},   {"entries", m.chunks},
                {"vocab", m.vocab},   {"kappa", m.kappa},     {"epsilon", m.epsilon},
                {"gamma", m.gamma},   {"beta", m.beta},       {"rho", m.rho},
                {"contexts", m.contexts}, {"seed", m.seed}};
  j["flow"] = {{"integrator", f.integrator}, {"dt", f.dt}, {"time", f.time},
               {"record_every", f.record_every}, {"eval_contexts", f.eval_contexts},
               {"threshold", f.threshold},
               {"stop_when_concentrated", f.stop_when_concentrated}};
  json heads = json::array();
  for (const HeadOutcome& h : r.heads)
    heads.push_back({{"slot", h.r}, {"key", h.key}, {"value", h.value},
                     {"concentrated", h.concentrated}});
  j["heads"] = heads;
  std::vector<int> weak;
  for (size_t i = 0; i < r.covered.size(); ++i)
    if (!r.covered[i]) weak.push_back(static_cast<int>(i));
  j["covered"] = r.covered;
  j["picked"] = r.picked;
  j["weak_spots"] = weak;
  j["all_covered"] = r.all_covered;
  j["all_concentrated"] = r.all_concentrated;
  j["distinct_positions"] = r.distinct_positions;
  j["concentration_time"] = r.concentration_time < 0 ? json(nullptr) : json(r.concentration_time);
  j["seconds"] = r.seconds;
  if (!r.records.empty()) {
    const FlowRecord& last = r.records.back();
    j["final"] = {{"t", last.t},
                  {"train_loss", last.train_loss},
                  {"eval_loss", last.eval.loss},
                  {"accuracy", last.eval.accuracy},
                  {"target_prob", last.eval.target_prob},
                  {"mean_key_gate", last.eval.mean_gate[0]},
                  {"mean_value_gate", last.eval.mean_gate[1]},
                  {"static_eff", last.eval.static_eff},
                  {"entry_eff", last.eval.window_eff}};
  }
  if (with_records) {
    json recs = json::array();
    for (const FlowRecord& rec : r.records)
      recs.push_back({{"step", rec.step},
                      {"t", rec.t},
                      {"train_loss", rec.train_loss},
                      {"eval_loss", rec.eval.loss},
                      {"accuracy", rec.eval.accuracy},
                      {"target_prob", rec.eval.target_prob},
                      {"mean_gate", rec.eval.mean_gate},
                      {"static_eff", rec.eval.static_eff},
                      {"entry_eff", rec.eval.window_eff},
                      {"entry_max", rec.eval.window_max}});
    j["records"] = recs;
  }
  return j;
}

namespace {
const char* kBranch[] = {"key", "value"};
}

std::string gates_csv(const FlowResult& r) {
  std::string out = "step,t,branch,head,position,weight\n";
  for (const FlowRecord& rec : r.records)
    for (int b = 0; b < 2; ++b)
      for (size_t h = 0; h < rec.eval.mean_gate[b].size(); ++h)
        for (size_t p = 0; p < rec.eval.mean_gate[b][h].size(); ++p)
          out += fmt::format("{},{},{},{},{},{:.6g}\n", rec.step, rec.t, kBranch[b], h, p,
                             rec.eval.mean_gate[b][h][p]);
  return out;
}

std::string concentration_csv(const FlowResult& r) {
  std::string out = "step,t,branch,head,static_eff,entry_eff,entry_max\n";
  for (const FlowRecord& rec : r.records)
    for (int b = 0; b < 2; ++b)
      for (size_t h = 0; h < rec.eval.static_eff[b].size(); ++h)
        out += fmt::format("{},{},{},{},{:.6g},{:.6g},{:.6g}\n", rec.step, rec.t, kBranch[b], h,
                           rec.eval.static_eff[b][h], rec.eval.window_eff[b][h],
                           rec.eval.window_max[b][h]);
  return out;
}

std::string accuracy_csv(const FlowResult& r) {
  std::string out = "step,t,position,accuracy,target_prob,train_loss,eval_loss\n";
  for (const FlowRecord& rec : r.records)
    for (size_t p = 0; p < rec.eval.accuracy.size(); ++p)
      out += fmt::format("{},{},{},{:.6g},{:.6g},{:.6g},{:.6g}\n", rec.step, rec.t, p,
                         rec.eval.accuracy[p], rec.eval.target_prob[p], rec.train_loss,
                         rec.eval.loss);
  return out;
}

}  // namespace phasekv::theory
