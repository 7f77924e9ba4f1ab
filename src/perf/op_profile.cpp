#include "perf/op_profile.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <map>
#include <sstream>
#include <vector>

#include "util/fs.h"

namespace phasekv {
namespace {

namespace prof = torch::autograd::profiler;

std::string shapes_str(const std::vector<std::vector<int64_t>>& shapes) {
  std::ostringstream s;
  for (size_t i = 0; i < shapes.size(); ++i) {
    s << (i ? " " : "") << "[";
    for (size_t j = 0; j < shapes[i].size(); ++j) s << (j ? "," : "") << shapes[i][j];
    s << "]";
  }
  return s.str();
}

struct Row {
  double self_us = 0;
  int64_t calls = 0;
};

}  // namespace

// Runs f under the legacy CPU profiler with input shapes recorded; returns what it recorded.
static prof::thread_event_lists profile_with_shapes(const std::function<void()>& f) {
  prof::enableProfilerLegacy(
      torch::profiler::impl::ProfilerConfig(torch::profiler::impl::ProfilerState::CPU,
                                            /*report_input_shapes=*/true));
  f();
  return prof::disableProfilerLegacy();
}

void warm_up_op_profiler(const std::function<void()>& f) {
  (void)profile_with_shapes(f);
}

void write_op_profile(const std::function<void()>& f, const std::string& path) {
  auto lists = profile_with_shapes(f);
  std::map<std::pair<std::string, std::string>, Row> rows;
  double total_us = 0;
  for (const auto& events : lists) {
    // Push/pop pairs nest per thread: an op's self time is its span minus its children's.
    struct Open {
      const prof::LegacyEvent* push;
      double child_us;
    };
    std::vector<Open> stack;
    for (const auto& e : events) {
      if (e.kind() == prof::EventKind::PushRange) {
        stack.push_back({&e, 0.0});
      } else if (e.kind() == prof::EventKind::PopRange && !stack.empty()) {
        auto open = stack.back();
        stack.pop_back();
        const double span = open.push->cpuElapsedUs(e);
        if (!stack.empty()) stack.back().child_us += span;
        auto& r = rows[{open.push->name(), shapes_str(open.push->shapes())}];
        r.self_us += span - open.child_us;
        r.calls += 1;
        total_us += span - open.child_us;
      }
    }
  }
  std::vector<std::pair<std::pair<std::string, std::string>, Row>> sorted(rows.begin(), rows.end());
  std::sort(sorted.begin(), sorted.end(),
            [](const auto& a, const auto& b) { return a.second.self_us > b.second.self_us; });
  std::ostringstream out;
  out << "self_ms\tshare\tcalls\top\tinput_shapes\n";
  for (const auto& [key, r] : sorted) {
    out << r.self_us / 1e3 << "\t" << (total_us > 0 ? r.self_us / total_us : 0) << "\t" << r.calls
        << "\t" << key.first << "\t" << key.second << "\n";
  }
  write_file_atomic(path, out.str());
}

}  // namespace phasekv
