#include "model/kv_cache.h"

namespace phasekv {
namespace {
int64_t tensor_bytes(const torch::Tensor& t) {
  return t.defined() ? t.numel() * static_cast<int64_t>(t.element_size()) : 0;
}
}  // namespace

int64_t LayerCache::raw_bytes() const {
  return tensor_bytes(raw_k) + tensor_bytes(raw_v);
}
int64_t LayerCache::entry_bytes() const {
  return tensor_bytes(ent_k) + tensor_bytes(ent_v);
}

}  // namespace phasekv
