#include "eval/calibrate.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <random>
#include <thread>

#include "eval/cluster_tests.h"
#include "eval/sla_gate.h"
#include "util/error.h"
#include "util/rng.h"

namespace phasekv::calibrate {
namespace {

const char* profile_name(Profile p) {
  switch (p) {
    case Profile::flat:
      return "flat";
    case Profile::boundary:
      return "boundary";
    case Profile::interior:
      return "interior";
  }
  return "?";
}

void validate(const Setting& s) {
  if (s.modulus < 2 || s.stride < 2 || s.examples < 2 || s.datasets < 1)
    throw Error(fmt::format("calibrate: setting M={} S={} n={} datasets={} is out of range",
                            s.modulus, s.stride, s.examples, s.datasets));
  if (s.stride_given != 0 && s.modulus % s.stride_given != 0)
    throw Error(fmt::format("calibrate: stride_given {} does not divide M = {}", s.stride_given,
                            s.modulus));
  if (s.replica > 0 && s.modulus % s.stride != 0)
    throw Error("calibrate: replicas need a stride that divides the modulus");
  if (s.top - s.gap < 0.0 || s.top > 1.0)
    throw Error(fmt::format("calibrate: top {} and gap {} leave [0, 1]", s.top, s.gap));
}

// What one simulated sweep gave, reduced to what the tables count.
struct DatasetStats {
  double period_p = 1.0;
  int detected = 0;
  double chi_p = 1.0;
  double interior_p = NAN;
  double stride_component_p = NAN, stride_residual_p = NAN;
  std::vector<bool> sla_failed;
  double gap_pp = 0.0, gap_lo = 0.0, gap_hi = 0.0, gap_bc = 0.0, null_gap = 0.0;
  double support = 0.0;  // bootstrap share of the detected period (0 when not run)
};

DatasetStats analyse(const Setting& s, const Options& o, const std::vector<double>& acc,
                     uint64_t seed) {
  const auto outcomes = simulate(s, acc, seed);
  SummaryOptions so;
  so.bootstrap_reps = o.bootstrap_reps;
  so.permutations = o.permutations;
  so.max_permutations = o.permutations;  // fixed flips: the exact size is known (header)
  so.period_bootstrap = s.group == "stride" ? o.period_bootstrap : 0;
  so.seed = splitmix64(seed ^ 0x5eedULL);
  const PhaseSummary sum = summarize(outcomes, s.modulus, s.stride_given, so);
  DatasetStats d;
  d.period_p = sum.period.p_value;
  d.detected = sum.period.detected;
  d.chi_p = sum.chi_square.p_value;
  if (sum.split && sum.split->interior_test.flips > 0)
    d.interior_p = sum.split->interior_test.p_value;
  if (sum.stride_test) {
    d.stride_component_p = sum.stride_test->component.p_value;
    d.stride_residual_p = sum.stride_test->residual.p_value;
  }
  d.support = sum.period.detected_support();
  for (double g : o.sla_max_gap_pp) {
    SlaGate gate;
    gate.max_gap_pp = g;
    d.sla_failed.push_back(!evaluate_sla(gate, sum).passed);
  }
  d.gap_pp = sum.gap_pp;
  d.gap_lo = sum.gap_ci_pp.lo;
  d.gap_hi = sum.gap_ci_pp.hi;
  d.gap_bc = sum.gap_bc_pp;
  d.null_gap = sum.null_gap_pp;
  return d;
}

nlohmann::json rate_json(const Rate& r) {
  if (r.n == 0) return nullptr;
  return {{"rate", r.value()}, {"se", r.se()}, {"hits", r.hits}, {"n", r.n}};
}

}  // namespace

double Rate::se() const {
  if (n == 0) return NAN;
  const double p = value();
  return std::sqrt(p * (1.0 - p) / static_cast<double>(n));
}

std::vector<double> true_profile(const Setting& s) {
  std::vector<double> acc(s.modulus, s.top);
  for (int r = 0; r < s.modulus; ++r) {
    const int q = r % s.stride;
    if ((s.profile == Profile::boundary && q == s.stride - 1) ||
        (s.profile == Profile::interior && q == 1))
      acc[r] = s.top - s.gap;
  }
  return acc;
}

std::vector<PhaseOutcome> simulate(const Setting& s, const std::vector<double>& acc,
                                   uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> normal(0.0, 1.0);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<double> threshold(acc.size());
  for (size_t r = 0; r < acc.size(); ++r) threshold[r] = normal_quantile(acc[r]);
  const double sd_u = std::sqrt(s.icc), sd_e = std::sqrt(1.0 - s.icc);
  std::vector<PhaseOutcome> out;
  out.reserve(static_cast<size_t>(s.examples) * s.modulus);
  std::vector<bool> row(s.modulus);
  for (int i = 0; i < s.examples; ++i) {
    // Where the example's block of M phases starts, as in a real sweep: the target key sits at
    // base + r (a multiple of M plus the phase), and the profile follows the key position mod
    // S, which is not r mod S when S does not divide M.
    const int64_t base = static_cast<int64_t>(s.modulus) * static_cast<int64_t>(rng() % 64);
    const double u = sd_u * normal(rng);
    for (int r = 0; r < s.modulus; ++r) {
      const int64_t pos = base + r;
      if (s.replica > 0.0 && r >= s.stride && uniform(rng) < s.replica)
        row[r] = row[r - s.stride];
      else
        row[r] = u + sd_e * normal(rng) < threshold[pos % s.stride];
      out.push_back({i, r, static_cast<bool>(row[r]), pos});
    }
  }
  return out;
}

Result run_setting(const Setting& s, const Options& o, int index) {
  validate(s);
  const auto start = std::chrono::steady_clock::now();
  Result res;
  res.setting = s;
  res.true_acc = true_profile(s);
  const auto [mn, mx] = std::minmax_element(res.true_acc.begin(), res.true_acc.end());
  res.true_gap_pp = 100.0 * (*mx - *mn);

  std::vector<DatasetStats> stats(s.datasets);
  // Seeds per (setting, dataset), independent of the thread that runs them.
  const uint64_t base = splitmix64(o.seed ^ splitmix64(static_cast<uint64_t>(index) + 1));
  const int threads = std::max(1, std::min(o.threads, s.datasets));
  std::vector<std::thread> pool;
  for (int t = 0; t < threads; ++t)
    pool.emplace_back([&, t] {
      for (int k = t; k < s.datasets; k += threads)
        stats[k] = analyse(s, o, res.true_acc, splitmix64(base + static_cast<uint64_t>(k)));
    });
  for (auto& th : pool) th.join();

  res.detected_count.assign(s.modulus + 1, 0);
  res.sla_fail.assign(o.sla_max_gap_pp.size(), Rate{});
  double sum = 0.0, sq = 0.0, bc = 0.0, null_sum = 0.0, support = 0.0;
  for (const auto& d : stats) {
    bc += d.gap_bc;
    null_sum += d.null_gap;
    support += d.support;
    if (!std::isnan(d.stride_component_p)) {
      ++res.stride_supported.n;
      res.stride_supported.hits += d.stride_component_p < 0.05 && d.stride_residual_p >= 0.05;
      ++res.stride_component_reject.n;
      res.stride_component_reject.hits += d.stride_component_p < 0.05;
    }
    const bool sig = d.period_p < 0.05;
    res.period_reject.hits += sig;
    res.period_is_stride.hits += sig && d.detected == s.stride;
    if (sig && d.detected >= 0 && d.detected <= s.modulus) ++res.detected_count[d.detected];
    res.chi_reject.hits += d.chi_p < 0.05;
    if (!std::isnan(d.interior_p)) {
      ++res.interior_reject.n;
      res.interior_reject.hits += d.interior_p < 0.05;
    }
    for (size_t g = 0; g < d.sla_failed.size(); ++g) {
      ++res.sla_fail[g].n;
      res.sla_fail[g].hits += d.sla_failed[g];
    }
    sum += d.gap_pp;
    sq += d.gap_pp * d.gap_pp;
    res.gap_covered.hits +=
        d.gap_lo <= res.true_gap_pp + 1e-9 && res.true_gap_pp <= d.gap_hi + 1e-9;
    res.gap_ci_excludes_point.hits += d.gap_pp < d.gap_lo - 1e-9 || d.gap_pp > d.gap_hi + 1e-9;
  }
  const int64_t n = s.datasets;
  res.period_reject.n = res.period_is_stride.n = res.chi_reject.n = n;
  res.gap_covered.n = res.gap_ci_excludes_point.n = n;
  res.gap_mean_pp = sum / static_cast<double>(n);
  res.gap_bc_mean_pp = bc / static_cast<double>(n);
  res.null_gap_mean_pp = null_sum / static_cast<double>(n);
  res.mean_support = support / static_cast<double>(n);
  const double var = n > 1 ? (sq - sum * sum / n) / static_cast<double>(n - 1) : 0.0;
  res.gap_se_pp = std::sqrt(std::max(0.0, var) / static_cast<double>(n));
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

nlohmann::json Result::to_json(const Options& o) const {
  const auto& s = setting;
  nlohmann::json j = {{"group", s.group},
                      {"modulus", s.modulus},
                      {"stride", s.stride},
                      {"stride_given", s.stride_given},
                      {"profile", profile_name(s.profile)},
                      {"top", s.top},
                      {"gap_pp", 100.0 * s.gap},
                      {"icc", s.icc},
                      {"replica", s.replica},
                      {"examples", s.examples},
                      {"datasets", s.datasets},
                      {"true_acc", true_acc},
                      {"true_gap_pp", true_gap_pp},
                      {"period_reject", rate_json(period_reject)},
                      {"period_is_stride", rate_json(period_is_stride)},
                      {"chi_square_reject", rate_json(chi_reject)},
                      {"interior_reject", rate_json(interior_reject)},
                      {"observed_gap_pp", {{"mean", gap_mean_pp}, {"se", gap_se_pp}}},
                      {"bias_corrected_gap_pp", gap_bc_mean_pp},
                      {"null_gap_pp", null_gap_mean_pp},
                      {"stride_component_reject", rate_json(stride_component_reject)},
                      {"stride_supported", rate_json(stride_supported)},
                      {"mean_period_support", mean_support},
                      {"gap_ci_covers_true", rate_json(gap_covered)},
                      {"gap_ci_excludes_point", rate_json(gap_ci_excludes_point)},
                      {"seconds", seconds}};
  nlohmann::json det = nlohmann::json::object();
  for (size_t p = 0; p < detected_count.size(); ++p)
    if (detected_count[p] > 0) det[std::to_string(p)] = detected_count[p];
  j["significant_detected_period"] = det;
  nlohmann::json sla = nlohmann::json::array();
  for (size_t g = 0; g < sla_fail.size(); ++g)
    sla.push_back({{"max_gap_pp", o.sla_max_gap_pp[g]}, {"fail", rate_json(sla_fail[g])}});
  j["sla_gate"] = sla;
  return j;
}

std::vector<Setting> default_settings(bool quick) {
  std::vector<Setting> out;
  auto add = [&](Setting s) { out.push_back(s); };
  if (quick) {
    for (double rep : {0.0, 0.95}) {
      Setting s;
      s.group = "null";
      s.modulus = 24, s.stride = s.stride_given = 8, s.examples = 50, s.datasets = 200;
      s.replica = rep;
      add(s);
    }
    Setting p;
    p.group = "power";
    p.profile = Profile::boundary, p.gap = 0.2, p.top = 0.6, p.examples = 50, p.datasets = 100;
    add(p);
    Setting st = p;
    st.group = "stride", st.stride = 5, st.stride_given = 0, st.gap = 0.5, st.top = 0.9;
    add(st);
    return out;
  }
  // Under the null: each geometry, independent outcomes (given the example) and replicas; three
  // accuracy levels at M = 8 and 24, accuracy 0.5 at M = 48; the stride unknown at the blind
  // audit's M = 24.
  const std::pair<int, int> geometries[] = {{8, 4}, {24, 8}, {48, 8}};
  for (auto [M, S] : geometries)
    for (double rep : {0.0, 0.95})
      for (double top : {0.05, 0.5, 0.95}) {
        if (M == 48 && top != 0.5) continue;
        Setting s;
        s.group = "null";
        s.modulus = M, s.stride = s.stride_given = S, s.top = top, s.replica = rep;
        add(s);
      }
  for (double rep : {0.0, 0.95}) {
    Setting s;
    s.group = "null";
    s.stride_given = 0, s.replica = rep;
    add(s);
  }
  // The expected gap of a flat model against the examples per phase.
  for (int n : {25, 50, 200, 400}) {
    Setting s;
    s.group = "null-n";
    s.examples = n, s.datasets = 500;
    add(s);
  }
  // Power against examples per phase: a boundary dip and an interior dip at M = 24, S = 8,
  // centred on accuracy 0.5.
  for (Profile prof : {Profile::boundary, Profile::interior})
    for (double gap : {0.05, 0.10, 0.20, 0.50})
      for (int n : {25, 50, 100, 200, 400}) {
        Setting s;
        s.group = "power";
        s.profile = prof, s.gap = gap, s.top = 0.5 + gap / 2, s.examples = n, s.datasets = 200;
        add(s);
      }
  // The same interior dip with prefix-padding replicas, n = 100.
  for (double gap : {0.05, 0.10, 0.20}) {
    Setting s;
    s.group = "power-replica";
    s.profile = Profile::interior, s.gap = gap, s.top = 0.5 + gap / 2, s.replica = 0.95;
    s.datasets = 200;
    add(s);
  }
  // A stride that does not divide the blind audit's modulus 24, beside one it divides.
  const std::pair<int, int> strides[] = {{5, 24}, {5, 40}, {7, 24}, {7, 28}, {10, 24}, {10, 40}};
  for (auto [S, M] : strides) {
    Setting s;
    s.group = "stride";
    s.modulus = M, s.stride = S, s.stride_given = 0, s.profile = Profile::boundary;
    s.top = 0.9, s.gap = 0.5, s.datasets = 300;
    add(s);
  }
  return out;
}

}  // namespace phasekv::calibrate
