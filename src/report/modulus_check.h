// A comparison of sweeps of different moduli M: phase r is the target key's position mod M, so
// the same row r holds other positions in each sweep. `phasekv compare` warns, compare.html says
// it above the chart.
#pragma once
#include <string>

#include "report/report.h"

namespace phasekv {

// "" when every series has the same M; else one sentence naming each series' M.
std::string modulus_mismatch(const PhaseSeries& series);

}  // namespace phasekv
