// The CPU a figure was measured on, as documents name it next to every speed figure.
#pragma once
#include <string>

namespace phasekv {

// "AMD EPYC ... (family 26), 2 cores", from /proc/cpuinfo; "unknown CPU, N cores" without it.
std::string cpu_description();

}  // namespace phasekv
