// `phasekv audit` as a child process against a fake server, with the small text-kv grid the
// audit tests share (6 examples x 8 phases, 3 records in 40 tokens): its exit status and its
// stdout and stderr together.
#pragma once
#include <sys/wait.h>

#include <cstdlib>
#include <filesystem>
#include <string>

#include "util/fs.h"

namespace phasekv::test {

struct AuditCli {
  int status = -1;
  std::string log;
};

constexpr const char* kSmallAuditGrid = "--modulus 8 --examples 6 --records 3 --context-tokens 40";

inline AuditCli run_audit_cli(const std::string& endpoint, const std::string& model,
                              const std::filesystem::path& out, const std::string& extra,
                              const std::string& grid = kSmallAuditGrid) {
  std::filesystem::create_directories(out.parent_path());
  const std::string log = out.string() + ".log";
  const std::string cmd = std::string(PHASEKV_BINARY) + " audit --endpoint " + endpoint +
                          " --model " + model + " --out " + out.string() + " " + grid +
                          " --concurrency 4 --retry-base-s 0.01 --bootstrap 50"
                          " --permutations 200 " +
                          extra + " > " + log + " 2>&1";
  const int st = std::system(cmd.c_str());
  return {WIFEXITED(st) ? WEXITSTATUS(st) : -1, read_file(log)};
}

}  // namespace phasekv::test
