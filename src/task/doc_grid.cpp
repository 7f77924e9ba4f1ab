#include "task/doc_grid.h"

#include <fmt/format.h>

#include <cmath>
#include <set>
#include <sstream>

#include "util/error.h"

namespace phasekv {
namespace {

std::vector<std::string> split_commas(const std::string& text) {
  std::vector<std::string> parts;
  std::stringstream in(text);
  std::string part;
  while (std::getline(in, part, ',')) parts.push_back(part);
  if (!text.empty() && text.back() == ',') parts.push_back("");
  return parts;
}

double number(const std::string& s, const std::string& flag, const std::string& text) {
  size_t used = 0;
  double v = NAN;
  try {
    v = std::stod(s, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != s.size() || !std::isfinite(v))
    throw Error(flag + " '" + text + "': '" + s + "' is not a number");
  return v;
}

}  // namespace

std::vector<int> parse_token_list(const std::string& text, const std::string& flag) {
  std::vector<int> out;
  std::set<int> seen;
  for (const auto& part : split_commas(text)) {
    const double v = number(part, flag, text);
    if (v != std::floor(v) || v < 16 || v > 1e8)
      throw Error(flag + " '" + text + "': " + part + " (allowed: whole token counts >= 16)");
    if (!seen.insert(static_cast<int>(v)).second)
      throw Error(flag + " '" + text + "': " + part + " is listed twice");
    out.push_back(static_cast<int>(v));
  }
  if (out.empty()) throw Error(flag + ": no length given");
  return out;
}

std::vector<double> parse_depths(const std::string& text, const std::string& flag) {
  if (text.empty()) return {};
  std::vector<double> out;
  const size_t colon = text.find(':');
  if (colon != std::string::npos) {
    const std::string kind = text.substr(0, colon);
    const double n = number(text.substr(colon + 1), flag, text);
    if ((kind != "linear" && kind != "sigmoid") || n != std::floor(n) || n < 2 || n > 101)
      throw Error(flag + " '" + text +
                  "' (allowed: a list of percents, linear:N or sigmoid:N "
                  "with 2 <= N <= 101)");
    for (int i = 0; i < static_cast<int>(n); ++i) {
      const double x = 100.0 * i / (n - 1);
      double d = x;
      if (kind == "sigmoid" && i > 0 && i + 1 < static_cast<int>(n))
        d = 100.0 / (1.0 + std::exp(-0.1 * (x - 50.0)));
      out.push_back(std::round(d * 10) / 10);
    }
  } else {
    for (const auto& part : split_commas(text)) {
      const double v = number(part, flag, text);
      if (v < 0 || v > 100) throw Error(flag + " '" + text + "': " + part + " (allowed: 0..100)");
      out.push_back(v);
    }
  }
  for (size_t i = 1; i < out.size(); ++i)
    if (out[i] == out[i - 1] || out[i] < out[i - 1])
      throw Error(flag + " '" + text + "': depths must increase (" + fmt::format("{}", out[i]) +
                  " after " + fmt::format("{}", out[i - 1]) + ")");
  return out;
}

std::vector<DocCell> doc_grid(const std::vector<int>& lengths, const std::vector<double>& depths) {
  std::vector<DocCell> cells;
  const bool single = lengths.size() == 1 && depths.empty();
  for (int len : lengths) {
    if (depths.empty()) {
      cells.push_back({len, -1, single ? "" : fmt::format("L{}", len)});
      continue;
    }
    for (double d : depths) cells.push_back({len, d, fmt::format("L{}_d{}", len, d)});
  }
  return cells;
}

}  // namespace phasekv
