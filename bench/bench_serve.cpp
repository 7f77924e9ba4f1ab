// Load test of `phasekv serve`: C concurrent clients (16, 32) each sending scoring requests
// (the audit's vLLM echo request) to an in-process server on a loopback port, with a tiny
// random chunked model. Reports requests/s, latency percentiles and errors (which must be 0).
// Run: build-http/phasekv_bench --benchmark_filter=Serve
#include <benchmark/benchmark.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <mutex>
#include <thread>

#include "backend/local_backend.h"
#include "server/server.h"

namespace phasekv {
namespace {

constexpr int kRequestsPerClient = 40;

LocalBackend tiny_backend() {
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 1;
  ModelConfig c;
  c.vocab_size = 64;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 1;
  c.head_dim = 8;
  c.d_ff = 64;
  c.max_context = 256;
  c.layers.assign(2, a);
  torch::manual_seed(1);
  Decoder model(c);
  model->init_weights(1);
  return LocalBackend(model, std::nullopt, "bench", 2);
}

void BM_ServeLoad(benchmark::State& state) {
  const int clients = static_cast<int>(state.range(0));
  LocalBackend backend = tiny_backend();
  ServerOptions o;
  o.port = 0;
  o.threads = clients + 4;
  CompletionServer server(backend, std::nullopt, std::nullopt, o);
  const int port = server.bind();
  std::thread serving([&] { server.serve(); });
  while (!server.running()) std::this_thread::sleep_for(std::chrono::milliseconds(5));
  // The audit's request: ctx + [target] echoed with logprobs, one token generated.
  nlohmann::json body = {{"prompt", std::vector<int>(128, 7)},
                         {"max_tokens", 1},
                         {"temperature", 0},
                         {"echo", true},
                         {"logprobs", 5},
                         {"return_tokens_as_token_ids", true}};
  const std::string request = body.dump();
  std::vector<double> latencies;
  int64_t errors = 0, total = 0;
  std::string first_error;
  double seconds = 0;
  for (auto _ : state) {
    std::vector<std::vector<double>> per(static_cast<size_t>(clients));
    std::atomic<int64_t> failed{0};
    std::mutex first_error_mutex;
    const auto start = std::chrono::steady_clock::now();
    std::vector<std::thread> threads;
    for (int c = 0; c < clients; ++c)
      threads.emplace_back([&, c] {
        httplib::Client client("127.0.0.1", port);
        client.set_keep_alive(true);
        for (int i = 0; i < kRequestsPerClient; ++i) {
          const auto t0 = std::chrono::steady_clock::now();
          auto res = client.Post("/v1/completions", request, "application/json");
          const auto t1 = std::chrono::steady_clock::now();
          if (!res || res->status != 200) {
            ++failed;
            std::lock_guard<std::mutex> lock(first_error_mutex);
            if (first_error.empty())
              first_error = res ? "HTTP " + std::to_string(res->status)
                                : "no response: " + httplib::to_string(res.error());
          }
          per[static_cast<size_t>(c)].push_back(
              std::chrono::duration<double, std::milli>(t1 - t0).count());
        }
      });
    for (auto& t : threads) t.join();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    state.SetIterationTime(s);
    seconds += s;
    for (const auto& p : per) latencies.insert(latencies.end(), p.begin(), p.end());
    errors += failed.load();
    total += static_cast<int64_t>(clients) * kRequestsPerClient;
  }
  server.stop();
  serving.join();
  std::sort(latencies.begin(), latencies.end());
  auto pct = [&](double q) {
    return latencies.empty() ? 0.0 : latencies[static_cast<size_t>(q * (latencies.size() - 1))];
  };
  state.counters["req_per_s"] = static_cast<double>(total) / seconds;
  state.counters["p50_ms"] = pct(0.50);
  state.counters["p90_ms"] = pct(0.90);
  state.counters["p99_ms"] = pct(0.99);
  state.counters["max_ms"] = pct(1.0);
  state.counters["errors"] = static_cast<double>(errors);
  if (!first_error.empty()) state.SetLabel("first error: " + first_error);
}
BENCHMARK(BM_ServeLoad)
    ->Arg(16)
    ->Arg(32)
    ->ArgNames({"clients"})
    ->Iterations(1)
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace phasekv
