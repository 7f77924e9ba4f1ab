#include "model/kv_cache.h"

#include <algorithm>

namespace phasekv {

void PendingTokens::append(const CompressorTokens& t) {
  pk.append(t.pk);
  if (t.pv.defined()) pv.append(t.pv);
  if (t.gk.defined()) gk.append(t.gk);
  if (t.gv.defined()) gv.append(t.gv);
}

void PendingTokens::drop_front(int64_t n) {
  for (auto* b : {&pk, &pv, &gk, &gv})
    if (b->defined()) b->drop_front(n);
}

CompressorTokens PendingTokens::tokens() const {
  return {pk.view(), pv.view(), gk.view(), gv.view()};
}

int64_t PendingTokens::used_bytes() const {
  return pk.used_bytes() + pv.used_bytes() + gk.used_bytes() + gv.used_bytes();
}

int64_t PendingTokens::reserved_bytes() const {
  return pk.reserved_bytes() + pv.reserved_bytes() + gk.reserved_bytes() + gv.reserved_bytes();
}

void LayerCache::drop_raw_before(int64_t from) {
  const int64_t drop = std::clamp<int64_t>(from - raw_start(), 0, n_raw());
  raw_k.drop_front(drop);
  raw_v.drop_front(drop);
}

}  // namespace phasekv
