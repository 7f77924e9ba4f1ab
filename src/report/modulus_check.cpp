#include "report/modulus_check.h"

#include <fmt/format.h>

namespace phasekv {

std::string modulus_mismatch(const PhaseSeries& series) {
  std::string moduli;
  bool differ = false;
  for (const auto& [label, s] : series) {
    moduli += fmt::format("{}{}: M = {}", moduli.empty() ? "" : ", ", label, s.modulus);
    differ = differ || s.modulus != series.front().second.modulus;
  }
  if (!differ) return "";
  return "the sweeps have different moduli (" + moduli +
         "): phase r is the position mod M, so a row r holds other positions in each; compare "
         "sweeps of one --modulus";
}

}  // namespace phasekv
