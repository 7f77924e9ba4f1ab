// "1h05m", "3m07s": a duration for progress lines and ETAs ("?" when unknown or absurd).
#pragma once
#include <cstdint>
#include <string>

#include <fmt/format.h>

namespace phasekv {

inline std::string format_duration(double seconds) {
  if (!(seconds >= 0) || seconds > 1e8) return "?";
  const auto t = static_cast<int64_t>(seconds + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60)
                   : fmt::format("{}m{:02}s", t / 60, t % 60);
}

}  // namespace phasekv
