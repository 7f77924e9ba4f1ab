// A full disk while results and models are written (issue 20's failure drills). The phasekv binary
// runs in a child whose file size limit (RLIMIT_FSIZE, with SIGXFSZ ignored) makes a write fail
// as a full disk does: short, then EFBIG instead of ENOSPC. It works unprivileged, where a tmpfs
// or loop device would need root. The contract: exit status 2 and one line naming the file and
// the reason; no partial file left (results.jsonl keeps whole records, a model or checkpoint
// file is the previous complete one or absent); a rerun with space ends identical to a run that
// never failed.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <filesystem>
#include <functional>
#include <sstream>
#include <thread>

#include "eval/results_file.h"
#include "test_util.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

struct Exit {
  int status = -1;  // the exit status, or -signal
  std::string log;
};

// Runs the phasekv binary with `args` (stdout and stderr to `log`). `limit_bytes` > 0 caps the size
// of every file it writes from the start; `limit_when`, when given, is polled and the cap is set
// on the running process (prlimit) once it returns true.
Exit run_phasekv(const std::vector<std::string>& args, const fs::path& log, rlim_t limit_bytes,
                 const std::function<bool()>& limit_when = {}) {
  const pid_t pid = fork();
  if (pid == 0) {
    std::signal(SIGXFSZ, SIG_IGN);  // a write past the limit fails with EFBIG instead of killing
    const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, STDOUT_FILENO);
    dup2(fd, STDERR_FILENO);
    if (limit_bytes > 0 && !limit_when) {
      const rlimit lim{limit_bytes, limit_bytes};
      setrlimit(RLIMIT_FSIZE, &lim);
    }
    std::vector<char*> argv{const_cast<char*>(PHASEKV_BINARY)};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  bool limited = !limit_when;
  while (waitpid(pid, &status, limited ? 0 : WNOHANG) == 0) {
    if (limit_when()) {
      const rlimit lim{limit_bytes, limit_bytes};
      EXPECT_EQ(prlimit(pid, RLIMIT_FSIZE, &lim, nullptr), 0);
      limited = true;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : -WTERMSIG(status), test::slurp(log)};
}

TEST(DiskFull, ASweepThatCannotAppendKeepsWholeRecordsAndARerunCompletesIdentically) {
  const fs::path dir = test::temp_dir("disk_full_sweep");
  const std::vector<std::string> sweep = {
      "sweep",     "--model", std::string(PHASEKV_SOURCE_DIR) + "/models/kv-chunked",
      "--task",    "kv",      "--examples", "60", "--modulus", "8", "--padding", "prefix",
      "--threads", "1",       "--bootstrap-reps", "100", "--permutations", "100",
      "--batch",   "16",  // the unit of an append: 16 records, ~5 KiB
      "--out"};
  auto with_out = [&](const fs::path& out) {
    auto a = sweep;
    a.push_back(out.string());
    return a;
  };
  const Exit ref = run_phasekv(with_out(dir / "ref"), dir / "ref.log", 0);
  ASSERT_EQ(ref.status, 0) << ref.log;
  const auto ref_records = test::sorted_lines(dir / "ref" / "results.jsonl");
  ASSERT_EQ(ref_records.size(), 480u);

  // 16 KiB holds one batch of records, not two: the second append fails part way.
  const fs::path out = dir / "full";
  const Exit full = run_phasekv(with_out(out), dir / "full.log", 16384);
  EXPECT_EQ(full.status, 2) << full.log;
  EXPECT_CONTAINS(full.log,
                  "cannot append to " + (out / "results.jsonl").string() + ": File too large");
  const std::string text = test::slurp(out / "results.jsonl");
  ASSERT_FALSE(text.empty()) << "the first batch fits";
  EXPECT_LE(text.size(), 16384u);
  EXPECT_EQ(text.back(), '\n') << "the failed append was cut back to the last whole record";
  const ResultsFile kept = read_results((out / "results.jsonl").string());
  EXPECT_FALSE(kept.needs_repair());
  EXPECT_GT(kept.records.size(), 0u);
  EXPECT_LT(kept.records.size(), ref_records.size());
  EXPECT_FALSE(fs::exists(out / "summary.json"));

  const Exit rerun = run_phasekv(with_out(out), dir / "rerun.log", 0);
  ASSERT_EQ(rerun.status, 0) << rerun.log;
  EXPECT_EQ(test::sorted_lines(out / "results.jsonl"), ref_records);
  EXPECT_EQ(test::slurp(out / "phase.csv"), test::slurp(dir / "ref" / "phase.csv"));
  fs::remove_all(dir);
}

const std::string kTrainToml = std::string(test::kTinyModelAndTaskToml) + R"([train]
steps = 100
batch = 8
warmup = 2
threads = 1
log_every = 10
eval_every = 50
eval_examples = 16
checkpoint_every = 10
)";

TEST(DiskFull, TrainingThatCannotSaveLeavesNoPartialFileAndResumesIdentically) {
  const fs::path dir = test::temp_dir("disk_full_train");
  const fs::path config = dir / "train.toml";
  test::write_text(config, kTrainToml);
  auto train = [&](const fs::path& out, std::vector<std::string> extra = {}) {
    std::vector<std::string> a = {"train", "--config", config.string(), "--out", out.string()};
    a.insert(a.end(), extra.begin(), extra.end());
    return a;
  };
  const Exit ref = run_phasekv(train(dir / "ref"), dir / "ref.log", 0);
  ASSERT_EQ(ref.status, 0) << ref.log;
  const std::string ref_model = test::slurp(dir / "ref" / "model.safetensors");
  const auto weights_bytes = fs::file_size(dir / "ref" / "checkpoint" / "model.safetensors");
  const auto optimizer_bytes = fs::file_size(dir / "ref" / "checkpoint" / "optimizer.pt");
  ASSERT_LT(weights_bytes + 2048, optimizer_bytes);

  // 1. No room for the first checkpoint's weights: nothing is left that a resume would read.
  const fs::path a = dir / "a";
  const Exit no_room = run_phasekv(train(a), dir / "a.log", 4096);
  EXPECT_EQ(no_room.status, 2) << no_room.log;
  EXPECT_CONTAINS(
      no_room.log,
      "cannot write " + (a / "checkpoint.tmp" / "model.safetensors").string() + ": File too large");
  EXPECT_FALSE(fs::exists(a / "checkpoint"));
  EXPECT_FALSE(fs::exists(a / "model.safetensors"));
  for (const auto& f : fs::recursive_directory_iterator(a))
    EXPECT_NOT_CONTAINS(f.path().string(), ".tmp.") << "left behind: " << f.path();
  const Exit again = run_phasekv(train(a), dir / "a2.log", 0);
  ASSERT_EQ(again.status, 0) << again.log;
  EXPECT_TRUE(test::slurp(a / "model.safetensors") == ref_model) << "a rerun trains identically";

  // 2. The disk fills after the first checkpoint: a later one cannot write its optimizer state
  // (the weights fit, the optimizer does not). The complete earlier checkpoint stays, and a
  // resume from it ends with the uninterrupted run's model.
  const fs::path b = dir / "b";
  const Exit later = run_phasekv(train(b), dir / "b.log", (weights_bytes + optimizer_bytes) / 2,
                                 [&] { return fs::exists(b / "checkpoint" / "state.json"); });
  EXPECT_EQ(later.status, 2) << later.log;
  EXPECT_CONTAINS(later.log, "optimizer.pt: File too large");
  EXPECT_FALSE(fs::exists(b / "model.safetensors"));
  ASSERT_TRUE(fs::exists(b / "checkpoint" / "state.json"));
  const Exit resumed = run_phasekv(train(b, {"--resume"}), dir / "b2.log", 0);
  ASSERT_EQ(resumed.status, 0) << resumed.log;
  EXPECT_CONTAINS(resumed.log, "resumed from step");
  EXPECT_TRUE(test::slurp(b / "model.safetensors") == ref_model) << "the resumed run's model";
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
