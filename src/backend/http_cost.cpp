#include "backend/http_cost.h"

#include <cmath>
#include <sstream>
#include <vector>

#include "util/error.h"

namespace phasekv {

TokenPrices parse_token_prices(const std::string& text, const std::string& flag) {
  std::vector<double> values;
  std::stringstream in(text);
  std::string part;
  const std::string allowed = " (allowed: IN,OUT or IN,OUT,CACHED, prices per million tokens >= 0)";
  while (std::getline(in, part, ',')) {
    size_t used = 0;
    double v = -1;
    try {
      v = std::stod(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || !std::isfinite(v) || v < 0)
      throw Error(flag + " '" + text + "': '" + part + "' is not a price" + allowed);
    values.push_back(v);
  }
  if (!text.empty() && text.back() == ',')
    throw Error(flag + " '" + text + "': empty price" + allowed);
  if (values.size() != 2 && values.size() != 3)
    throw Error(flag + " '" + text + "': " + std::to_string(values.size()) + " prices" + allowed);
  TokenPrices p{values[0], values[1], std::nullopt};
  if (values.size() == 3) p.cached_per_mtok = values[2];
  return p;
}

double token_cost(const TokenPrices& p, int64_t prompt, int64_t cached, int64_t completion) {
  const double cached_price = p.cached_per_mtok.value_or(p.input_per_mtok);
  return (static_cast<double>(prompt - cached) * p.input_per_mtok +
          static_cast<double>(cached) * cached_price +
          static_cast<double>(completion) * p.output_per_mtok) /
         1e6;
}

nlohmann::json prices_json(const TokenPrices& p) {
  return {{"input_per_mtok", p.input_per_mtok},
          {"output_per_mtok", p.output_per_mtok},
          {"cached_per_mtok",
           p.cached_per_mtok ? nlohmann::json(*p.cached_per_mtok) : nlohmann::json(nullptr)}};
}

}  // namespace phasekv
