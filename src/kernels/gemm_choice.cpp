#include "kernels/gemm_choice.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <bit>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <limits>

#include <nlohmann/json.hpp>

#include "util/cpu_info.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/hash.h"

namespace phasekv::kernels {
namespace {

// Products below this many multiply-adds per matrix take the small kernel under a fixed policy
// (PHASEKV_GEMM=onednn|openblas): there a library call per matrix costs more than the arithmetic.
constexpr int64_t kFixedSmallProduct = int64_t{1} << 18;

int log2_ceil(int64_t x) { return x <= 1 ? 0 : 64 - std::countl_zero(uint64_t(x - 1)); }

std::optional<GemmPath> parse_path(const std::string& name) {
  for (auto p : {GemmPath::kOneDnn, GemmPath::kOpenBlas, GemmPath::kSmall})
    if (name == gemm_path_name(p)) return p;
  return std::nullopt;
}

// Deterministic operands in [-1, 1): the timings must not depend on denormals or zeros.
std::vector<float> operand(int64_t n, uint64_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t x = seed * 6364136223846793005ull + 1442695040888963407ull;
  for (auto& f : v) {
    x = x * 6364136223846793005ull + 1442695040888963407ull;
    f = static_cast<float>((x >> 40) & 0xffffff) / float(1 << 23) - 1.0f;
  }
  return v;
}

}  // namespace

const char* gemm_path_name(GemmPath p) {
  switch (p) {
    case GemmPath::kOneDnn: return "onednn";
    case GemmPath::kOpenBlas: return "openblas";
    case GemmPath::kSmall: return "small";
  }
  return "?";
}

std::vector<GemmPath> gemm_candidates(const GemmShape& s) {
  std::vector<GemmPath> c;
  if (s.packed && s.M * s.N * s.K <= kMaxSmallKernelProduct) c.push_back(GemmPath::kSmall);
  c.push_back(GemmPath::kOneDnn);
  c.push_back(GemmPath::kOpenBlas);
  return c;
}

std::string gemm_class_key(const GemmShape& s, int threads) {
  return fmt::format("b{}_m{}_n{}_k{}_{}{}{}_t{}", log2_ceil(s.batch), log2_ceil(s.M),
                     log2_ceil(s.N), log2_ceil(s.K), s.trans_a ? 'T' : 'N', s.trans_b ? 'T' : 'N',
                     s.packed ? "_packed" : "", threads);
}

std::vector<GemmTiming> time_gemm_paths(const GemmShape& s) {
  const int64_t lda = s.trans_a ? s.M : s.K, ldb = s.trans_b ? s.K : s.N, ldc = s.N;
  auto a = operand(s.batch * s.M * s.K, 1), b = operand(s.batch * s.K * s.N, 2);
  std::vector<float> c(static_cast<size_t>(s.batch * s.M * s.N));
  using clock = std::chrono::steady_clock;
  const auto paths = gemm_candidates(s);
  std::vector<double> best(paths.size(), std::numeric_limits<double>::infinity());
  // Two interleaved rounds, each path warmed up before its timed calls: a library's first calls
  // in a process (oneDNN's, measured: 4.2 ms instead of 1.3 for a 512^3 product) or a burst of
  // another job on a shared machine must not decide a class.
  for (int round = 0; round < 2; ++round)
    for (size_t i = 0; i < paths.size(); ++i) {
      auto run = [&] { gemm_on(paths[i], s, a.data(), lda, b.data(), ldb, 0.0f, c.data(), ldc); };
      run();
      double total = 0;
      for (int rep = 0; rep < 50 && (rep < 3 || total < 2e-3); ++rep) {
        const auto t0 = clock::now();
        run();
        const double dt = std::chrono::duration<double>(clock::now() - t0).count();
        best[i] = std::min(best[i], dt);
        total += dt;
      }
    }
  std::vector<GemmTiming> out;
  for (size_t i = 0; i < paths.size(); ++i) out.push_back({paths[i], best[i]});
  return out;
}

GemmChooser::GemmChooser(std::string cache_file, std::string policy)
    : cache_file_(std::move(cache_file)), policy_(std::move(policy)) {
  if (policy_ != "auto" && policy_ != "onednn" && policy_ != "openblas")
    throw Error("PHASEKV_GEMM: unknown value '" + policy_ +
                "' (allowed: auto, onednn, openblas)");
}

GemmPath GemmChooser::choose(const GemmShape& s) {
  if (policy_ != "auto") {
    if (s.packed && s.M * s.N * s.K <= kFixedSmallProduct) return GemmPath::kSmall;
    return *parse_path(policy_);
  }
  const std::string key = gemm_class_key(s, at::get_num_threads());
  std::lock_guard lock(mu_);
  if (!loaded_) load_file_locked();
  if (auto it = entries_.find(key); it != entries_.end()) return it->second.chosen;
  return measure_locked(s, key, false);
}

GemmPath GemmChooser::recalibrate(const GemmShape& s) {
  std::lock_guard lock(mu_);
  if (!loaded_) load_file_locked();
  return measure_locked(s, gemm_class_key(s, at::get_num_threads()), true);
}

std::map<std::string, GemmChooser::Entry> GemmChooser::entries() {
  std::lock_guard lock(mu_);
  if (!loaded_) load_file_locked();
  return entries_;
}

// Reads the cache file into entries_ (its entries win over this process's: another process may
// have decided a class since). An unreadable file is reported once and rewritten by the next
// measurement; a cache must never stop a run.
void GemmChooser::load_file_locked() {
  loaded_ = true;
  if (cache_file_.empty() || !std::filesystem::exists(cache_file_)) return;
  try {
    auto j = read_json_file(cache_file_);
    for (const auto& [key, e] : j.at("classes").items()) {
      auto chosen = parse_path(e.at("chosen").get<std::string>());
      if (!chosen) throw Error("class " + key + ": unknown path " + e.at("chosen").dump());
      Entry entry{*chosen, e.at("seconds").get<std::map<std::string, double>>(),
                  e.value("shape", "")};
      entries_.insert_or_assign(key, std::move(entry));
    }
  } catch (const std::exception& e) {
    if (!warned_)
      std::cerr << "phasekv: ignoring the GEMM choice cache " << cache_file_ << " (" << e.what()
                << "); it will be rewritten\n";
    warned_ = true;
  }
}

GemmPath GemmChooser::measure_locked(const GemmShape& s, const std::string& key, bool replace) {
  // The read-measure-write of one class under the cache directory's lock: the first process to
  // measure a class decides it for all.
  std::optional<DirLock> file_lock;
  if (!cache_file_.empty()) {
    try {
      file_lock.emplace(std::filesystem::path(cache_file_).parent_path().string(), /*wait=*/true);
    } catch (const std::exception& e) {  // an unwritable cache directory: choose in memory
      std::cerr << "phasekv: cannot use the GEMM choice cache " << cache_file_ << " (" << e.what()
                << ")\n";
      cache_file_.clear();
    }
  }
  if (file_lock) {
    load_file_locked();
    if (!replace)
      if (auto it = entries_.find(key); it != entries_.end()) return it->second.chosen;
  }
  Entry entry{GemmPath::kOneDnn, {}, ""};
  double best = std::numeric_limits<double>::infinity();
  for (const auto& t : time_gemm_paths(s)) {
    entry.seconds[gemm_path_name(t.path)] = t.seconds;
    if (t.seconds < best) best = t.seconds, entry.chosen = t.path;
  }
  entry.shape = fmt::format("{}x{}x{}x{}", s.batch, s.M, s.N, s.K);
  ++measurements_;
  entries_.insert_or_assign(key, entry);
  if (file_lock) {
    nlohmann::json classes = nlohmann::json::object();
    for (const auto& [k, e] : entries_)
      classes[k] = {{"chosen", gemm_path_name(e.chosen)}, {"seconds", e.seconds}, {"shape", e.shape}};
    try {
      write_file_atomic(cache_file_, nlohmann::json{{"cpu", cpu_description()},
                                                    {"classes", classes}}
                                         .dump(1) +
                                         "\n");
    } catch (const std::exception& e) {
      std::cerr << "phasekv: cannot write the GEMM choice cache " << cache_file_ << " ("
                << e.what() << ")\n";
    }
  }
  return entry.chosen;
}

std::string gemm_cache_file() {
  namespace fs = std::filesystem;
  fs::path dir;
  if (const char* d = std::getenv("PHASEKV_CACHE_DIR"); d && *d)
    dir = d;
  else if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x)
    dir = fs::path(x) / "phasekv";
  else if (const char* h = std::getenv("HOME"); h && *h)
    dir = fs::path(h) / ".cache" / "phasekv";
  else
    return "";
  // A new CPU or a new build of the kernels (PHASEKV_NATIVE changes the small kernel's width)
  // must not inherit another's choices.
  const std::string id = cpu_description() + "|" + __VERSION__ + "|" +
#ifdef __AVX512F__
                         "avx512";
#else
                         "no-avx512";
#endif
  return (dir / ("gemm-" + fnv1a64_hex(id) + ".json")).string();
}

GemmChooser& gemm_chooser() {
  static GemmChooser chooser = [] {
    const char* p = std::getenv("PHASEKV_GEMM");
    return GemmChooser(gemm_cache_file(), p && *p ? p : "auto");
  }();
  return chooser;
}

}  // namespace phasekv::kernels
