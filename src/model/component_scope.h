// Marks a forward region as one component of a training step (attention, compressor, MLP,
// optimizer) for `phasekv bench train`'s per-component profile (perf/op_profile.h): the region's
// own time, and the range of autograd sequence numbers of the nodes created inside it, so that
// each backward node can be charged to the component whose forward created it. Costs one
// thread-local load when no ComponentTrace is active on the thread.
#pragma once
#include <chrono>
#include <cstdint>
#include <vector>

namespace phasekv {

enum class Component { kAttention, kCompressor, kMlp, kOptimizer };
const char* component_name(Component c);

struct ComponentSpan {
  Component component;
  uint64_t seq_begin = 0, seq_end = 0;  // autograd nodes [seq_begin, seq_end) were made inside
  double self_s = 0;                    // wall time inside, minus nested components
};

// Collects the spans of the scopes closed on this thread while it lives (one at a time).
class ComponentTrace {
 public:
  ComponentTrace();
  ~ComponentTrace();
  ComponentTrace(const ComponentTrace&) = delete;
  ComponentTrace& operator=(const ComponentTrace&) = delete;
  std::vector<ComponentSpan> spans;
  // The innermost span whose range holds the sequence number (null: none, i.e. "other").
  const ComponentSpan* owner(uint64_t seq) const;
};

class ComponentScope {
 public:
  explicit ComponentScope(Component c);
  ~ComponentScope();
  ComponentScope(const ComponentScope&) = delete;
  ComponentScope& operator=(const ComponentScope&) = delete;

 private:
  bool active_ = false;
  Component component_;
  uint64_t seq_begin_ = 0;
  std::chrono::steady_clock::time_point start_;
  double child_s_ = 0;
  ComponentScope* parent_ = nullptr;
};

}  // namespace phasekv
