// `phasekv repro` end to end on a tiny suite: strict suite parsing, two runs side by side, every
// step's output, a rerun that skips what is done, an interrupted training resumed from its
// checkpoint, and the generated results page.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <thread>

#include "suite/plan.h"
#include "util/cpu_info.h"
#include "suite/runner.h"
#include "suite/suite.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kBin = PHASEKV_BINARY;

const std::string kBase = std::string(test::kTinyModelAndTaskToml) + R"([train]
steps = 6
batch = 4
warmup = 1
threads = 1
log_every = 2
eval_every = 6
eval_examples = 8
checkpoint_every = 2
)";

const char* kSuite = R"(
[suite]
name = "tiny"
base = "base.toml"
modulus = 8
examples = 4
paddings = ["prefix", "in_sequence"]
depths = [0.0, 1.0]

[[run]]
name = "chunked"
depth_grid = true
study = { label = "W4/S4", mean = 50.0, worst = 10.0, gap = 40.0 }

[[run]]
name = "full"
model.attention = { kind = "full" }
train = { seed = 1 }
)";

int run(const std::string& cmd, const fs::path& log) {
  return std::system((cmd + " > " + log.string() + " 2>&1").c_str());
}

TEST(Repro, SuiteParsingMergesRunsAndNamesBadKeys) {
  const fs::path dir = test::temp_dir("repro_parse");
  test::write_text(dir / "base.toml", kBase);
  test::write_text(dir / "suite.toml", kSuite);
  const Suite s = load_suite((dir / "suite.toml").string());
  ASSERT_EQ(s.runs.size(), 2u);
  EXPECT_EQ(s.runs[0].config["model"]["layers"][0]["kind"], "chunked");
  EXPECT_EQ(s.runs[1].config["model"]["layers"][0]["kind"], "full");
  EXPECT_EQ(s.runs[1].config["train"]["seed"], 1);
  EXPECT_EQ(s.runs[1].config["train"]["steps"], 6) << "unset keys come from the base";
  ASSERT_TRUE(s.runs[0].study.has_value());
  EXPECT_EQ(*s.runs[0].study->gap, 40.0);
  test::write_text(dir / "bad.toml", std::string(kSuite) + "\n[[run]]\nname = \"x\"\nmodel.attention = { strid = 2 }\n");
  try {
    load_suite((dir / "bad.toml").string());
    FAIL() << "a bad run key must fail before anything runs";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "'x'");
    EXPECT_CONTAINS(msg, "strid");
  }
  test::write_text(dir / "dup.toml", std::string(kSuite) + "\n[[run]]\nname = \"full\"\n");
  EXPECT_THROW(load_suite((dir / "dup.toml").string()), Error);
  // A stride that does not divide the modulus would fail at the run's first sweep, after its
  // training: the suite file is refused at load, so --plan and --print-commands refuse it too.
  test::write_text(dir / "s3.toml", std::string(kSuite) +
                                        "\n[[run]]\nname = \"s3\"\nmodel.attention = { stride = "
                                        "3, width = 3 }\n");
  try {
    load_suite((dir / "s3.toml").string());
    FAIL() << "stride 3 with modulus 8 must be refused at load";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "'s3': its stride 3 does not divide the suite's modulus 8");
    EXPECT_CONTAINS(msg, "e.g. 24");
  }
  // The largest stride a config allows: the suggested modulus does not overflow.
  test::write_text(dir / "huge.toml", std::string(kSuite) +
                                          "\n[[run]]\nname = \"huge\"\nmodel.attention = { "
                                          "stride = 2147483647, width = 2147483647 }\n");
  try {
    load_suite((dir / "huge.toml").string());
    FAIL() << "stride 2^31 - 1 with modulus 8 must be refused at load";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "e.g. 17179869176");
  }
  const fs::path log = dir / "plan.log";
  EXPECT_NE(run(kBin + " repro --suite " + (dir / "s3.toml").string() + " --out " +
                    (dir / "out").string() + " --plan",
                log),
            0);
  EXPECT_CONTAINS(test::slurp(log), "does not divide");
  fs::remove_all(dir);
}

TEST(Repro, RunsTheSuiteResumesAndWritesTheReport) {
  const fs::path dir = test::temp_dir("repro_run");
  test::write_text(dir / "base.toml", kBase);
  test::write_text(dir / "suite.toml", kSuite);
  const fs::path out = dir / "out";
  const std::string repro =
      kBin + " repro --suite " + (dir / "suite.toml").string() + " --out " + out.string();

  // One command per run for an external scheduler.
  ASSERT_EQ(run(kBin + " repro --suite " + (dir / "suite.toml").string() + " --out " +
                    out.string() + " --print-commands",
                dir / "print.log"),
            0);
  EXPECT_CONTAINS(test::slurp(dir / "print.log"), "--only chunked");

  ASSERT_EQ(run(repro + " --jobs 2", dir / "first.log"), 0) << test::slurp(dir / "first.log");
  for (const char* f : {"chunked/config.json", "chunked/train.done", "chunked/model/model.safetensors",
                        "chunked/sweep-prefix/summary.json", "chunked/sweep-in_sequence/summary.json",
                        "chunked/depth-0/summary.json", "chunked/depth-1/summary.json",
                        "full/sweep-prefix/summary.json", "suite.json"})
    EXPECT_TRUE(fs::exists(out / f)) << f << "\n" << test::slurp(dir / "first.log");
  EXPECT_FALSE(fs::exists(out / "full/depth-0")) << "only depth_grid runs get the grid";
  const std::string depth_meta = test::slurp(out / "chunked/depth-1/summary.json");
  EXPECT_CONTAINS(depth_meta, "\"target_depth\": 1.0");

  // A rerun skips everything.
  ASSERT_EQ(run(repro, dir / "second.log"), 0) << test::slurp(dir / "second.log");
  EXPECT_CONTAINS(test::slurp(dir / "second.log"), "0 of 2 runs to do");

  // Finished runs carry run.done, which scripts/keep-runs.sh keeps: restored on another
  // machine (here another directory), the suite has nothing left to do there.
  EXPECT_CONTAINS(test::slurp(out / "chunked/run.done"), "\"cpu\":\"" + cpu_description());
  const std::string keep = std::string("bash ") + PHASEKV_SOURCE_DIR + "/scripts/keep-runs.sh ";
  ASSERT_EQ(run(keep + "save " + out.string() + " " + (dir / "kept").string(), dir / "save.log"), 0)
      << test::slurp(dir / "save.log");
  EXPECT_CONTAINS(test::slurp(dir / "save.log"), "2 new run(s)");
  EXPECT_TRUE(fs::exists(dir / "kept/chunked.tar.xz"));
  const fs::path moved = dir / "elsewhere";
  ASSERT_EQ(run(keep + "restore " + moved.string() + " " + (dir / "kept").string(),
                dir / "restore.log"),
            0)
      << test::slurp(dir / "restore.log");
  EXPECT_FALSE(fs::exists(moved / "chunked/model/checkpoint")) << "a finished run's optimiser";
  ASSERT_EQ(run(kBin + " repro report " + moved.string() + " --out " + (dir / "M.md").string(),
                dir / "m.log"),
            0)
      << test::slurp(dir / "m.log");  // kept runs page without rerunning the suite
  EXPECT_TRUE(fs::exists(moved / "chunked/model/model.safetensors"));
  ASSERT_EQ(run(kBin + " repro --suite " + (dir / "suite.toml").string() + " --out " +
                    moved.string(),
                dir / "moved.log"),
            0)
      << test::slurp(dir / "moved.log");
  EXPECT_CONTAINS(test::slurp(dir / "moved.log"), "0 of 2 runs to do");
  ASSERT_EQ(run(keep + "save " + out.string() + " " + (dir / "kept").string(), dir / "again.log"),
            0);
  EXPECT_CONTAINS(test::slurp(dir / "again.log"), "0 new run(s)");  // kept once

  // A run whose training did not finish (no train.done) resumes from its checkpoint.
  fs::remove(out / "full/train.done");
  fs::remove_all(out / "full/sweep-prefix");
  ASSERT_EQ(run(repro + " --only full", dir / "third.log"), 0) << test::slurp(dir / "third.log");
  EXPECT_CONTAINS(test::slurp(out / "full/train.log"), "resumed from step 6");
  EXPECT_TRUE(fs::exists(out / "full/sweep-prefix/summary.json"));

  // A changed suite does not silently mix into the old directory.
  test::write_text(dir / "base.toml", std::string(kBase) + "lr = 0.01\n");
  EXPECT_NE(run(repro, dir / "changed.log"), 0);
  EXPECT_CONTAINS(test::slurp(dir / "changed.log"), "holds another config");

  // A run whose train.json does not name its CPU (trained before it did) is listed as such.
  nlohmann::json tj = nlohmann::json::parse(test::slurp(out / "full/model/train.json"));
  EXPECT_EQ(tj["runtime"]["cpu"], cpu_description());
  tj["runtime"].erase("cpu");
  test::write_text(out / "full/model/train.json", tj.dump(2));
  const fs::path md_old = dir / "REPRO-old.md";
  ASSERT_EQ(run(kBin + " repro report " + out.string() + " --out " + md_old.string(), dir / "o.log"),
            0);
  EXPECT_CONTAINS(test::slurp(md_old), "Trained on " + cpu_description() + ": chunked; not "
                                       "recorded (trained before train.json named it): full.");
  tj["runtime"]["cpu"] = cpu_description();
  test::write_text(out / "full/model/train.json", tj.dump(2));

  // The page: one row per run and padding, the study's figure beside its row, the findings.
  const fs::path md = dir / "REPRO.md";
  ASSERT_EQ(run(kBin + " repro report " + out.string() + " --out " + md.string(), dir / "r.log"), 0)
      << test::slurp(dir / "r.log");
  const std::string page = test::slurp(md);
  EXPECT_CONTAINS(page, "| chunked | W4/S4 | prefix |");
  EXPECT_CONTAINS(page, "| full | full | in_sequence |");
  EXPECT_CONTAINS(page, "50.0 / 10.0 / 40.0 (W4/S4)");
  EXPECT_CONTAINS(page, "Full-attention controls have no significant period");
  EXPECT_CONTAINS(page, "Trained on " + cpu_description() + ".\n");  // one CPU: no run list
  EXPECT_TRUE(fs::exists(dir / "REPRO" / "chunked.svg"));
  EXPECT_TRUE(fs::exists(dir / "REPRO" / "chunked-depth.svg"));
  fs::remove_all(dir);
}

// The child processes of `pid` (Linux: /proc/PID/task/PID/children).
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

// Running or sleeping: not gone and not a zombie waiting for its reaper.
bool alive(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return false;
  const auto close = stat.rfind(')');
  return close != std::string::npos && close + 2 < stat.size() && stat[close + 2] != 'Z';
}

// kill -9 of `repro` alone (not its process group): the training it started must not run on.
TEST(Repro, AKilledReproLeavesNoTrainingRunning) {
  const fs::path dir = test::temp_dir("repro_orphans");
  std::string base = kBase;
  base.replace(base.find("steps = 6"), 9, "steps = 100000");
  test::write_text(dir / "base.toml", base);
  test::write_text(dir / "suite.toml", kSuite);
  const std::string suite = (dir / "suite.toml").string(), out = (dir / "out").string(),
                    log = (dir / "repro.log").string();
  const pid_t repro = fork();
  ASSERT_GE(repro, 0);
  if (repro == 0) {
    freopen(log.c_str(), "w", stderr);
    execl(kBin.c_str(), kBin.c_str(), "repro", "--suite", suite.c_str(), "--out", out.c_str(),
          "--jobs", "1", "--only", "chunked", static_cast<char*>(nullptr));
    _exit(127);
  }
  std::vector<pid_t> kids;
  for (int i = 0; i < 300 && kids.empty(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    kids = children_of(repro);
  }
  ASSERT_FALSE(kids.empty()) << "repro started no child in 15 s\n" << test::slurp(log);
  kill(repro, SIGKILL);
  int status = 0;
  waitpid(repro, &status, 0);
  for (pid_t k : kids) {
    bool gone = false;
    for (int i = 0; i < 200 && !gone; ++i) {
      gone = !alive(k);
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_TRUE(gone) << "child " << k << " of the killed repro still runs";
    if (!gone) kill(k, SIGKILL);
  }
  fs::remove_all(dir);
}

// The steps' command lines, word for word: a suite resumed by a later build must run the same
// commands (suite/commands.h builds them, for the runner and for `mitigations commands`).
TEST(Repro, StepsRunTheSameCommandLines) {
  const fs::path dir = test::temp_dir("repro-steps");
  write_file_atomic((dir / "base.toml").string(), kBase);
  write_file_atomic((dir / "suite.toml").string(), kSuite);
  const Suite s = load_suite((dir / "suite.toml").string());
  const SuiteOptions o{"/o u t", "/bin/phasekv", 1, {}, nullptr};
  const std::vector<SuiteStep> steps = run_steps(s, s.runs[0], o);
  std::string got;
  for (const auto& st : steps) {
    got += st.label + " " + st.done_marker + " " + st.log + "\n";
    for (const auto& a : st.argv) got += "[" + a + "]";
    got += "\n";
  }
  const std::string sweep =
      "[/bin/phasekv][sweep][--model][/o u t/chunked/model][--task][kv][--examples][4]"
      "[--modulus][8][--padding]";
  EXPECT_EQ(
      got,
      "train /o u t/chunked/train.done /o u t/chunked/train.log\n"
      "[/bin/phasekv][train][--config][/o u t/chunked/config.json][--out]"
      "[/o u t/chunked/model]\n"
      "sweep-prefix /o u t/chunked/sweep-prefix/summary.json /o u t/chunked/sweep-prefix.log\n" +
          sweep + "[prefix][--seed][0][--threads][1][--out][/o u t/chunked/sweep-prefix]\n" +
          "sweep-in_sequence /o u t/chunked/sweep-in_sequence/summary.json "
          "/o u t/chunked/sweep-in_sequence.log\n" +
          sweep +
          "[in_sequence][--seed][0][--threads][1][--out][/o u t/chunked/sweep-in_sequence]\n" +
          "depth-0 /o u t/chunked/depth-0/summary.json /o u t/chunked/depth-0.log\n" + sweep +
          "[prefix][--seed][0][--threads][1][--out][/o u t/chunked/depth-0][--target-depth][0]\n" +
          "depth-1 /o u t/chunked/depth-1/summary.json /o u t/chunked/depth-1.log\n" + sweep +
          "[prefix][--seed][0][--threads][1][--out][/o u t/chunked/depth-1][--target-depth][1]\n");
  // A checkpoint: the train step resumes.
  fs::create_directories(dir / "out" / "chunked" / "model" / "checkpoint");
  const SuiteOptions resumed{(dir / "out").string(), "/bin/phasekv", 1, {}, nullptr};
  EXPECT_EQ(run_steps(s, s.runs[0], resumed).front().argv.back(), "--resume");
}

TEST(Repro, PlanProjectsEveryStepOfARunAndSchedulesRunsLikeTheRunner) {
  const fs::path dir = test::temp_dir("repro-plan");
  write_file_atomic((dir / "base.toml").string(), kBase + "induction_steps = 2\n");
  write_file_atomic((dir / "suite.toml").string(), kSuite);
  const Suite s = load_suite((dir / "suite.toml").string());
  const RunCost c{0.5, 2.0, 0.01};
  // chunked: 2 warm-up steps, 4 task steps, one evaluation of 8 examples (steps 6, eval_every 6);
  // sweeps: 2 paddings + 2 depths, each 4 examples x 8 phases.
  const RunProjection p = project_run(s, s.runs[0], c);
  EXPECT_DOUBLE_EQ(p.train_s, 2 * 0.5 + 4 * 2.0 + 8 * 0.01);
  EXPECT_DOUBLE_EQ(p.sweeps_s, 4 * 4 * 8 * 0.01);
  EXPECT_DOUBLE_EQ(project_run(s, s.runs[1], c).sweeps_s, 2 * 4 * 8 * 0.01);  // no depth grid
  // In order, each run to the first free slot: 3 | 1 1 1 -> 3; 1 1 1 | 3 -> 4.
  EXPECT_DOUBLE_EQ(fifo_makespan({3, 1, 1, 1}, 2), 3.0);
  EXPECT_DOUBLE_EQ(fifo_makespan({1, 1, 1, 3}, 2), 4.0);
  EXPECT_DOUBLE_EQ(fifo_makespan({1, 1, 1, 3}, 1), 6.0);
  EXPECT_THROW(fifo_makespan({1}, 0), Error);
}

TEST(Repro, PlanTimesEveryRunAndPrintsBothProjections) {
  const fs::path dir = test::temp_dir("repro-plan-cli");
  write_file_atomic((dir / "base.toml").string(), kBase);
  write_file_atomic((dir / "suite.toml").string(), kSuite);
  ASSERT_EQ(run(kBin + " repro --suite " + (dir / "suite.toml").string() + " --out " +
                    (dir / "out").string() + " --plan --plan-reps 1",
                dir / "plan.log"),
            0)
      << test::slurp(dir / "plan.log");
  const std::string out = test::slurp(dir / "plan.log");
  EXPECT_CONTAINS(out, "chunked");
  EXPECT_CONTAINS(out, "full");
  EXPECT_CONTAINS(out, "projected wall time of 2 runs");
  EXPECT_FALSE(fs::exists(dir / "out" / "chunked" / "model")) << "--plan must train nothing";
}

}  // namespace
}  // namespace phasekv
