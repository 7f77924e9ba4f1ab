#include "perf/stream_bench.h"

#include <torch/torch.h>

#include <chrono>
#include <random>

#include "perf/alloc_count.h"
#include "perf/timing.h"
#include "runtime/session.h"

namespace phasekv {

ModelConfig stream_model(bool chunked, int d_model, int n_layers) {
  ModelConfig m;
  m.vocab_size = 256;
  m.d_model = d_model;
  m.n_layers = n_layers;
  m.n_heads = 4;
  m.n_kv_heads = 1;
  m.head_dim = 64;
  m.d_ff = 3 * d_model;
  m.max_context = 1 << 20;
  AttentionConfig a;
  if (chunked) {
    a.kind = AttentionKind::kChunked;
    a.stride = 4;
    a.width = 8;
    a.gate = GateKind::kScalar;
    a.n_win = 128;
  }
  m.layers.assign(static_cast<size_t>(n_layers), a);
  return m;
}

StreamResult run_stream(const ModelConfig& model, int64_t context, int64_t chunk, int decode_tokens,
                        uint64_t seed) {
  Decoder m(model);
  m->init_weights(seed);
  m->eval();
  Session session(m);
  const int steps = std::max(decode_tokens, 1);
  session.reserve(context + 2 + steps);
  std::mt19937_64 rng(seed);
  auto next = [&] { return static_cast<int64_t>(rng() % static_cast<uint64_t>(model.vocab_size)); };
  StreamResult r;
  r.context = context;
  auto t0 = std::chrono::steady_clock::now();
  for (int64_t done = 0; done < context;) {
    std::vector<int64_t> tokens;
    for (int64_t i = 0; i < std::min(chunk, context - done); ++i) tokens.push_back(next());
    session.feed(tokens);
    done += static_cast<int64_t>(tokens.size());
  }
  r.prefill_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  // Two untimed steps, then the timed ones; allocations are counted over the timed steps only
  // (every step of a run of S steps pools one entry, so steps are a multiple of S on average).
  AllocStats allocs;
  {
    for (int i = 0; i < 2; ++i) session.decode(next());
    AllocCounter counter;
    auto timed = time_runs([&] { session.decode(next()); }, 0, steps);
    allocs = counter.stats();
    r.decode_s_per_token = timed.min_s;
    r.decode_median_s = timed.median_s;
  }
  r.allocs_per_token = double(allocs.count) / steps;
  r.alloc_bytes_per_token = double(allocs.bytes) / steps;
  for (const auto& b : session.cache_bytes()) r.cache_bytes += b.total();
  for (const auto& b : session.reserved_bytes()) r.reserved_bytes += b.total();
  for (const auto& a : model.layers)
    r.theory_bytes += cache_bytes_theory(model, a, session.position(), 4).total();
  return r;
}

}  // namespace phasekv
