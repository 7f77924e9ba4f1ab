#include "util/cpu_info.h"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <thread>

namespace phasekv {

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family;
  while (std::getline(in, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (name.empty() && line.rfind("model name", 0) == 0) name = value();
    if (family.empty() && line.rfind("cpu family", 0) == 0) family = value();
  }
  return fmt::format("{}{}, {} cores", name.empty() ? "unknown CPU" : name,
                     family.empty() ? "" : " (family " + family + ")",
                     std::max(1u, std::thread::hardware_concurrency()));
}

}  // namespace phasekv
