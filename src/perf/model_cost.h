// What a model configuration costs per token, from the engine's own accounting rather than a
// formula retyped elsewhere: KV-cache bytes from cache_bytes_theory (what `phasekv info` prints
// and what a streaming session's caches are checked against) and forward FLOPs from
// perf/flops.h (what `phasekv bench` divides by for MFU).
#pragma once
#include <cstdint>

#include "config/model_config.h"

namespace phasekv {

// Cache bytes per token after T tokens, all layers, f32 (4 bytes per value): total / T.
double cache_bytes_per_token(const ModelConfig& m, int64_t T);

// Forward FLOPs per token of a T-token prefill (every position's projections and attention over
// its visible keys, logits at every position): forward_flops(m, 1, T).total() / T.
double forward_flops_per_token(const ModelConfig& m, int64_t T);

}  // namespace phasekv
