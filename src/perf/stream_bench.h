// Long-context streaming through the Session, the serving path: prefill a context of T tokens in
// chunks, then decode token by token. Per context it reports prefill time, steady-state decode
// speed, the cache bytes the session holds against cache_bytes_theory, and the tensor
// allocations one decode step makes (perf/alloc_count.h).
#pragma once
#include <cstdint>
#include <string>

#include "config/model_config.h"

namespace phasekv {

struct StreamResult {
  int64_t context = 0;
  double prefill_s = 0;           // feeding the T-token context in chunks
  double decode_s_per_token = 0;  // fastest of the timed decode steps (the machine is shared)
  double decode_median_s = 0;
  int64_t cache_bytes = 0;      // Session::cache_bytes() summed over layers, after the decode
  int64_t reserved_bytes = 0;   // Session::reserved_bytes(): allocated, decode scratch included
  int64_t theory_bytes = 0;     // cache_bytes_theory at the same position, summed over layers
  double allocs_per_token = 0;  // CPU tensor allocations per decode step (steady state)
  double alloc_bytes_per_token = 0;
};

// Random tokens (seeded); decode_tokens >= 1 timed steps after two untimed ones. The session
// reserves the final length (context + 2 + decode_tokens) before the prefill, so the caches never
// regrow and hold little spare capacity.
StreamResult run_stream(const ModelConfig& model, int64_t context, int64_t chunk, int decode_tokens,
                        uint64_t seed);

// The streaming benchmark model: 2 layers, d_model 256, 4 query heads over 1 KV head of 64,
// either full attention or chunked S=4, W=8 (scalar gates) with a raw window of n_win = 128.
ModelConfig stream_model(bool chunked, int d_model, int n_layers);

}  // namespace phasekv
