#include "perf/op_profile.h"

#include <torch/csrc/autograd/profiler_legacy.h>

#include <algorithm>
#include <chrono>
#include <map>
#include <sstream>
#include <vector>

#include "model/component_scope.h"
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

ComponentProfile profile_components(const std::function<void()>& f) {
  ComponentTrace trace;
  prof::enableProfilerLegacy(torch::profiler::impl::ProfilerConfig(
      torch::profiler::impl::ProfilerState::CPU, /*report_input_shapes=*/false));
  const auto t0 = std::chrono::steady_clock::now();
  f();
  ComponentProfile out;
  out.step_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  auto lists = prof::disableProfilerLegacy();
  const std::vector<Component> all = {Component::kAttention, Component::kCompressor,
                                      Component::kMlp, Component::kOptimizer};
  std::map<std::string, ComponentTime> by_name;
  for (auto c : all) by_name[component_name(c)].name = component_name(c);
  for (const auto& s : trace.spans) by_name[component_name(s.component)].forward_s += s.self_s;
  constexpr auto kBackward = static_cast<uint8_t>(at::RecordScope::BACKWARD_FUNCTION);
  for (const auto& events : lists) {
    // The outermost backward-node range of each nesting is charged whole to its node's owner.
    std::vector<std::pair<const prof::LegacyEvent*, bool>> stack;  // (push, charged here)
    int charged_open = 0;
    for (const auto& e : events) {
      if (e.kind() == prof::EventKind::PushRange) {
        const bool charge = charged_open == 0 && e.scope() == kBackward && e.sequenceNr() >= 0;
        charged_open += charge;
        stack.emplace_back(&e, charge);
      } else if (e.kind() == prof::EventKind::PopRange && !stack.empty()) {
        auto [push, charged] = stack.back();
        stack.pop_back();
        if (!charged) continue;
        --charged_open;
        const auto* owner = trace.owner(static_cast<uint64_t>(push->sequenceNr()));
        if (owner) by_name[component_name(owner->component)].backward_s += push->cpuElapsedUs(e) / 1e6;
      }
    }
  }
  double charged = 0;
  for (auto c : all) {
    out.rows.push_back(by_name[component_name(c)]);
    charged += out.rows.back().forward_s + out.rows.back().backward_s;
  }
  out.rows.push_back({"other", std::max(0.0, out.step_s - charged), 0.0});
  return out;
}

}  // namespace phasekv
