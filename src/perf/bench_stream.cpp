#include <fmt/format.h>

#include "perf/bench_suite.h"
#include "perf/fit.h"
#include "perf/stream_bench.h"
#include "perf/timing.h"

namespace phasekv {
namespace {

nlohmann::json to_json(const StreamResult& r, const char* kind) {
  return {{"kind", kind},
          {"context", r.context},
          {"prefill_s", r.prefill_s},
          {"decode_ms_per_token", r.decode_s_per_token * 1e3},
          {"decode_median_ms_per_token", r.decode_median_s * 1e3},
          {"decode_tokens_per_s", 1.0 / r.decode_s_per_token},
          {"cache_bytes", r.cache_bytes},
          {"theory_bytes", r.theory_bytes},
          {"cache_over_theory", double(r.cache_bytes) / double(r.theory_bytes)},
          {"reserved_bytes", r.reserved_bytes},
          {"reserved_over_theory", double(r.reserved_bytes) / double(r.theory_bytes)},
          {"allocs_per_token", r.allocs_per_token},
          {"alloc_bytes_per_token", r.alloc_bytes_per_token}};
}

void print_row(const StreamResult& r, const char* kind) {
  fmt::print(
      "{:>7} {:<8} {:>9.2f} {:>9.2f} {:>8.0f} {:>9.2f} {:>9.2f} {:>7.4f} {:>9.2f} {:>7.4f} "
      "{:>8.1f} {:>10.1f}\n",
      r.context, kind, r.prefill_s, r.decode_s_per_token * 1e3, 1.0 / r.decode_s_per_token,
      r.cache_bytes / 1048576.0, r.theory_bytes / 1048576.0,
      double(r.cache_bytes) / double(r.theory_bytes), r.reserved_bytes / 1048576.0,
      double(r.reserved_bytes) / double(r.theory_bytes), r.allocs_per_token,
      r.alloc_bytes_per_token / 1024.0);
}

}  // namespace

nlohmann::json bench_stream(const BenchOptions& o) {
  auto full = stream_model(false, o.stream_d_model, o.stream_layers);
  auto chunked = stream_model(true, o.stream_d_model, o.stream_layers);
  if (!o.stream_config.empty()) {
    chunked = model_config_from_file(o.stream_config);
    full = chunked;
    for (auto& a : full.layers) a = AttentionConfig{};
    fmt::print("== Streaming (Session): {} (the \"chunked\" rows, {} layers, d_model {}) against "
               "the same widths with full attention in every layer\n",
               o.stream_config, chunked.n_layers, chunked.d_model);
  } else {
    fmt::print("== Streaming (Session): d_model {}, {} layers, 4 heads / 1 KV head of 64; chunked "
               "S=4 W=8 n_win=128\n",
               o.stream_d_model, o.stream_layers);
  }
  fmt::print(
      "prefill chunks of {}, {} timed decode steps, {} threads, load {:.1f}\n(cache MB: bytes "
      "in use; reserv MB: allocated, after Session::reserve(final length), decode scratch "
      "included)\n",
      o.chunk, o.decode_tokens, o.threads, load_average());
  fmt::print("{:>7} {:<8} {:>9} {:>9} {:>8} {:>9} {:>9} {:>7} {:>9} {:>7} {:>8} {:>10}\n",
             "context", "kind", "prefill s", "ms/token", "tok/s", "cache MB", "theory MB",
             "/theory", "reserv MB", "/theory", "allocs/t", "alloc KB/t");
  nlohmann::json rows = nlohmann::json::array(), ratios = nlohmann::json::array();
  std::vector<double> xs, prefill_full, prefill_chunked;
  std::vector<std::pair<StreamResult, StreamResult>> pairs;
  for (int64_t T : o.contexts) {
    auto f = run_stream(full, T, o.chunk, o.decode_tokens, o.seed);
    print_row(f, "full");
    auto c = run_stream(chunked, T, o.chunk, o.decode_tokens, o.seed);
    print_row(c, "chunked");
    rows.push_back(to_json(f, "full"));
    rows.push_back(to_json(c, "chunked"));
    xs.push_back(double(T));
    prefill_full.push_back(f.prefill_s);
    prefill_chunked.push_back(c.prefill_s);
    pairs.emplace_back(f, c);
  }
  fmt::print("\n{:>7} {:>18} {:>18} {:>18}\n", "context", "decode chunked/full",
             "cache full/chunked", "prefill full/chunked");
  for (const auto& [f, c] : pairs) {
    const double speed = f.decode_s_per_token / c.decode_s_per_token,
                 cache = double(f.cache_bytes) / double(c.cache_bytes),
                 prefill = f.prefill_s / c.prefill_s;
    fmt::print("{:>7} {:>17.2f}x {:>17.2f}x {:>17.2f}x\n", f.context, speed, cache, prefill);
    ratios.push_back({{"context", f.context},
                      {"decode_speedup", speed},
                      {"cache_ratio", cache},
                      {"prefill_ratio", prefill}});
  }
  nlohmann::json fits = nlohmann::json::object();
  if (xs.size() >= 2) {
    auto ff = fit_power_law(xs, prefill_full), fc = fit_power_law(xs, prefill_chunked);
    fmt::print(
        "prefill time ~ T^k (log-log least squares over {} contexts): full k = {:.2f} "
        "(r2 {:.3f}), chunked k = {:.2f} (r2 {:.3f})\n",
        xs.size(), ff.exponent, ff.r2, fc.exponent, fc.r2);
    fits = {{"full", {{"exponent", ff.exponent}, {"r2", ff.r2}}},
            {"chunked", {{"exponent", fc.exponent}, {"r2", fc.r2}}}};
  }
  fmt::print("\n");
  return {{"rows", rows}, {"ratios", ratios}, {"prefill_fit", fits}};
}

}  // namespace phasekv
