// The phase sweep end to end on a tiny random model: the records, the scoring against a direct
// forward, resuming an interrupted run, and the validation that must fail before writing.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <tuple>

#include "backend/local_backend.h"
#include "eval/mitigations.h"
#include "eval/sweep.h"
#include "model/model_dir.h"
#include "io/tokenizer.h"
#include "report/report.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

TaskConfig small_task() { return test::small_kv_task(); }

// max_context 28 fits M = 4 (26 tokens) but not M = 8 (30 tokens).
ModelConfig small_model_config() { return test::small_kv_model_config(28); }

std::vector<std::string> read_lines(const std::string& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
}

// (example, phase) -> (prediction, target_logprob) of a results.jsonl.
std::map<std::pair<int64_t, int>, std::pair<int32_t, double>> by_pair(const std::string& path) {
  std::map<std::pair<int64_t, int>, std::pair<int32_t, double>> out;
  for (const auto& r : read_results(path).records)
    out[{r.example_id, r.phase}] = {r.prediction, r.target_logprob.value_or(0.0)};
  return out;
}

class SweepTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int counter = 0;
    root_ = fs::temp_directory_path() /
            ("phasekv_sweep_test_" + std::to_string(::getpid()) + "_" + std::to_string(counter++));
    fs::create_directories(root_);
    model_dir_ = (root_ / "tiny").string();
    Decoder model = test::make_model(small_model_config(), 5);
    save_model_dir(model_dir_, model);
    save_task_files(model_dir_, small_task());
  }
  void TearDown() override { fs::remove_all(root_); }

  LocalBackend backend(int batch = 4) { return LocalBackend::from_dir(model_dir_, 1, batch); }

  SweepOptions options(const std::string& out, int examples = 3, int modulus = 4) {
    SweepOptions o;
    o.task = load_task_config(model_dir_);
    o.examples = examples;
    o.modulus = modulus;
    o.seed = 11;
    o.out_dir = (root_ / out).string();
    o.batch = 4;
    o.stats.bootstrap_reps = 100;
    o.stats.permutations = 50;
    return o;
  }

  fs::path root_;
  std::string model_dir_;
};

// ---------------------------------------------------------------------------------------------
// Tokenizer and task files.

TEST_F(SweepTest, TokenizerRoundTripsTaskNamesAndNamesUnknownWords) {
  const auto tok = load_tokenizer_if_present(model_dir_);
  ASSERT_TRUE(tok.has_value());
  EXPECT_EQ(WordTokenizer::load(model_dir_ + "/tokenizer.json").tokens(),
            task_vocab(small_task()).token_names());
  EXPECT_STREQ(tok->kind(), "word");
  EXPECT_EQ(tok->bos_id(), 1);
  const std::vector<int32_t> ids = tok->encode("<bos> k3 v7\n f0\t<q>  k3");
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 8, 20, 21, 2, 8}));
  EXPECT_EQ(tok->decode(ids), "<bos> k3 v7 f0 <q> k3");
  try {
    tok->encode("k3 banana v1");
    FAIL() << "an unknown word must throw";
  } catch (const Error& e) {
    EXPECT_CONTAINS(e.what(), "'banana'");
  }
  EXPECT_THROW(tok->decode({29}), Error);
  EXPECT_THROW(WordTokenizer({"a", "b", "a"}), Error);
  EXPECT_THROW(WordTokenizer({"a b"}), Error);
  EXPECT_EQ(task_config_to_json(load_task_config(model_dir_)), task_config_to_json(small_task()));
  EXPECT_THROW(load_task_config((root_ / "nowhere").string()), Error);
  write_text(model_dir_ + "/tokenizer.json", R"({"type": "bpe", "tokens": ["a"]})");
  EXPECT_THROW(load_tokenizer_if_present(model_dir_), Error);
}

// ---------------------------------------------------------------------------------------------
// LocalBackend.

TEST_F(SweepTest, ScoreMatchesTheFullForwardAcrossLengthGroups) {
  LocalBackend b = backend(2);  // several forwards per length group
  const Decoder& model = b.model();
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 7; ++i) {
    const int64_t len = i % 2 ? 9 : 13;  // two interleaved length groups
    auto t = test::random_tokens(len, model->cfg.vocab_size, 100 + static_cast<uint64_t>(i));
    requests.push_back({std::vector<int32_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len),
                        static_cast<int32_t>(i + 3)});
  }
  requests.push_back({{1, 2, 99}, 3});  // bad id: fails alone
  const auto results = b.score(requests);
  ASSERT_EQ(results.size(), requests.size());
  for (size_t i = 0; i + 1 < requests.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(results[i].error, "");
    const auto& ctx = requests[i].context;
    torch::Tensor logits;
    {
      torch::NoGradGuard g;
      auto t = torch::tensor(std::vector<int64_t>(ctx.begin(), ctx.end()), torch::kInt64);
      logits = b.model()->forward(t.unsqueeze(0))[0][-1].to(torch::kFloat64);
    }
    const auto logp = torch::log_softmax(logits, -1);
    EXPECT_EQ(results[i].argmax, logp.argmax().item<int64_t>());
    EXPECT_NEAR(results[i].argmax_logprob, logp.max().item<double>(), 1e-5);
    EXPECT_NEAR(results[i].target_logprob, logp[requests[i].target].item<double>(), 1e-5);
    EXPECT_FALSE(results[i].censored);
  }
  EXPECT_CONTAINS(results.back().error, "99");
}

// Phase ensembling averages these distributions (eval/mitigations.h): they must be the
// probabilities of the same forwards score() reads, a bad request failing alone; and an ensemble
// of one copy must answer exactly what score() answers.
TEST_F(SweepTest, DistributionsAreTheProbabilitiesScoreReads) {
  LocalBackend b = backend(2);
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 5; ++i) {
    const int64_t len = i % 2 ? 9 : 13;
    auto t = test::random_tokens(len, b.model()->cfg.vocab_size, 200 + static_cast<uint64_t>(i));
    requests.push_back({std::vector<int32_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + len),
                        static_cast<int32_t>(i + 3)});
  }
  requests.push_back({{1, 2, 99}, 3});
  const auto scores = b.score(requests);
  const auto dists = b.next_token_distributions(requests);
  const auto ensemble = score_ensemble(b, requests, 1);
  ASSERT_EQ(dists.size(), requests.size());
  for (size_t i = 0; i + 1 < requests.size(); ++i) {
    SCOPED_TRACE(i);
    ASSERT_EQ(dists[i].error, "");
    const std::vector<double>& p = dists[i].probs;
    ASSERT_EQ(p.size(), static_cast<size_t>(b.model()->cfg.vocab_size));
    double sum = 0;
    for (double x : p) sum += x;
    EXPECT_NEAR(sum, 1.0, 1e-12);
    EXPECT_EQ(std::max_element(p.begin(), p.end()) - p.begin(), scores[i].argmax);
    EXPECT_NEAR(std::log(p[static_cast<size_t>(requests[i].target)]), scores[i].target_logprob,
                1e-12);
    EXPECT_EQ(ensemble[i].argmax, scores[i].argmax);
    EXPECT_NEAR(ensemble[i].target_logprob, scores[i].target_logprob, 1e-12);
  }
  EXPECT_CONTAINS(dists.back().error, "99");
  EXPECT_TRUE(dists.back().probs.empty());
  EXPECT_EQ(ensemble.back().error, dists.back().error);
}

TEST_F(SweepTest, GenerateIsGreedyOverTheFullForward) {
  LocalBackend b = backend();
  std::vector<int32_t> seq = {1, 7, 15, 28, 4};
  const auto out = b.generate(seq, 5);
  ASSERT_EQ(out.size(), 5u);
  for (int32_t token : out) {
    torch::NoGradGuard g;
    auto t = torch::tensor(std::vector<int64_t>(seq.begin(), seq.end()), torch::kInt64);
    EXPECT_EQ(token, b.model()->forward(t.unsqueeze(0))[0][-1].argmax().item<int64_t>());
    seq.push_back(token);
  }
  EXPECT_THROW(b.generate({}, 3), Error);
  EXPECT_EQ(b.detokenize({1, 5}), "<bos> k0");
  EXPECT_EQ(b.model_id().rfind("tiny@", 0), 0u) << b.model_id();
}

// ---------------------------------------------------------------------------------------------
// The sweep.

TEST_F(SweepTest, WritesOneRecordPerExampleAndPhaseAndTheReport) {
  LocalBackend b = backend();
  const SweepOptions o = options("run");
  const SweepResult res = run_sweep(b, o);
  const std::string path = o.out_dir + "/results.jsonl";
  EXPECT_EQ(read_lines(path).size(), 12u);
  // The engine writes results.jsonl only; the report files are the caller's (cli) to write.
  EXPECT_FALSE(fs::exists(o.out_dir + "/summary.json"));
  write_sweep_outputs(o.out_dir, res.label, res.summary, res.meta);
  std::set<std::pair<int64_t, int>> pairs;
  for (const auto& r : read_results(path).records) {
    EXPECT_EQ(r.key_pos % o.modulus, r.phase);
    EXPECT_EQ(r.value_pos, r.key_pos + 1);
    EXPECT_EQ(r.query_pos, 22 + o.modulus - 1);  // the last context position
    EXPECT_EQ(r.correct, r.prediction == r.target);
    EXPECT_TRUE(r.target_logprob.has_value());
    EXPECT_EQ(r.error, "");
    EXPECT_EQ(r.model, b.model_id());
    EXPECT_EQ(r.seed, 11u);
    pairs.insert({r.example_id, r.phase});
  }
  EXPECT_EQ(pairs.size(), 12u);
  for (const char* f : {"summary.json", "phase.csv", "phase.svg", "report.html"})
    EXPECT_TRUE(fs::exists(o.out_dir + "/" + f)) << f;
  EXPECT_EQ(res.summary.outcomes, 12);
  EXPECT_EQ(res.summary.stride, 4);  // the model's chunked stride
  EXPECT_EQ(res.scored, 12);
  EXPECT_EQ(res.meta["mean_target_logprob_by_phase"].size(), 4u);
  const auto summary = nlohmann::json::parse(read_file(o.out_dir + "/summary.json"));
  EXPECT_EQ(PhaseSummary::from_json(summary).outcomes, 12);
}

TEST_F(SweepTest, ResumesAnInterruptedRunToTheSameRecords) {
  LocalBackend b = backend();
  const SweepOptions full = options("full");
  const SweepResult uninterrupted = run_sweep(b, full);
  const SweepOptions cut = options("cut");
  fs::create_directories(cut.out_dir);
  // Interrupted: the last two records never written, the third-from-last cut mid-line.
  auto lines = read_lines(full.out_dir + "/results.jsonl");
  ASSERT_EQ(lines.size(), 12u);
  std::string text;
  for (size_t i = 0; i + 3 < lines.size(); ++i) text += lines[i] + "\n";
  text += lines[9].substr(0, lines[9].size() / 2);
  write_text(cut.out_dir + "/results.jsonl", text);

  const SweepResult res = run_sweep(b, cut);
  EXPECT_EQ(res.resumed, 9);
  EXPECT_EQ(res.scored, 3);
  const auto resumed_lines = read_lines(cut.out_dir + "/results.jsonl");
  EXPECT_EQ(resumed_lines.size(), 12u);  // the broken line is gone, nothing duplicated
  const auto want = by_pair(full.out_dir + "/results.jsonl");
  const auto got = by_pair(cut.out_dir + "/results.jsonl");
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [key, value] : want) {
    ASSERT_TRUE(got.count(key));
    EXPECT_EQ(got.at(key).first, value.first);
    EXPECT_NEAR(got.at(key).second, value.second, 1e-6);
  }
  EXPECT_EQ(res.summary.to_json(), uninterrupted.summary.to_json());

  // A complete directory resumes to a no-op.
  EXPECT_EQ(run_sweep(b, cut).scored, 0);
  EXPECT_EQ(read_lines(cut.out_dir + "/results.jsonl").size(), 12u);
}

// Only the last line may be torn: a bad line before it is corruption, named by file and line, and
// nothing is appended.
TEST_F(SweepTest, ACorruptLineBeforeTheLastIsAnErrorNamingTheLine) {
  LocalBackend b = backend();
  const SweepOptions o = options("corrupt");
  run_sweep(b, o);
  auto lines = read_lines(o.out_dir + "/results.jsonl");
  ASSERT_EQ(lines.size(), 12u);
  lines[4] = lines[4].substr(0, 20);
  std::string text;
  for (size_t i = 0; i + 2 < lines.size(); ++i) text += lines[i] + "\n";  // and two missing
  write_text(o.out_dir + "/results.jsonl", text);
  try {
    run_sweep(b, o);
    FAIL() << "a corrupt line in the middle must not resume";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "results.jsonl line 5 is not valid JSON");
    EXPECT_CONTAINS(msg, "corrupt");
  }
  EXPECT_EQ(read_file(o.out_dir + "/results.jsonl"), text);
}

// A complete last record without its newline (an append cut after the closing brace) is kept,
// and the next append starts on a line of its own.
TEST_F(SweepTest, ALastLineWithoutNewlineIsCompletedNotLost) {
  LocalBackend b = backend();
  const SweepOptions o = options("nonl");
  run_sweep(b, o);
  auto lines = read_lines(o.out_dir + "/results.jsonl");
  std::string text;
  for (size_t i = 0; i < 6; ++i) text += lines[i] + (i == 5 ? "" : "\n");
  write_text(o.out_dir + "/results.jsonl", text);
  const SweepResult res = run_sweep(b, o);
  EXPECT_EQ(res.resumed, 6);
  EXPECT_EQ(res.scored, 6);
  EXPECT_TRUE(res.run.repaired);
  EXPECT_EQ(read_results(o.out_dir + "/results.jsonl").records.size(), 12u);
}

TEST_F(SweepTest, RefusesToResumeADifferentSweep) {
  LocalBackend b = backend();
  SweepOptions o = options("run", 1);
  run_sweep(b, o);
  const std::string before = read_file(o.out_dir + "/results.jsonl");
  o.seed = 12;
  try {
    run_sweep(b, o);
    FAIL() << "a different seed must not resume";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_CONTAINS(msg, "different run");
    EXPECT_CONTAINS(msg, "--out");
  }
  EXPECT_EQ(read_file(o.out_dir + "/results.jsonl"), before);
}

TEST_F(SweepTest, ValidationFailsBeforeWritingAnything) {
  LocalBackend b = backend();
  auto expect_error = [&](SweepOptions o, const std::string& needle) {
    EXPECT_TRUE(test::throws_containing([&] { run_sweep(b, o); }, needle));
    EXPECT_FALSE(fs::exists(o.out_dir)) << o.out_dir;
  };
  expect_error(options("e0", 0), "examples is 0");
  expect_error(options("m0", 3, 0), "modulus is 0");
  expect_error(options("long", 3, 8), "context of 30 tokens exceeds the model's max_context 28");
  SweepOptions bad_stride = options("s3", 3, 4);
  bad_stride.stride = 3;
  expect_error(bad_stride, "does not divide");
}

// The CLI wires the same code: a sweep, a compare, and a validation error exit non-zero.
TEST_F(SweepTest, CommandLineSweepAndCompare) {
  const std::string bin = PHASEKV_BINARY;
  const std::string out = (root_ / "cli").string(), log = (root_ / "log.txt").string();
  auto sweep = [&](const std::string& task, const std::string& dir) {
    return bin + " sweep --model " + model_dir_ + " --task " + task +
           " --examples 2 --modulus 4 --padding in-sequence --threads 1 --bootstrap 50 "
           "--permutations 20 --out " +
           dir + " > " + log + " 2>&1";
  };
  ASSERT_EQ(std::system(sweep("kv", out).c_str()), 0) << read_file(log);
  EXPECT_EQ(read_lines(out + "/results.jsonl").size(), 8u);
  EXPECT_CONTAINS(read_file(out + "/results.jsonl"), "\"in_sequence\"");
  const std::string cmp = bin + " compare " + out + " " + out + " --out " + root_.string();
  ASSERT_EQ(std::system((cmp + " > " + log + " 2>&1").c_str()), 0) << read_file(log);
  EXPECT_TRUE(fs::exists(root_ / "compare.svg"));
  EXPECT_TRUE(fs::exists(root_ / "compare.html"));
  EXPECT_NE(std::system(sweep("chess", (root_ / "bad").string()).c_str()), 0);
  EXPECT_CONTAINS(read_file(log), "allowed: kv, passkey");
  EXPECT_FALSE(fs::exists(root_ / "bad"));
}

}  // namespace
}  // namespace phasekv
