#include "model/component_scope.h"

#include <ATen/SequenceNumber.h>

namespace phasekv {
namespace {

thread_local ComponentTrace* active_trace = nullptr;
thread_local ComponentScope* open_scope = nullptr;

}  // namespace

const char* component_name(Component c) {
  switch (c) {
    case Component::kAttention: return "attention";
    case Component::kCompressor: return "compressor";
    case Component::kMlp: return "mlp";
    case Component::kOptimizer: return "optimizer";
  }
  return "?";
}

ComponentTrace::ComponentTrace() { active_trace = this; }
ComponentTrace::~ComponentTrace() { active_trace = nullptr; }

const ComponentSpan* ComponentTrace::owner(uint64_t seq) const {
  const ComponentSpan* best = nullptr;
  for (const auto& s : spans)
    if (seq >= s.seq_begin && seq < s.seq_end &&
        (!best || s.seq_end - s.seq_begin < best->seq_end - best->seq_begin))
      best = &s;
  return best;
}

ComponentScope::ComponentScope(Component c) : component_(c) {
  if (!active_trace) return;
  active_ = true;
  seq_begin_ = at::sequence_number::peek();
  parent_ = open_scope;
  open_scope = this;
  start_ = std::chrono::steady_clock::now();
}

ComponentScope::~ComponentScope() {
  if (!active_) return;
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  open_scope = parent_;
  if (parent_) parent_->child_s_ += s;
  if (active_trace)
    active_trace->spans.push_back({component_, seq_begin_, at::sequence_number::peek(), s - child_s_});
}

}  // namespace phasekv
