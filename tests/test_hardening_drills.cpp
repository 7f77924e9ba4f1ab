// The kill drill of the text-rendered audit (issue 20): `phasekv audit --render text` is kill -9ed
// at random points of its records and rerun; the records and phase.csv must equal an
// uninterrupted run's byte for byte. scripts/drills.sh runs the same drill for `--render ids`
// against `phasekv serve` of a bundled model; their word tokenizers refuse the text rendering's
// words, so this one runs against the fake llama-server of the audit tests (fake_llamacpp.h),
// kept up across the kills so that its toy tokenizer's ids stay the same. (test_audit_resume.cpp kills
// a text audit of `phasekv serve` once, with a random model over the rendering's words.)
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <filesystem>
#include <random>
#include <sstream>
#include <thread>

#include <fmt/format.h>

#include "fake_llamacpp.h"
#include "test_util.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

std::string audit_command(const test::FakeLlamaServer& s, const fs::path& out) {
  // `exec`, so the pid the test kills is the audit's and not the shell's.
  return "exec " + std::string(PHASEKV_BINARY) + " audit --endpoint " + s.endpoint() +
         " --model any --render text --out " + out.string() +
         " --modulus 8 --examples 24 --records 3 --context-tokens 40 --concurrency 2"
         " --retry-base-s 0.01 --bootstrap 50 --permutations 100 >> " + out.string() +
         ".log 2>&1";
}

size_t lines_of(const fs::path& p) {
  const std::string s = test::slurp(p);
  return static_cast<size_t>(std::count(s.begin(), s.end(), '\n'));
}

// Runs `cmd` and kill -9s it once `file` holds `lines` lines; true when the kill landed (the
// run had not finished first).
bool kill_at(const std::string& cmd, const fs::path& file, size_t lines) {
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (lines_of(file) >= lines) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      return WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return false;
}

TEST(HardeningDrills, TextAuditKilledAtRandomPointsRerunsToTheSameRecords) {
  test::FakeLlamaServer server;
  server.work_ms = 2;  // so the kills land between records
  const fs::path dir = test::temp_dir("text_audit_drill");
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_EQ(std::system(audit_command(server, dir / "ref").c_str()), 0)
      << test::slurp(dir / "ref.log");
  const auto ref = test::sorted_lines(dir / "ref" / "results.jsonl");
  ASSERT_EQ(ref.size(), 24u * 8u);
  std::printf("text audit: uninterrupted run %.0f ms\n",
              std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0)
                  .count());
  const std::string ref_phase = test::slurp(dir / "ref" / "phase.csv");

  std::mt19937 rng(20);
  int landed = 0;
  for (int run = 0; run < 2; ++run) {
    const fs::path out = dir / ("run" + std::to_string(run));
    const fs::path results = out / "results.jsonl";
    // Two kills, the first in the first half of the records, the second later.
    const size_t first = 1 + rng() % (ref.size() / 2);
    const size_t second = first + 1 + rng() % (ref.size() - first - 1);
    std::string at;
    for (size_t point : {first, second}) {
      if (kill_at(audit_command(server, out), results, point)) {
        ++landed;
        at += fmt::format(" {}", lines_of(results));
        EXPECT_LT(lines_of(results), ref.size()) << "killed, yet every record is on disk";
      }
    }
    std::printf("text audit run %d: killed with%s of %zu records on disk\n", run,
                at.empty() ? " none" : at.c_str(), ref.size());
    ASSERT_EQ(std::system(audit_command(server, out).c_str()), 0) << test::slurp(out.string() + ".log");
    EXPECT_EQ(test::sorted_lines(results), ref) << "run " << run << " (kills at " << first << ", "
                                          << second << " records)";
    EXPECT_EQ(test::slurp(out / "phase.csv"), ref_phase) << "run " << run;
  }
  EXPECT_GE(landed, 2) << "most kills must land mid-run for the drill to test anything";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
