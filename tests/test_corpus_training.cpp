// Next-token training on a text corpus ([corpus] instead of [task], docs/TRAINING.md): config
// errors, batches that are slices of the training stream, a validation loss on held-out files
// that falls with training, and exact resume.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "corpus_fixture.h"
#include "model/model_dir.h"
#include "test_util.h"
#include "train/batch.h"
#include "train/text_corpus.h"
#include "train/trainer.h"
#include "util/error.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Regular little functions: a model can learn their shape in a few dozen steps.
std::vector<std::string> code_files(int n_files) {
  std::vector<std::string> files;
  for (int f = 0; f < n_files; ++f) {
    std::string text = "import math\n\n";
    for (int i = 0; i < 12; ++i)
      text += "def scale_" + std::to_string(f) + "_" + std::to_string(i) +
              "(x, s=" + std::to_string(i % 4 + 1) + "):\n    return [v * s for v in x]\n\n";
    files.push_back(text);
  }
  return files;
}

json corpus_train_json(const std::string& manifest) {
  json j = json::parse(R"({
    "model": {"vocab_size": 1024, "d_model": 32, "n_layers": 1, "n_heads": 2, "n_kv_heads": 1,
              "head_dim": 16, "d_ff": 64, "max_context": 64,
              "attention": {"kind": "chunked", "stride": 4, "width": 8, "n_win": 4}},
    "corpus": {"context_len": 32},
    "train": {"steps": 30, "batch": 8, "lr": 0.01, "warmup": 3, "seed": 5, "threads": 1,
              "log_every": 5, "eval_every": 15, "eval_examples": 20, "checkpoint_every": 10}})");
  j["corpus"]["manifest"] = manifest;
  j["corpus"]["tokenizer"] = test::kFixtureTokenizerDir;
  return j;
}

struct Corpus {
  fs::path dir;
  std::string manifest;
};
Corpus make_corpus(const std::string& name) {
  Corpus c{test::temp_dir("corpus_" + name), ""};
  c.manifest = test::write_manifest(c.dir, code_files(10), 2);
  return c;
}

// The training config `j` is refused with an error containing `fragment`.
::testing::AssertionResult refused_with(const json& j, const std::string& fragment) {
  return test::throws_containing([&] { train_config_from_json(j, "t.toml", "."); }, fragment);
}

TEST(CorpusTraining, ConfigErrorsNameTheKey) {
  const Corpus c = make_corpus("config");
  const json ok = corpus_train_json(c.manifest);
  const TrainConfig cfg = train_config_from_json(ok, "t.toml", ".");
  ASSERT_TRUE(cfg.corpus.has_value());
  EXPECT_EQ(cfg.corpus->context_len, 32);
  EXPECT_TRUE(cfg.source.contains("corpus"));
  EXPECT_FALSE(cfg.source.contains("task"));

  json j = ok;
  j["task"] = json::parse(R"({"name": "kv"})");
  EXPECT_TRUE(refused_with(j, "[task] and [corpus] are both given"));
  j = ok;
  j["model"]["vocab_size"] = 1000;
  EXPECT_TRUE(refused_with(j, "has 1024 tokens but [model] vocab_size is 1000"));
  j = ok;
  j["train"]["offset_randomization"] = 8;
  EXPECT_TRUE(refused_with(j, "key 'offset_randomization' applies to [task] training only"));
  j = ok;
  j["corpus"]["context_len"] = 65;
  EXPECT_TRUE(
      refused_with(j, "key 'context_len' is 65 (allowed: 2 to the model's max_context = 64)"));
  j = ok;
  j["corpus"]["tokenizer"] = c.dir.string();  // a directory without tokenizer.json
  EXPECT_TRUE(refused_with(j, "has no tokenizer.json"));
  j = ok;
  j["corpus"]["manifest"] = (c.dir / "none.json").string();
  EXPECT_TRUE(
      refused_with(j, "key 'manifest': " + (c.dir / "none.json").string() + " does not exist"));
  j = ok;
  j["corpus"]["stride"] = 4;
  EXPECT_TRUE(refused_with(j, "[corpus]: unknown key 'stride'"));
  j = ok;
  j.erase("corpus");
  EXPECT_TRUE(refused_with(j, "missing section [task] (or [corpus])"));
  fs::remove_all(c.dir);
}

TEST(CorpusTraining, BatchesAreSlicesOfTheStreamPredictingEveryNextToken) {
  std::vector<int32_t> stream(300);
  for (int i = 0; i < 300; ++i) stream[static_cast<size_t>(i)] = 7 * i % 1009;
  std::mt19937_64 rng(1);
  const TrainingBatch b = make_corpus_batch(stream, rng, 5, 16);
  ASSERT_EQ(b.tokens.sizes(), (std::vector<int64_t>{5, 16}));
  ASSERT_EQ(b.target.numel(), 5 * 16);
  for (int64_t r = 0; r < 5; ++r) {
    // The row is stream[s .. s + 16) for some s, and each position predicts the token after it.
    const auto first = static_cast<int32_t>(b.tokens[r][0].item<int64_t>());
    const auto start = std::find(stream.begin(), stream.end(), first) - stream.begin();
    for (int64_t t = 0; t < 16; ++t) {
      const int64_t k = r * 16 + t;
      EXPECT_EQ(b.row[k].item<int64_t>(), r);
      EXPECT_EQ(b.col[k].item<int64_t>(), t);
      EXPECT_EQ(b.tokens[r][t].item<int64_t>(), stream[static_cast<size_t>(start + t)]);
      EXPECT_EQ(b.target[k].item<int64_t>(), stream[static_cast<size_t>(start + t + 1)]);
    }
  }
}

// The validation loss in batches of 16 windows equals the mean over windows scored one by one.
TEST(CorpusTraining, NextTokenLossIsTheMeanOverEveryPredictedToken) {
  const TrainConfig cfg = train_config_from_json(corpus_train_json("/dev/null"), "t.toml", ".");
  Decoder model(cfg.model);
  model->init_weights(2);
  model->eval();
  std::mt19937_64 rng(4);
  std::vector<std::vector<int32_t>> windows;
  for (int w = 0; w < 19; ++w) {  // two chunks of the evaluation
    std::vector<int32_t> win(13);
    for (auto& id : win) id = static_cast<int32_t>(rng() % 1024);
    windows.push_back(win);
  }
  const EvalScore all = evaluate_next_tokens(model, windows);
  double loss = 0;
  int correct = 0;
  for (const auto& w : windows) {
    const EvalScore one = evaluate_next_tokens(model, {w});
    loss += one.loss * 12;
    correct += static_cast<int>(std::lround(one.acc * 12));
  }
  EXPECT_NEAR(all.loss, loss / (19 * 12), 1e-9);
  EXPECT_NEAR(all.acc, correct / (19.0 * 12), 1e-12);
  EXPECT_NEAR(all.loss, std::log(1024.0), 0.5);  // fresh weights: about uniform
  EXPECT_THROW(evaluate_next_tokens(model, {}), Error);
  windows.push_back({1, 2});
  EXPECT_THROW(evaluate_next_tokens(model, windows), Error);
}

// Trains a few dozen steps: the held-out loss falls well below uniform, the model directory
// carries the corpus's tokenizer (not a task), and a killed run resumes to the same weights.
TEST(CorpusTraining, LearnsAndResumesExactly) {
  const Corpus c = make_corpus("learn");
  const TrainConfig cfg = train_config_from_json(corpus_train_json(c.manifest), "t.toml", ".");
  const std::string full = (c.dir / "full").string(), killed = (c.dir / "killed").string();
  const TrainResult r = train(cfg, full, false);
  EXPECT_EQ(r.steps_done, 30);
  EXPECT_LT(r.eval_loss, std::log(1024.0) - 3.0) << "held-out loss after 30 steps";
  EXPECT_GT(r.eval_acc, 0.3);
  const auto tok = load_tokenizer_if_present(full);
  ASSERT_TRUE(tok.has_value());
  EXPECT_EQ(tok->size(), 1024);
  EXPECT_EQ(std::string(tok->kind()), "sentencepiece");
  EXPECT_EQ(test::slurp(fs::path(full) / "tokenizer.json"),
            test::slurp(fs::path(test::kFixtureTokenizerDir) / "tokenizer.json"));
  EXPECT_FALSE(fs::exists(fs::path(full) / "task.json"));

  train(cfg, killed, false, /*stop_after=*/10);
  train(cfg, killed, true);
  auto a = load_model_dir(full)->named_parameters(), b = load_model_dir(killed)->named_parameters();
  for (const auto& p : a)
    EXPECT_TRUE(torch::equal(p.value(), b[p.key()])) << p.key() << " differs after resume";
  fs::remove_all(c.dir);
}

}  // namespace
}  // namespace phasekv
