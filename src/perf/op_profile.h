// Where a step's time goes, op by op: runs a function under libtorch's profiler with input
// shapes recorded and writes a table of self time (time in an op minus the ops it called) per
// (op, input shapes), largest first. The chrome trace (`--profile`) shows the timeline; this
// table answers "which op, on which tensors" without opening it.
#pragma once
#include <functional>
#include <string>
#include <vector>

namespace phasekv {

// Runs f once under the profiler and writes the table to path (TSV: self_ms, share, calls, op,
// input shapes). Time outside any op (e.g. inside a custom autograd function's forward) is not
// attributed.
void write_op_profile(const std::function<void()>& f, const std::string& path);

// Runs f once under the same profiler and discards what it recorded. The first profiled run of
// a process is slow (measured: a 47 ms small f32 training step showed 196 ms of self time, the
// next profiled one 54 ms), so call this before the profile that is kept.
void warm_up_op_profiler(const std::function<void()>& f);

// Where a training step's time goes by component (model/component_scope.h): f runs once under
// the profiler with a ComponentTrace; a component's forward time is its scopes' own time, its
// backward time that of the backward nodes its forward created (matched by autograd sequence
// number); "other" is the rest of the step's wall time (embedding, head and loss, the autograd
// engine's own work). Profiling slows the step, so the shares are the figure to read.
struct ComponentTime {
  std::string name;
  double forward_s = 0, backward_s = 0;
};
struct ComponentProfile {
  std::vector<ComponentTime> rows;  // attention, compressor, mlp, optimizer, other
  double step_s = 0;                // the profiled step's wall time
};
ComponentProfile profile_components(const std::function<void()>& f);

}  // namespace phasekv
