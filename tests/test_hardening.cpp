// Regression tests for the red-team findings of issue 20 (hostile configs, flags and runs): a
// port already in use, unbounded sizes and thread counts, integers that wrap, training output
// safety, errors that name nothing, and smaller ones.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <regex>
#include <string>

#include "config/model_config.h"
#include "eval/results_file.h"
#include "model/model_dir.h"
#include "suite/suite.h"
#include "test_util.h"
#include "train/train_config.h"
#include "train/trainer.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
const std::string kBin = PHASEKV_BINARY;

struct CmdResult {
  int status = -1;  // exit status; 128 + signal when killed
  std::string err;  // stderr and stdout together
};

// `phasekv ARGS` under a 30 s timeout, by SIGKILL (a server with thousands of threads ignored
// SIGTERM): a command that should have failed must not hang the test.
CmdResult phasekv(const std::string& args, const fs::path& dir) {
  const fs::path log = dir / "cmd.log";
  const std::string cmd =
      "timeout -s KILL 30 " + kBin + " " + args + " > " + log.string() + " 2>&1";
  const int st = std::system(cmd.c_str());
  CmdResult r;
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
  r.err = test::slurp(log);
  return r;
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

// A tiny training config (trains 12 steps in well under a second).
const std::string kTrainToml = std::string(test::kTinyModelAndTaskToml) + R"([train]
steps = 12
batch = 4
lr = 0.003
warmup = 1
seed = 5
threads = 1
log_every = 2
eval_every = 6
eval_examples = 8
checkpoint_every = 4
)";

// kTrainToml with `line` replacing the line that starts with the same key.
std::string toml_with(const std::string& line) {
  const std::string key = line.substr(0, line.find(' '));
  return std::regex_replace(std::string(kTrainToml), std::regex("\n" + key + " = [^\n]*\n"),
                            "\n" + line + "\n");
}

fs::path write_toml(const fs::path& dir, const std::string& text, const std::string& name) {
  const fs::path p = dir / name;
  test::write_text(p, text);
  return p;
}

// A model directory for `serve`.
fs::path tiny_model(const fs::path& dir) {
  const fs::path m = dir / "model";
  const CmdResult r = phasekv(
      "init --config " + (fs::path(PHASEKV_SOURCE_DIR) / "configs/tiny-chunked.json").string() +
          " --out " + m.string(),
      dir);
  EXPECT_EQ(r.status, 0) << r.err;
  return m;
}

// A sweep needs a trained model's task.json: the bundled kv-chunked (stride 4).
fs::path kv_chunked() { return fs::path(PHASEKV_SOURCE_DIR) / "models" / "kv-chunked"; }

// ---- item 2: a port in use ----------------------------------------------------------------

// httplib's default SO_REUSEPORT let a second server bind a listening port and the kernel split
// connections between the two models. The second one must fail.
TEST(HardeningServe, SecondServerOnAPortInUseFails) {
  const fs::path dir = test::temp_dir("hard_port");
  const fs::path model = tiny_model(dir);
  test::ServeProcess first(kBin, model.string(), dir / "first.log");
  ASSERT_FALSE(first.endpoint().empty()) << first.log();
  const std::string port = first.endpoint().substr(first.endpoint().rfind(':') + 1);
  const CmdResult second = phasekv(
      "serve --model " + model.string() + " --port " + port + " --torch-threads 1", dir);
  EXPECT_NE(second.status, 0) << second.err;
  EXPECT_NE(second.status, 124) << "the second server ran until the timeout: " << second.err;
  EXPECT_CONTAINS(second.err, "address in use");
  EXPECT_CONTAINS(second.err, ":" + port);
  EXPECT_EQ(first.stop(), 0) << first.log();
  fs::remove_all(dir);
}

// ---- item 3: unbounded allocation before validation -----------------------------------------

// The sweep generated 10^9 (example, phase) items (3 GB of RSS) before any error; the limits are
// now checked before the first item exists.
TEST(HardeningSizes, AHugePhaseGridIsRefusedBeforeAnyAllocation) {
  const fs::path dir = test::temp_dir("hard_grid");
  const std::string base = "--model " + kv_chunked().string() +
                           " --task kv --padding prefix --threads 1 --out " + (dir / "s").string();
  struct Case {
    std::string flags, message;
  };
  const std::vector<Case> cases = {
      {"--examples 1 --modulus 1000000000", "--modulus is 1000000000 (allowed: 1..4096"},
      {"--examples 1000000000 --modulus 8", "--examples is 1000000000 (allowed: 1..100000)"},
      {"--examples 100000 --modulus 4096", "is 409600000 items (allowed: at most 10000000"},
  };
  for (const auto& c : cases) {
    const CmdResult r = phasekv("sweep " + base + " " + c.flags, dir);
    EXPECT_EQ(r.status, 2) << c.flags << "\n" << r.err;
    EXPECT_CONTAINS(r.err, c.message) << c.flags << "\n" << r.err;
    EXPECT_FALSE(fs::exists(dir / "s" / "results.jsonl")) << c.flags;
  }
  fs::remove_all(dir);
}

// A config.json with d_ff = 2^21 over the tiny model's weights allocated 2.9 GB before the
// shape-mismatch error; d_ff = 2^30 ended as "internal tensor error: can't allocate".
TEST(HardeningSizes, AConfigLargerThanItsWeightsFailsBeforeTheModelIsBuilt) {
  const fs::path dir = test::temp_dir("hard_dff");
  const fs::path model = tiny_model(dir);
  const fs::path cfg = model / "config.json";
  json j = json::parse(test::slurp(cfg));
  j["d_ff"] = 1 << 21;
  write_file_atomic(cfg.string(), j.dump());
  try {
    load_model_dir(model.string());
    ADD_FAILURE() << "d_ff 2^21 loaded";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), cfg.string() + ": its sizes imply at least");
    EXPECT_CONTAINS(e.what(), "model.safetensors holds");
  }
  j["d_ff"] = 1 << 30;
  write_file_atomic(cfg.string(), j.dump());
  const CmdResult r = phasekv("logits --model " + model.string() + " --tokens 1,2", dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "allowed: at most 2147483648");
  EXPECT_NOT_CONTAINS(r.err, "internal");
  fs::remove_all(dir);
}

TEST(HardeningSizes, ATrainBatchBeyondTheLimitIsRefused) {
  const fs::path dir = test::temp_dir("hard_batch");
  const fs::path p = write_toml(dir, toml_with("batch = 1000000000"), "t.toml");
  try {
    train_config_from_file(p.string());
    ADD_FAILURE() << "batch = 1000000000 accepted";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "'batch' is 1000000000 (allowed: 1..4096)");
  }
  EXPECT_NO_THROW(train_config_from_file(write_toml(dir, toml_with("batch = 4096"), "t.toml")));
  fs::remove_all(dir);
}

// ---- found by fuzzing (fuzz/, scripts/fuzz.sh) ----------------------------------------------

// nlohmann reports a number beyond a double as out_of_range (406), not parse_error: every reader
// caught only parse_error, so "32e4444444" in task.json escaped as an unexplained exception.
TEST(HardeningFuzz, ANumberBeyondADoubleIsAnErrorNamingTheFile) {
  const fs::path dir = test::temp_dir("hard_bignum");
  const fs::path task = dir / "task.json", cfg = dir / "config.json", res = dir / "results.jsonl";
  test::write_text(task, R"({"n_records": 32e4444444})");
  test::write_text(cfg, R"({"d_model": 1e99999})");
  test::write_text(res, "{\"phase\": 1e99999}\n{}\n");
  for (const fs::path& p : {task, cfg}) {
    try {
      p == task ? (void)read_json_file(p.string()) : (void)model_config_from_file(p.string());
      ADD_FAILURE() << p << ": no error";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), p.string());
    }
  }
  try {
    read_results(res.string());
    ADD_FAILURE() << "results.jsonl: no error";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), res.string() + " line 1");
  }
  fs::remove_all(dir);
}

// A long fuzzing run (docs/RELIABILITY.md) found {"n_layers": 284184166}: the per-layer configs
// were built before validate(), 25 GB of them
// (fuzz/corpus/fuzz_model_config/finding-n-layers-oom.json).
TEST(HardeningFuzz, AHugeLayerCountIsRefusedBeforeAnyLayerIsBuilt) {
  const json tiny =
      json::parse(test::slurp(fs::path(PHASEKV_SOURCE_DIR) / "configs/tiny-chunked.json"));
  auto error_of = [](const json& j) {
    return test::error_of([&] { model_config_from_json(j, "cfg.json"); });
  };
  json j = tiny;
  j["n_layers"] = 2147483647;
  EXPECT_EQ(error_of(j), "cfg.json: key 'n_layers' is 2147483647 (allowed: 1..1024)");
  j["n_layers"] = 1025;
  j["layers"] = json::array();
  for (int i = 0; i < 1025; ++i) j["layers"].push_back(json::object());
  EXPECT_EQ(error_of(j), "cfg.json: key 'layers' has 1025 entries (allowed: 1..1024)");
  j = tiny;
  j["n_layers"] = 1024;  // the bound is allowed
  EXPECT_EQ(model_config_from_json(j, "cfg.json").layers.size(), 1024u);
}

// The same long run found a suite whose `base` names a file with a 300-byte name: the existence
// check threw std::filesystem::error ("File name too long") instead of an error of the suite
// (fuzz/corpus/fuzz_suite/finding-base-name-too-long.toml).
TEST(HardeningFuzz, AConfigNameTooLongIsAnErrorNamingTheFile) {
  const fs::path dir = test::temp_dir("hard_longname");
  const std::string base = std::string(300, 'b') + ".toml";
  test::write_text(dir / "suite.toml", "[suite]\nname = \"s\"\nbase = \"" + base + "\"\n");
  try {
    load_suite((dir / "suite.toml").string());
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()), (dir / base).string() + ": File name too long");
  }
  EXPECT_TRUE(test::throws_containing([&] { train_config_from_file((dir / base).string()); },
                                      "File name too long"));
  fs::remove_all(dir);
}

// ---- item 4: thread counts ----------------------------------------------------------------

TEST(HardeningThreads, FlagsOutOfRangeAreRefusedNamingTheFlagAndRange) {
  const fs::path dir = test::temp_dir("hard_threads");
  const fs::path model = tiny_model(dir);
  const std::string m = " --model " + model.string();
  struct Case {
    std::string args, flag;
  };
  const std::vector<Case> cases = {
      {"sweep" + m + " --task kv --examples 1 --modulus 4 --padding prefix --out " + (dir / "s").string() + " --threads 100000",
       "--threads"},
      {"sweep" + m + " --task kv --examples 1 --modulus 4 --padding prefix --out " + (dir / "s").string() + " --threads -2",
       "--threads"},
      {"serve" + m + " --port 0 --threads -3", "--threads"},
      // --torch-threads, serve's older name, is an alias: refused under the flag's name.
      {"serve" + m + " --port 0 --torch-threads 100000", "--threads"},
      {"serve" + m + " --port 0 --torch-threads 1 --http-threads 100000", "--http-threads"},
      {"serve" + m + " --port 0 --torch-threads 1 --http-threads -1", "--http-threads"},
  };
  for (const auto& c : cases) {
    const CmdResult r = phasekv(c.args, dir);
    EXPECT_NE(r.status, 0) << c.args << "\n" << r.err;
    EXPECT_NE(r.status, 124) << c.args << ": ran until the timeout\n" << r.err;
    EXPECT_CONTAINS(r.err, c.flag) << c.args << "\n" << r.err;
    EXPECT_TRUE(has(r.err, "allowed: 0..") || has(r.err, "range 1 to 1024")) << c.args << "\n"
                                                                             << r.err;
  }
  // In range still works: serve --torch-threads 1 is what every serve test uses.
  fs::remove_all(dir);
}

TEST(HardeningThreads, TomlThreadsOutOfRangeAreRefused) {
  const fs::path dir = test::temp_dir("hard_toml_threads");
  for (const char* v : {"threads = -3", "threads = 100000"}) {
    const fs::path p = write_toml(dir, toml_with(v), "t.toml");
    try {
      train_config_from_file(p.string());
      ADD_FAILURE() << v << ": no error";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "'threads'");
      EXPECT_CONTAINS(e.what(), "allowed: 0..");
    }
  }
  EXPECT_NO_THROW(train_config_from_file(write_toml(dir, toml_with("threads = 0"), "t.toml")));
  fs::remove_all(dir);
}

// ---- item 5: integers of 2^32 and more ----------------------------------------------------

TEST(HardeningIntegers, ModelConfigVocabOf2To32Plus85IsAnErrorNotVocab85) {
  json j = json::parse(test::slurp(fs::path(PHASEKV_SOURCE_DIR) / "configs/tiny-chunked.json"));
  j["vocab_size"] = (int64_t{1} << 32) + 85;
  const fs::path dir = test::temp_dir("hard_vocab");
  write_file_atomic((dir / "config.json").string(), j.dump());
  try {
    const ModelConfig c = model_config_from_file((dir / "config.json").string());
    ADD_FAILURE() << "read as vocab_size " << c.vocab_size;
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "vocab_size");
    EXPECT_CONTAINS(e.what(), "4294967381");
  }
  fs::remove_all(dir);
}

TEST(HardeningIntegers, TomlStepsAndSeedOutOfRangeNameTheValueAsWritten) {
  const fs::path dir = test::temp_dir("hard_toml_ints");
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"steps = 4294967297", "4294967297"},
      {"seed = -1", "-1"},
      {"batch = 4294967300", "4294967300"},
      {"seed = 18446744073709551615", ""},  // beyond TOML's int64: a parse error is fine
  };
  for (const auto& [line, value] : cases) {
    const fs::path p = write_toml(dir, toml_with(line), "t.toml");
    try {
      const TrainConfig c = train_config_from_file(p.string());
      ADD_FAILURE() << line << ": accepted (steps " << c.train.steps << ", seed " << c.train.seed
                    << ")";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), value) << line << ": " << e.what();
      if (!value.empty()) {
        EXPECT_CONTAINS(e.what(), line.substr(0, line.find(' ')));
      }
    }
  }
  fs::remove_all(dir);
}

TEST(HardeningIntegers, CliIntegersDoNotWrap) {
  const fs::path dir = test::temp_dir("hard_cli_ints");
  const std::string cfg = (fs::path(PHASEKV_SOURCE_DIR) / "configs/tiny-chunked.json").string();
  // A uint64_t flag: CLI11 reads "-1" as 2^64 - 1.
  CmdResult r = phasekv("init --config " + cfg + " --out " + (dir / "m").string() + " --seed -1", dir);
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "--seed");
  EXPECT_CONTAINS(r.err, "-1");
  EXPECT_FALSE(fs::exists(dir / "m"));
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  r = phasekv("train --config " + toml.string() + " --out " + (dir / "t").string() +
                  " --steps 4294967297",
              dir);
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "4294967297");
  EXPECT_FALSE(fs::exists(dir / "t" / "model.safetensors"));
  fs::remove_all(dir);
}

// ---- item 8: training output safety -------------------------------------------------------

std::string train_args(const fs::path& toml, const fs::path& out) {
  return "train --config " + toml.string() + " --out " + out.string();
}

int log_lines(const fs::path& out) {
  const std::string text = test::slurp(out / "train_log.jsonl");
  return static_cast<int>(std::count(text.begin(), text.end(), '\n'));
}

// `--seed N` replicates a config's run with another seed: train.json records the seed that ran, so
// a resume must give it again (without it the config differs in train.seed, named).
TEST(HardeningTrain, SeedOverrideIsRecordedAndNeededOnResume) {
  const fs::path dir = test::temp_dir("hard_seed");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  CmdResult r = phasekv(train_args(toml, dir / "out") + " --seed 7", dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const auto provenance = nlohmann::json::parse(test::slurp(dir / "out" / "train.json"));
  EXPECT_EQ(provenance["train"]["seed"], 7);
  r = phasekv(train_args(toml, dir / "out") + " --resume --seed 7", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  r = phasekv(train_args(toml, dir / "out") + " --resume", dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "train.seed");
  fs::remove_all(dir);
}

TEST(HardeningTrain, StepsBelowOneAreRejected) {
  const fs::path dir = test::temp_dir("hard_steps");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  for (const char* s : {"0", "-1"}) {
    const CmdResult r = phasekv(train_args(toml, dir / "out") + " --steps " + s, dir);
    EXPECT_EQ(r.status, 2) << s << ": " << r.err;
    EXPECT_CONTAINS(r.err, "--steps is " + std::string(s));
    EXPECT_FALSE(fs::exists(dir / "out" / "model.safetensors")) << s;
  }
  fs::remove_all(dir);
}

TEST(HardeningTrain, AFinishedModelIsNotOverwrittenWithoutForce) {
  const fs::path dir = test::temp_dir("hard_overwrite");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  CmdResult r = phasekv(train_args(toml, out), dir);
  ASSERT_EQ(r.status, 0) << r.err;
  const std::string weights = test::slurp(out / "model.safetensors");
  ASSERT_FALSE(weights.empty());
  // Another seed would silently replace the model.
  const fs::path other = write_toml(dir, toml_with("seed = 6"), "other.toml");
  r = phasekv(train_args(other, out), dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "already holds a finished model");
  EXPECT_CONTAINS(r.err, "--force");
  EXPECT_EQ(test::slurp(out / "model.safetensors"), weights) << "the model was replaced";
  // --force trains afresh and replaces it.
  r = phasekv(train_args(other, out) + " --force", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_NE(test::slurp(out / "model.safetensors"), weights);
  EXPECT_EQ(log_lines(out), 6);
  EXPECT_CONTAINS(test::slurp(out / "train.json"), "\"seed\": 6");
  r = phasekv(train_args(other, out) + " --force --resume", dir);
  EXPECT_EQ(r.status, 2) << r.err;
  fs::remove_all(dir);
}

// A training in progress holds OUT/.lock (util/fs.h DirLock): a second `train` into the same OUT,
// --force or --resume included, is refused before it clears or writes anything.
TEST(HardeningTrain, ASecondTrainingIntoARunningOneIsRefused) {
  const fs::path dir = test::temp_dir("hard_lock");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  ASSERT_EQ(phasekv(train_args(toml, out), dir).status, 0);
  const std::string weights = test::slurp(out / "model.safetensors");
  {
    const DirLock running(out.string());  // what the first training holds while it runs
    for (const char* extra : {"", " --force", " --resume"}) {
      const CmdResult r = phasekv(train_args(toml, out) + extra, dir);
      EXPECT_EQ(r.status, 2) << extra << ": " << r.err;
      EXPECT_CONTAINS(r.err, "is in use by another run");
      EXPECT_EQ(test::slurp(out / "model.safetensors"), weights) << extra;
      EXPECT_EQ(log_lines(out), 6) << extra;
    }
  }
  EXPECT_EQ(phasekv(train_args(toml, out) + " --force", dir).status, 0) << "the lock is released";
  fs::remove_all(dir);
}

// --resume of a finished run trains nothing and reports the run's last logged figures, the same
// summary line the run itself printed (it printed "loss 0, eval acc 0, 0 tokens/s").
TEST(HardeningTrain, ResumingAFinishedRunReportsItsFiguresNotZeros) {
  const fs::path dir = test::temp_dir("hard_resume_done");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  auto summary = [](const std::string& log) {
    const size_t at = log.find("trained ");
    return at == std::string::npos ? std::string() : log.substr(at, log.find('\n', at) - at);
  };
  const CmdResult first = phasekv(train_args(toml, out), dir);
  ASSERT_EQ(first.status, 0) << first.err;
  const CmdResult again = phasekv(train_args(toml, out) + " --resume", dir);
  ASSERT_EQ(again.status, 0) << again.err;
  ASSERT_FALSE(summary(first.err).empty()) << first.err;
  EXPECT_EQ(summary(again.err), summary(first.err));
  EXPECT_NOT_CONTAINS(summary(again.err), "loss 0,") << again.err;
  EXPECT_EQ(log_lines(out), 6) << "nothing was trained or logged again";
  fs::remove_all(dir);
}

TEST(HardeningTrain, ACheckpointIsNotOverwrittenWithoutForce) {
  const fs::path dir = test::temp_dir("hard_ckpt");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  const TrainConfig cfg = train_config_from_file(toml.string());
  train(cfg, out.string(), false, /*stop_after=*/5);  // killed after step 5: a step-4 checkpoint
  ASSERT_TRUE(fs::exists(out / "checkpoint"));
  ASSERT_FALSE(fs::exists(out / "model.safetensors"));
  EXPECT_TRUE(test::throws_containing([&] { train(cfg, out.string(), false); },
                                      "already holds a checkpoint"));
  const CmdResult r = phasekv(train_args(toml, out), dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "--resume");
  // The checkpoint is intact: resuming reaches the end.
  const CmdResult resumed = phasekv(train_args(toml, out) + " --resume", dir);
  EXPECT_EQ(resumed.status, 0) << resumed.err;
  EXPECT_CONTAINS(resumed.err, "resumed from step 4");
  EXPECT_EQ(log_lines(out), 6);
  fs::remove_all(dir);
}

TEST(HardeningTrain, AResumeWithAChangedConfigIsRefusedNamingTheKey) {
  const fs::path dir = test::temp_dir("hard_resume_cfg");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  const TrainConfig cfg = train_config_from_file(toml.string());
  train(cfg, out.string(), false, /*stop_after=*/5);
  const std::string train_json = test::slurp(out / "train.json");
  struct Case {
    std::string line, key;
  };
  for (const auto& c : std::vector<Case>{{"lr = 0.01", "train.lr"},
                                         {"batch = 8", "train.batch"},
                                         {"d_model = 32", "model.d_model"},
                                         {"n_records = 3", "task.n_records"}}) {
    const fs::path changed = write_toml(dir, toml_with(c.line), "changed.toml");
    const CmdResult r = phasekv(train_args(changed, out) + " --resume", dir);
    EXPECT_EQ(r.status, 2) << c.line << ": " << r.err;
    EXPECT_CONTAINS(r.err, c.key) << c.line << ": " << r.err;
    EXPECT_EQ(test::slurp(out / "train.json"), train_json) << c.line << ": train.json rewritten";
  }
  // The step count may change (a run extended), from the flag or the file.
  const fs::path longer = write_toml(dir, toml_with("steps = 14"), "longer.toml");
  CmdResult r = phasekv(train_args(longer, out) + " --resume", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(log_lines(out), 7);
  r = phasekv(train_args(toml, out) + " --resume --steps 16", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(log_lines(out), 8);
  fs::remove_all(dir);
}

// ---- item 9: errors that name nothing --------------------------------------------------------

// NaN passes `lr <= 0`, so `lr = nan` reached the optimizer and ended as "internal tensor error"
// (exit 3). Every float key of [train] must be finite and in range, and the error name the key.
TEST(HardeningConfig, TomlFloatKeysMustBeFiniteAndInRange) {
  const fs::path dir = test::temp_dir("hard_toml_floats");
  const std::string train = "[train]\nsteps = 12\nbatch = 4\nthreads = 1\n";
  struct Case {
    std::string line, key, shown, allowed;
  };
  const std::vector<Case> cases = {
      {"lr = nan", "lr", "is nan", "a finite number > 0"},
      {"lr = inf", "lr", "is inf", "a finite number > 0"},
      {"lr = -0.001", "lr", "is -0.001", "a finite number > 0"},
      {"min_lr_ratio = nan", "min_lr_ratio", "is nan", "[0, 1]"},
      {"min_lr_ratio = 1.5", "min_lr_ratio", "is 1.5", "[0, 1]"},
      {"weight_decay = -inf", "weight_decay", "is -inf", ">= 0"},
      {"weight_decay = -0.1", "weight_decay", "is -0.1", ">= 0"},
      {"beta1 = nan", "beta1", "is nan", "[0, 1)"},
      {"beta2 = 1.0", "beta2", "is 1.0", "[0, 1)"},
      {"clip = nan", "clip", "is nan", ">= 0"},
      {"clip = -1.0", "clip", "is -1.0", ">= 0"},
      {"repeat_fraction = nan", "repeat_fraction", "is nan", "[0, 1]"},
      {"in_sequence_padding = 1.5", "in_sequence_padding", "is 1.5", "[0, 1]"},
      {"in_sequence_padding = nan", "in_sequence_padding", "is nan", "[0, 1]"},
  };
  for (const auto& c : cases) {
    const fs::path p = write_toml(
        dir, std::string(test::kTinyModelAndTaskToml) + train + c.line + "\n", "t.toml");
    try {
      train_config_from_file(p.string());
      ADD_FAILURE() << c.line << ": accepted";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), "key '" + c.key + "' " + c.shown) << c.line << ": " << e.what();
      EXPECT_CONTAINS(e.what(), c.allowed) << c.line << ": " << e.what();
    }
  }
  // The command line: a config error (exit 2) naming the key, not an internal error (exit 3).
  const fs::path p = write_toml(dir, toml_with("lr = nan"), "nan.toml");
  const CmdResult r = phasekv(train_args(p, dir / "out"), dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "key 'lr' is nan");
  EXPECT_NOT_CONTAINS(r.err, "internal");
  fs::remove_all(dir);
}

// Damage one checkpoint file, resume, and expect a config-style error (exit 2) naming the file.
struct Damage {
  std::string file, what;                    // the checkpoint file and how it is damaged
  std::function<void(std::string&)> damage;  // applied to its bytes
  std::vector<std::string> expect;           // in the error
};

void expect_resume_refused(const fs::path& dir, const fs::path& toml, const fs::path& out,
                           const Damage& d) {
  const fs::path ckpt = out / "checkpoint", saved = dir / "checkpoint.saved";
  fs::remove_all(ckpt);
  fs::copy(saved, ckpt);
  std::string bytes = test::slurp(ckpt / d.file);
  d.damage(bytes);
  test::write_text(ckpt / d.file, bytes);
  const CmdResult r = phasekv(train_args(toml, out) + " --resume", dir);
  EXPECT_EQ(r.status, 2) << d.file << " " << d.what << ": " << r.err;
  EXPECT_CONTAINS(r.err, (ckpt / d.file).string()) << d.file << " " << d.what << ": " << r.err;
  for (const auto& e : d.expect) EXPECT_CONTAINS(r.err, e) << d.what << ": " << r.err;
  EXPECT_FALSE(fs::exists(out / "model.safetensors")) << d.what << ": the run went on";
}

void flip_middle_byte(std::string& b) { b[b.size() / 2] ^= 0x5a; }
void cut_in_half(std::string& b) { b.resize(b.size() / 2); }

// A truncated optimizer.pt gave a PytorchStreamReader message naming no file, flipped bytes in it
// loaded silently, a corrupt state.json error did not name the file: each is now exit 2 with the
// file and what is wrong, the binary files caught by the checksums state.json carries.
TEST(HardeningTrain, ACorruptCheckpointIsRefusedNamingTheFile) {
  const fs::path dir = test::temp_dir("hard_ckpt_corrupt");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  train(train_config_from_file(toml.string()), out.string(), false, /*stop_after=*/5);
  const json state = json::parse(test::slurp(out / "checkpoint" / "state.json"));
  ASSERT_TRUE(state.contains("checksums")) << state.dump();
  fs::copy(out / "checkpoint", dir / "checkpoint.saved");
  const std::vector<Damage> cases = {
      {"optimizer.pt", "flipped", flip_middle_byte, {"does not match its checksum", "corrupt"}},
      {"optimizer.pt", "truncated", cut_in_half, {"bytes but", "truncated"}},
      {"model.safetensors", "flipped", flip_middle_byte, {"does not match its checksum"}},
      {"model.safetensors", "truncated", cut_in_half, {"truncated"}},
      {"state.json", "truncated", cut_in_half, {"not valid JSON"}},
      {"state.json", "rng replaced",
       [](std::string& b) { b = json{{"step", 4}, {"rng", "x"}}.dump(); },
       {"'rng'"}},
  };
  for (const auto& d : cases) expect_resume_refused(dir, toml, out, d);
  fs::remove_all(dir);
}

// A checkpoint from before the checksums still resumes, with a warning; a truncated optimizer.pt
// in one still names the file instead of ending as an internal error.
TEST(HardeningTrain, ACheckpointWithoutChecksumsLoadsWithAWarning) {
  const fs::path dir = test::temp_dir("hard_ckpt_old");
  const fs::path toml = write_toml(dir, kTrainToml, "t.toml");
  const fs::path out = dir / "out";
  train(train_config_from_file(toml.string()), out.string(), false, /*stop_after=*/5);
  json state = json::parse(test::slurp(out / "checkpoint" / "state.json"));
  state.erase("checksums");
  test::write_text(out / "checkpoint" / "state.json", state.dump());
  fs::copy(out / "checkpoint", dir / "checkpoint.saved");
  expect_resume_refused(dir, toml, out,
                        {"optimizer.pt", "truncated, no checksums", cut_in_half,
                         {"cannot be read as optimizer state"}});
  fs::remove_all(out / "checkpoint");
  fs::copy(dir / "checkpoint.saved", out / "checkpoint");
  const CmdResult r = phasekv(train_args(toml, out) + " --resume", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "has no checksums");
  EXPECT_CONTAINS(r.err, "resumed from step 4");
  EXPECT_EQ(log_lines(out), 6);
  fs::remove_all(dir);
}

// ---- item 11: smaller ones ------------------------------------------------------------------

std::string sweep_args(const fs::path& model, const fs::path& out, int modulus) {
  return "sweep --model " + model.string() + " --task kv --examples 1 --modulus " +
         std::to_string(modulus) + " --padding prefix --threads 1 --out " + out.string();
}

// A modulus that the model's stride (4) does not divide only warned, and the sweep lost its
// interior/boundary split; now it is an error unless --stride is given explicitly.
TEST(HardeningSweep, AModulusNotAMultipleOfTheStrideIsAnErrorUnlessStrideIsGiven) {
  const fs::path dir = test::temp_dir("hard_modulus");
  const fs::path model = kv_chunked();
  CmdResult r = phasekv(sweep_args(model, dir / "s6", 6), dir);
  EXPECT_EQ(r.status, 2) << r.err;
  EXPECT_CONTAINS(r.err, "--modulus 6 is not a multiple of the model's stride 4");
  EXPECT_CONTAINS(r.err, "--stride");
  EXPECT_FALSE(fs::exists(dir / "s6" / "results.jsonl"));
  r = phasekv(sweep_args(model, dir / "s6", 6) + " --stride 0", dir);
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "no interior/boundary split");
  fs::remove_all(dir);
}

// `logits --stream --chunk 0` printed "Value 0 not in range 0.000000 to 1797693...".
TEST(HardeningCli, ChunkZeroSaysWhatIsAllowed) {
  const fs::path dir = test::temp_dir("hard_chunk");
  const fs::path model = tiny_model(dir);
  const CmdResult r =
      phasekv("logits --model " + model.string() + " --tokens 1,2 --stream --chunk 0", dir);
  EXPECT_NE(r.status, 0) << r.err;
  EXPECT_CONTAINS(r.err, "--chunk");
  EXPECT_CONTAINS(r.err, "allowed: an integer >= 1");
  EXPECT_NOT_CONTAINS(r.err, "1797693");
  fs::remove_all(dir);
}

// Two sweeps into one --out both ran, appending to one results.jsonl. A run holds OUT/.lock (here
// the test holds it, as a running sweep would); a second is refused naming the directory.
TEST(HardeningSweep, ASecondRunIntoTheSameOutIsRefused) {
  const fs::path dir = test::temp_dir("hard_lock");
  const fs::path model = kv_chunked(), out = dir / "s";
  {
    const DirLock running(out.string());
    const CmdResult r = phasekv(sweep_args(model, out, 8), dir);
    EXPECT_EQ(r.status, 2) << r.err;
    EXPECT_CONTAINS(r.err, out.string() + " is in use by another run");
    EXPECT_FALSE(fs::exists(out / "results.jsonl"));
  }
  const CmdResult r = phasekv(sweep_args(model, out, 8), dir);  // released: it runs
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_TRUE(fs::exists(out / "results.jsonl"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
