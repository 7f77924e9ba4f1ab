// The CPU a figure was measured on, as documents name it next to every speed figure, and the
// cores this process may run on.
#pragma once
#include <string>

namespace phasekv {

// The cores this process may run on: its CPU affinity (`taskset -c 1` gives 1), not the
// machine's core count; at least 1.
int usable_cores();

// "AMD EPYC ... (family 25 model 17), 2 cores", from /proc/cpuinfo; "unknown CPU, N cores"
// without it.
// Under a narrower CPU affinity: "..., 1 of 2 cores (CPU affinity)".
std::string cpu_description();

}  // namespace phasekv
