// `repro --plan` (issue 46): the cores it plans for are the CPU affinity's, and the side-by-side
// slowdown applies only while jobs really run side by side.
#include <gtest/gtest.h>
#include <sched.h>

#include <filesystem>
#include <string>

#include "suite/plan.h"
#include "test_util.h"
#include "util/cpu_info.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
const std::string kBin = PHASEKV_BINARY;

// One run alone is never slowed down by a neighbour; two share the machine only while both run.
TEST(Plan, TheSideBySideSlowdownAppliesOnlyWhileJobsOverlap) {
  EXPECT_DOUBLE_EQ(fifo_makespan({10}, 2, 1.5), 10.0);
  EXPECT_DOUBLE_EQ(fifo_makespan({10, 10}, 2, 1.5), 15.0);
  // 3 and 1 at half speed: the 1 ends at t = 2, the 3 has 2 left alone: t = 4.
  EXPECT_DOUBLE_EQ(fifo_makespan({3, 1}, 2, 2.0), 4.0);
  EXPECT_DOUBLE_EQ(fifo_makespan({3, 1}, 1, 2.0), 4.0);   // one slot: never side by side
  EXPECT_DOUBLE_EQ(fifo_makespan({3, 1, 1, 1}, 2), 3.0);  // no slowdown: as before
  EXPECT_THROW(fifo_makespan({1}, 2, 0.0), Error);
}

const char* kPlanBase = R"([train]
steps = 4
batch = 2
warmup = 1
threads = 1
log_every = 2
eval_every = 4
eval_examples = 4
checkpoint_every = 2
)";

const char* kPlanSuite = R"(
[suite]
name = "tiny"
base = "base.toml"
modulus = 8
examples = 2
paddings = ["prefix"]

[[run]]
name = "chunked"

[[run]]
name = "full"
model.attention = { kind = "full" }
)";

// Under `taskset -c 0` the plan saw 2 cores and projected two jobs side by side on one.
TEST(Plan, ReproPlanUsesTheCpuAffinity) {
  cpu_set_t set;
  ASSERT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  if (CPU_COUNT(&set) < 2) GTEST_SKIP() << "needs 2 usable cores to narrow them to 1";
  int first = 0;
  while (!CPU_ISSET(first, &set)) ++first;
  const fs::path dir = test::temp_dir("cli_plan");
  test::write_text(dir / "base.toml", std::string(test::kTinyModelAndTaskToml) + kPlanBase);
  test::write_text(dir / "suite.toml", kPlanSuite);
  const std::string plan = " repro --suite " + (dir / "suite.toml").string() + " --out " +
                           (dir / "out").string() + " --plan --plan-reps 1";
  const auto one = test::run_command("taskset -c " + std::to_string(first) + " " + kBin + plan);
  ASSERT_EQ(one.status, 0) << one.err;
  EXPECT_CONTAINS(one.out, "1 of ");
  EXPECT_CONTAINS(one.out, "--jobs 1 (one thread each)");
  EXPECT_CONTAINS(one.out, "(1 usable core: one thread at a time)");
  EXPECT_NOT_CONTAINS(one.out, "side by side");
  // Both cores, one run selected: still no side-by-side slowdown for a run that runs alone.
  const auto single = test::run_command(kBin + plan + " --only full");
  ASSERT_EQ(single.status, 0) << single.err;
  EXPECT_CONTAINS(single.out, "projected wall time of 1 run:");
  EXPECT_NOT_CONTAINS(single.out, "side by side");
  EXPECT_EQ(usable_cores(), CPU_COUNT(&set));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
