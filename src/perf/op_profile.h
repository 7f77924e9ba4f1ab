// Where a step's time goes, op by op: runs a function under libtorch's profiler with input
// shapes recorded and writes a table of self time (time in an op minus the ops it called) per
// (op, input shapes), largest first. The chrome trace (`--profile`) shows the timeline; this
// table answers "which op, on which tensors" without opening it.
#pragma once
#include <functional>
#include <string>

namespace phasekv {

// Runs f once under the profiler and writes the table to path (TSV: self_ms, share, calls, op,
// input shapes). Time outside any op (e.g. inside a custom autograd function's forward) is not
// attributed.
void write_op_profile(const std::function<void()>& f, const std::string& path);

}  // namespace phasekv
