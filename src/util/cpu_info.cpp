#include "util/cpu_info.h"

#include <fmt/format.h>
#include <sched.h>

#include <algorithm>
#include <fstream>
#include <thread>

namespace phasekv {

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

std::string cpu_description() {
  std::ifstream in("/proc/cpuinfo");
  std::string line, name, family, model;
  while (std::getline(in, line)) {
    auto value = [&] { return line.substr(line.find(':') + 2); };
    if (name.empty() && line.rfind("model name", 0) == 0) name = value();
    if (family.empty() && line.rfind("cpu family", 0) == 0) family = value();
    // "model\t\t: 17", not "model name": a family spans generations (AMD 25 is Zen 3 and Zen 4).
    if (model.empty() && line.rfind("model\t", 0) == 0) model = value();
  }
  const int machine = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  const int usable = usable_cores();
  const std::string cores = usable < machine
                                ? fmt::format("{} of {} cores (CPU affinity)", usable, machine)
                                : fmt::format("{} cores", machine);
  const std::string id =
      family.empty() ? "" : " (family " + family + (model.empty() ? "" : " model " + model) + ")";
  return fmt::format("{}{}, {}", name.empty() ? "unknown CPU" : name, id, cores);
}

}  // namespace phasekv
