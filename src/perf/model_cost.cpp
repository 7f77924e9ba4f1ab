#include "perf/model_cost.h"

#include "perf/flops.h"
#include "runtime/session.h"

namespace phasekv {

double cache_bytes_per_token(const ModelConfig& m, int64_t T) {
  int64_t total = 0;
  for (const auto& a : m.layers) total += cache_bytes_theory(m, a, T, /*elem=*/4).total();
  return static_cast<double>(total) / static_cast<double>(T);
}

double forward_flops_per_token(const ModelConfig& m, int64_t T) {
  return forward_flops(m, 1, T).total() / static_cast<double>(T);
}

}  // namespace phasekv
