#include "perf/torch_reference.h"

#include <cstdio>

#include "util/allocator.h"
#include "util/error.h"

namespace phasekv {

nlohmann::json run_torch_reference(const TorchReference& ref, const std::string& args) {
  // Same heap settings as this process, or the comparison measures glibc's munmap, not the step.
  const std::string tunables = glibc_tunables_for_children();
  const std::string cmd = (tunables.empty() ? "" : "GLIBC_TUNABLES='" + tunables + "' ") + "'" +
                          ref.python + "' '" + ref.script + "' " + args;
  FILE* pipe = popen(cmd.c_str(), "r");
  if (!pipe) throw Error("could not start the PyTorch reference: " + cmd);
  std::string out;
  char buf[4096];
  while (fgets(buf, sizeof buf, pipe)) out += buf;
  const int status = pclose(pipe);
  if (status != 0)
    throw Error("the PyTorch reference failed (status " + std::to_string(status) + "): " + cmd);
  std::string last;
  if (auto end = out.find_last_not_of('\n'); end != std::string::npos) {
    auto start = out.rfind('\n', end);
    start = start == std::string::npos ? 0 : start + 1;
    last = out.substr(start, end - start + 1);
  }
  try {
    return nlohmann::json::parse(last);
  } catch (const std::exception&) {
    throw Error("the PyTorch reference printed no JSON on its last line: " + cmd);
  }
}

}  // namespace phasekv
