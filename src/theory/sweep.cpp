#include "theory/sweep.h"

#include <fmt/format.h>

#include <atomic>
#include <chrono>
#include <map>
#include <mutex>
#include <ostream>
#include <thread>
#include <tuple>

#include "eval/stats.h"
#include "util/error.h"
#include "util/rng.h"
#include "util/threads.h"

namespace phasekv::theory {

void validate(const SweepConfig& s) {
  auto nonempty = [](const char* flag, size_t n) {
    if (n == 0) throw Error(fmt::format("--{} needs at least one value", flag));
  };
  nonempty("heads", s.heads.size());
  nonempty("stride", s.strides.size());
  nonempty("vocab", s.vocabs.size());
  nonempty("rho", s.rhos.size());
  if (s.seeds < 1 || s.seeds > 100000)
    throw Error(fmt::format("--seeds must be in [1, 100000], got {}", s.seeds));
  check_compute_threads(s.jobs, "--jobs");
  if (s.jobs == 0) throw Error("--jobs must be at least 1");
  // Every grid point must be a valid model (names the flag at fault).
  for (int m : s.heads)
    for (int S : s.strides)
      for (int N : s.vocabs)
        for (double rho : s.rhos) {
          ModelConfig c = s.base;
          c.heads = m;
          c.stride = S;
          c.vocab = N;
          c.rho = rho;
          validate(c);
        }
  validate(s.flow);
}

SweepResult run_sweep(const SweepConfig& s, std::ostream* progress) {
  validate(s);
  const auto t0 = std::chrono::steady_clock::now();
  SweepResult out;
  out.config = s;
  // Grid order: S, N, rho, m, seed.
  for (int S : s.strides)
    for (int N : s.vocabs)
      for (double rho : s.rhos)
        for (int m : s.heads)
          for (int i = 0; i < s.seeds; ++i) {
            SweepRun r;
            r.heads = m;
            r.stride = S;
            r.vocab = N;
            r.rho = rho;
            r.seed_index = i;
            r.seed = seed_for(s.base.seed, static_cast<uint64_t>(i));
            out.runs.push_back(r);
          }
  std::atomic<size_t> next{0};
  std::mutex mu;
  size_t done = 0;
  std::string error;
  auto worker = [&] {
    for (size_t k = next++; k < out.runs.size(); k = next++) {
      SweepRun& r = out.runs[k];
      ModelConfig c = s.base;
      c.heads = r.heads;
      c.stride = r.stride;
      c.vocab = r.vocab;
      c.rho = r.rho;
      c.seed = r.seed;
      try {
        r.result = run_flow(c, s.flow);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        if (error.empty()) error = e.what();
        continue;
      }
      r.result.records.erase(r.result.records.begin(), r.result.records.end() - 1);
      std::lock_guard<std::mutex> lock(mu);
      ++done;
      if (progress)
        *progress << fmt::format("[{}/{}] S={} N={} rho={} m={} seed#{}: {}, {} distinct, {:.1f}s\n",
                                 done, out.runs.size(), r.stride, r.vocab, r.rho, r.heads,
                                 r.seed_index, r.result.all_covered ? "covered" : "weak spot",
                                 r.result.distinct_positions, r.result.seconds);
    }
  };
  std::vector<std::thread> pool;
  for (int j = 1; j < s.jobs; ++j) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
  if (!error.empty()) throw Error("theory sweep: " + error);
  out.rows = coverage_rows(out.runs);
  out.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return out;
}

std::vector<CoverageRow> coverage_rows(const std::vector<SweepRun>& runs) {
  std::vector<CoverageRow> rows;
  std::map<std::tuple<int, int, double, int>, size_t> index;
  for (const SweepRun& r : runs) {
    const auto key = std::make_tuple(r.stride, r.vocab, r.rho, r.heads);
    auto it = index.find(key);
    if (it == index.end()) {
      it = index.emplace(key, rows.size()).first;
      CoverageRow row;
      row.stride = r.stride;
      row.vocab = r.vocab;
      row.rho = r.rho;
      row.heads = r.heads;
      row.baseline = random_cover_probability(r.heads, r.stride - 1);
      rows.push_back(row);
    }
    CoverageRow& row = rows[it->second];
    const FlowResult& f = r.result;
    ++row.runs;
    row.covered += f.all_covered ? 1 : 0;
    row.concentrated += f.all_concentrated ? 1 : 0;
    row.mean_distinct += f.distinct_positions;
    int weak = 0;
    for (bool c : f.covered) weak += c ? 0 : 1;
    row.mean_weak += weak;
    if (f.concentration_time >= 0) row.mean_concentration_time += f.concentration_time;
  }
  for (CoverageRow& row : rows) {
    row.p = static_cast<double>(row.covered) / row.runs;
    const Interval ci = wilson(row.covered, row.runs);
    row.ci_lo = ci.lo;
    row.ci_hi = ci.hi;
    row.mean_distinct /= row.runs;
    row.mean_weak /= row.runs;
    int conc_runs = 0;
    for (const SweepRun& r : runs)
      if (r.stride == row.stride && r.vocab == row.vocab && r.rho == row.rho &&
          r.heads == row.heads && r.result.concentration_time >= 0)
        ++conc_runs;
    row.mean_concentration_time = conc_runs > 0 ? row.mean_concentration_time / conc_runs : 0.0;
  }
  return rows;
}

nlohmann::json to_json(const SweepResult& s) {
  using nlohmann::json;
  json j;
  // The shared settings: a run's own flow result carries the full model config.
  const ModelConfig& b = s.config.base;
  j["grid"] = {{"heads", s.config.heads}, {"stride", s.config.strides},
               {"vocab", s.config.vocabs}, {"rho", s.config.rhos},
               {"seeds", s.config.seeds},  {"base_seed", b.seed}};
  j["seconds"] = s.seconds;
  json rows = json::array();
  for (const CoverageRow& r : s.rows)
    rows.push_back({{"stride", r.stride},
                    {"vocab", r.vocab},
                    {"rho", r.rho},
                    {"heads", r.heads},
                    {"runs", r.runs},
                    {"covered", r.covered},
                    {"p_all_covered", r.p},
                    {"ci_lo", r.ci_lo},
                    {"ci_hi", r.ci_hi},
                    {"random_pick_baseline", r.baseline},
                    {"all_concentrated", r.concentrated},
                    {"mean_distinct_positions", r.mean_distinct},
                    {"mean_weak_spots", r.mean_weak},
                    {"mean_concentration_time", r.mean_concentration_time}});
  j["coverage"] = rows;
  json runs = json::array();
  for (const SweepRun& r : s.runs) {
    json rj = to_json(r.result, false);
    rj["seed_index"] = r.seed_index;
    runs.push_back(rj);
  }
  j["runs"] = runs;
  return j;
}

std::string runs_csv(const SweepResult& s) {
  std::string out =
      "stride,vocab,rho,heads,seed_index,seed,all_covered,all_concentrated,distinct_positions,"
      "weak_spots,picks,final_train_loss,concentration_time,seconds\n";
  for (const SweepRun& r : s.runs) {
    const FlowResult& f = r.result;
    std::string weak, picks;
    for (size_t i = 0; i < f.covered.size(); ++i)
      if (!f.covered[i]) weak += (weak.empty() ? "" : " ") + std::to_string(i);
    for (const HeadOutcome& h : f.heads)
      picks += (picks.empty() ? "" : " ") + std::to_string(h.r) + (h.concentrated ? "" : "?");
    out += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{:.6g},{},{:.3f}\n", r.stride, r.vocab,
                       r.rho, r.heads, r.seed_index, r.seed, f.all_covered ? 1 : 0,
                       f.all_concentrated ? 1 : 0, f.distinct_positions, weak, picks,
                       f.records.empty() ? 0.0 : f.records.back().train_loss,
                       f.concentration_time < 0 ? std::string() : fmt::format("{}", f.concentration_time),
                       f.seconds);
  }
  return out;
}

std::string coverage_csv(const std::vector<CoverageRow>& rows) {
  std::string out =
      "stride,vocab,rho,heads,runs,covered,p_all_covered,ci_lo,ci_hi,random_pick_baseline,"
      "all_concentrated,mean_distinct_positions,mean_weak_spots,mean_concentration_time\n";
  for (const CoverageRow& r : rows)
    out += fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{:.4f},{:.4f},{},{:.3f},{:.3f},{:.1f}\n",
                       r.stride, r.vocab, r.rho, r.heads, r.runs, r.covered, r.p, r.ci_lo, r.ci_hi,
                       r.baseline, r.concentrated, r.mean_distinct, r.mean_weak,
                       r.mean_concentration_time);
  return out;
}

}  // namespace phasekv::theory
