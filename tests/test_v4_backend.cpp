// DeepSeek-V4 checkpoints behind the Backend interface (backend/v4_backend.h): scores and greedy
// generations equal the model's own full forward, bad requests fail alone with a reason, the
// stride is read from compress_ratios, and `phasekv sweep` runs a V4 model directory end to end.
#include <gtest/gtest.h>

#include <filesystem>
#include <nlohmann/json.hpp>

#include "backend/v4_backend.h"
#include "eval/results_file.h"
#include "eval/sweep.h"
#include "task/task_file.h"
#include "task/tasks.h"
#include "test_util.h"
#include "test_v4_util.h"
#include "v4/model_dir.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// The small V4 config over small_kv_task()'s vocabulary, with one stride (ratios 0, 4, 4).
v4::V4Config kv_v4_config() {
  v4::V4Config c = test::v4_small_config();
  c.vocab_size = task_vocab(test::small_kv_task()).vocab_size();
  c.compress_ratios = {0, 4, 4};
  c.max_position_embeddings = 64;
  return c;
}

std::vector<int32_t> context_of(int T, int vocab, uint64_t seed) {
  const torch::Tensor t = test::random_tokens(T, vocab, seed).squeeze(0);
  return std::vector<int32_t>(t.data_ptr<int64_t>(), t.data_ptr<int64_t>() + T);
}

torch::Tensor ids(const std::vector<int32_t>& c) {
  return torch::tensor(std::vector<int64_t>(c.begin(), c.end()), torch::kInt64);
}

TEST(V4Backend, ScoresAreTheFullForwardsLastPosition) {
  const v4::V4Model m = test::v4_small_model(21);
  V4Backend b(m, std::nullopt, "v4small", 1);
  std::vector<ScoreRequest> requests;
  for (int i = 0; i < 4; ++i) requests.push_back({context_of(5 + 4 * i, 32, 30 + i), i + 3});
  requests.push_back({{1, 2, 40}, 3});  // an id outside the vocabulary fails alone
  requests.push_back({{}, 3});
  const std::vector<ScoreResult> got = b.score(requests);
  ASSERT_EQ(got.size(), requests.size());
  torch::NoGradGuard g;
  for (size_t i = 0; i < 4; ++i) {
    const torch::Tensor logits = m.forward(ids(requests[i].context));
    const torch::Tensor want =
        torch::log_softmax(logits[logits.size(0) - 1].to(torch::kFloat64), -1);
    EXPECT_EQ(got[i].error, "");
    EXPECT_DOUBLE_EQ(got[i].target_logprob, want[requests[i].target].item<double>());
    EXPECT_EQ(got[i].argmax, want.argmax().item<int64_t>());
  }
  EXPECT_CONTAINS(got[4].error, "context token id 40 outside the vocabulary [0, 32)");
  EXPECT_CONTAINS(got[5].error, "empty context");
  const std::vector<Distribution> d = b.next_token_distributions({requests[0]});
  ASSERT_EQ(d[0].probs.size(), 32u);
  EXPECT_NEAR(std::log(d[0].probs[requests[0].target]), got[0].target_logprob, 1e-12);
}

TEST(V4Backend, GenerationIsGreedyOnTheFullForward) {
  const v4::V4Model m = test::v4_small_model(22);
  V4Backend b(m, std::nullopt, "v4small", 1);
  std::vector<int32_t> seq = context_of(9, 32, 5);
  const std::vector<int32_t> got = b.generate(seq, 7);
  torch::NoGradGuard g;
  for (int i = 0; i < 7; ++i) {
    const torch::Tensor logits = m.forward(ids(seq));
    seq.push_back(static_cast<int32_t>(logits[logits.size(0) - 1].argmax().item<int64_t>()));
  }
  EXPECT_EQ(got, std::vector<int32_t>(seq.end() - 7, seq.end()));
  EXPECT_THROW(b.generate({}, 3), Error);
}

TEST(V4Backend, StrideFromCompressRatios) {
  const nlohmann::json mixed = V4Backend(test::v4_small_model(1), std::nullopt, "m", 1).describe();
  EXPECT_TRUE(mixed["stride"].is_null());  // ratios 4 and 8: unknown, as for mixed strides
  EXPECT_EQ(mixed["strides"], nlohmann::json({4, 8}));
  EXPECT_EQ(mixed["family"], "deepseek_v4");
  v4::V4Model one(kv_v4_config());
  one.init_random(2);
  const nlohmann::json d = V4Backend(one, std::nullopt, "one", 1).describe();
  EXPECT_EQ(d["stride"], 4);
  EXPECT_EQ(d["max_context"], 64);
  EXPECT_EQ(d["model_id"].get<std::string>().rfind("one@", 0), 0u);
}

// A V4 directory with a task.json sweeps like phasekv's own models: in process (the records'
// log-probabilities are the backend's) and through `phasekv sweep`, which writes the family and
// stride into summary.json.
TEST(V4Backend, SweepOfAV4ModelDirectory) {
  const fs::path dir = test::temp_dir("v4sweep");
  v4::V4Model m(kv_v4_config());
  m.init_random(3);
  v4::save_v4_dir(dir.string(), m);
  save_task_config(dir.string(), test::small_kv_task());
  V4Backend b = V4Backend::from_dir(dir.string(), 1);
  SweepOptions o;
  o.task = load_task_config(dir.string());
  o.examples = 3;
  o.modulus = 4;
  o.seed = 11;
  o.out_dir = (dir / "run").string();
  o.stats.bootstrap_reps = 50;
  o.stats.permutations = 50;
  const SweepResult r = run_sweep(b, o);
  const ResultsFile f = read_results(o.out_dir + "/results.jsonl");
  ASSERT_EQ(f.records.size(), 12u);
  EXPECT_EQ(r.summary.stride, 4);
  for (const EvalRecord& rec : f.records) {  // each record is the backend's score of its prompt
    const TaskExample ex = materialize(make_logical_example(o.task, 11, rec.example_id), 4,
                                       rec.phase, o.padding, false);
    const std::vector<int32_t> context(ex.tokens.begin(), ex.tokens.begin() + rec.query_pos + 1);
    const ScoreResult direct = b.score({{context, rec.target}})[0];
    EXPECT_NEAR(rec.target_logprob.value_or(NAN), direct.target_logprob, 1e-9);
  }

  const test::CommandResult cli = test::run_command(
      std::string(PHASEKV_BINARY) + " sweep --model " + dir.string() +
      " --task kv --examples 3 --modulus 4 --padding prefix --threads 1 --bootstrap-reps 50 "
      "--permutations 50 --out " +
      (dir / "cli").string());
  ASSERT_EQ(cli.status, 0) << cli.err;
  const nlohmann::json s = nlohmann::json::parse(test::slurp(dir / "cli" / "summary.json"));
  EXPECT_EQ(s["meta"]["family"], "deepseek_v4");
  EXPECT_EQ(s["stride"], 4);
  EXPECT_EQ(s["outcomes"], 12);
}

}  // namespace
}  // namespace phasekv
