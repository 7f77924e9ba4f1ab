// The one evaluation engine (eval/runner.h) under interruption, through the real binaries: a
// text-rendered audit of `phasekv serve` killed with SIGKILL mid-run, its results.jsonl also torn
// mid-line, then rerun, must end with the records of an uninterrupted run (as a set).
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <tuple>

#include "eval/results_file.h"
#include "model/model_dir.h"
#include "io/tokenizer.h"
#include "test_util.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
const std::string kBin = PHASEKV_BINARY;

// Every word the text task writes (backend/http_text_task.cpp) plus 4-digit numbers, so that a
// word-level phasekv model can be audited in text mode: its /tokenize splits on whitespace.
std::vector<std::string> text_task_words() {
  std::vector<std::string> w = {"<pad>", "<bos>", "Hello", "world", "Remember", "the", "value",
                                "of", "each", "key.", "key", "->", ".", "Question:", "what",
                                "is", "?", "Answer:", "-", "=", "x", "The", "grass", "green.",
                                "sky", "blue.", "sun", "yellow.", "Here", "we", "go.", "There",
                                "and", "back", "again.", "river", "flows", "to", "sea.", "A",
                                "bird", "sings", "in", "tree.", "road", "winds", "over", "hill."};
  for (int n = 1000; n <= 9999; ++n) w.push_back(std::to_string(n));
  return w;
}

// A tiny random word-level model over that vocabulary, in a model directory.
std::string text_model_dir(const fs::path& root) {
  const WordTokenizer tok(text_task_words(), "test vocabulary");
  AttentionConfig a;
  a.kind = AttentionKind::kChunked;
  a.stride = 4;
  a.width = 4;
  a.n_win = 2;
  ModelConfig cfg = test::tiny_config(a);
  cfg.vocab_size = tok.size();
  cfg.max_context = 256;
  const std::string dir = (root / "model").string();
  Decoder model = test::make_model(cfg, 3);
  save_model_dir(dir, model);
  tok.save(dir + "/tokenizer.json");
  return dir;
}

// (example, phase) -> the scored outcome of a results.jsonl, one entry per item (a success is
// never replaced, as the runner keeps them).
using Outcome = std::tuple<int32_t, bool, double, bool>;
std::map<std::pair<int64_t, int>, Outcome> outcomes(const fs::path& path) {
  std::map<std::pair<int64_t, int>, Outcome> out;
  for (const auto& r : read_results(path.string()).records) {
    EXPECT_TRUE(r.ok()) << r.error;
    EXPECT_TRUE(r.extra.contains("position_ok")) << "text records say where the key landed";
    out.emplace(std::make_pair(r.example_id, r.phase),
                Outcome{r.prediction, r.correct, r.target_logprob.value_or(1.0), r.censored});
  }
  return out;
}

size_t count_lines(const fs::path& p) {
  const std::string text = test::slurp(p);
  return static_cast<size_t>(std::count(text.begin(), text.end(), '\n'));
}

TEST(AuditResume, KilledTextAuditOfPhasekvServeResumesToTheUninterruptedRecords) {
  const fs::path root = test::temp_dir("audit_resume");
  test::ServeProcess server(kBin, text_model_dir(root), root / "serve.log");
  ASSERT_FALSE(server.endpoint().empty()) << server.log();
  const int examples = 40, modulus = 8;
  const size_t total = static_cast<size_t>(examples * modulus);
  auto audit = [&](const fs::path& out) {
    return kBin + " audit --render text --endpoint " + server.endpoint() + " --model '" +
           server.name() + "' --modulus " + std::to_string(modulus) + " --examples " +
           std::to_string(examples) +
           " --n-records 3 --context-len 120 --concurrency 1 --bootstrap-reps 50"
           " --permutations 50 --out " +
           out.string();
  };
  const fs::path whole = root / "whole", cut = root / "cut";
  ASSERT_EQ(std::system((audit(whole) + " > " + (root / "whole.log").string() + " 2>&1").c_str()),
            0)
      << test::slurp(root / "whole.log");
  ASSERT_EQ(count_lines(whole / "results.jsonl"), total);

  // The same audit, killed with SIGKILL once its first batches are on disk.
  const pid_t pid = fork();
  if (pid == 0) {
    execl("/bin/sh", "sh", "-c", ("exec " + audit(cut) + " > /dev/null 2>&1").c_str(),
          static_cast<char*>(nullptr));
    _exit(127);
  }
  const fs::path cut_results = cut / "results.jsonl";
  for (int i = 0; i < 4000 && count_lines(cut_results) < 2 * static_cast<size_t>(modulus); ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  kill(pid, SIGKILL);
  int st = 0;
  waitpid(pid, &st, 0);
  const size_t at_kill = count_lines(cut_results);
  ASSERT_LT(at_kill, total) << "the audit finished before it could be killed";
  ASSERT_GT(at_kill, 0u);
  // And a torn last line, as a kill in the middle of an append leaves it.
  std::string text = test::slurp(cut_results);
  const size_t last_start = text.rfind('\n', text.size() - 2) + 1;
  text.resize(last_start + (text.size() - last_start) / 2);
  test::write_text(cut_results, text);

  ASSERT_EQ(std::system((audit(cut) + " > " + (root / "cut.log").string() + " 2>&1").c_str()), 0)
      << test::slurp(root / "cut.log");
  EXPECT_CONTAINS(test::slurp(root / "cut.log"), "dropped a truncated last line");
  const auto want = outcomes(whole / "results.jsonl");
  const auto got = outcomes(cut_results);
  ASSERT_EQ(want.size(), total);
  ASSERT_EQ(got.size(), total);
  for (const auto& [key, w] : want) {
    const Outcome& g = got.at(key);
    EXPECT_EQ(std::get<0>(g), std::get<0>(w));
    EXPECT_EQ(std::get<1>(g), std::get<1>(w));
    EXPECT_NEAR(std::get<2>(g), std::get<2>(w), 1e-5);
    EXPECT_EQ(std::get<3>(g), std::get<3>(w));
  }
  EXPECT_EQ(count_lines(cut_results), total) << "nothing duplicated, nothing lost";
  // A third run finds everything done.
  ASSERT_EQ(std::system((audit(cut) + " > " + (root / "again.log").string() + " 2>&1").c_str()), 0);
  EXPECT_EQ(count_lines(cut_results), total);
  EXPECT_EQ(server.stop(), 0) << server.log();
  fs::remove_all(root);
}

}  // namespace
}  // namespace phasekv
