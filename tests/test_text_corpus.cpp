// Token streams of a corpus for language-model training (train/text_corpus.h): training and
// held-out files apart, each file after the start id, and the windows drawn from them.
#include <gtest/gtest.h>

#include <set>

#include "train/text_corpus.h"
#include "util/error.h"
#include "corpus_fixture.h"
#include "test_util.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

using test::fixture_tokenizer;
using test::write_manifest;

const std::vector<std::string> kFiles = {
    "import os\n\ndef walk(top):\n    for name in os.listdir(top):\n        yield name\n",
    "class Point:\n    def __init__(self, x, y):\n        self.x, self.y = x, y\n",
    "def scale(v, s=8):\n    return [x * s for x in v]  # é\n"};

TEST(TextCorpus, SplitsTrainingAndHeldOutFilesEachAfterTheStartId) {
  const fs::path dir = test::temp_dir("text_corpus");
  const Tokenizer tok = fixture_tokenizer();
  const TokenStreams s = tokenize_corpus(write_manifest(dir, kFiles, 1), tok);
  EXPECT_EQ(s.train_files, 2);
  EXPECT_EQ(s.held_out_files, 1);
  std::vector<int32_t> train = {1}, held_out = {1};  // <s> before each file
  for (int32_t id : tok.encode(kFiles[0])) train.push_back(id);
  train.push_back(1);
  for (int32_t id : tok.encode(kFiles[1])) train.push_back(id);
  for (int32_t id : tok.encode(kFiles[2])) held_out.push_back(id);
  EXPECT_EQ(s.train, train);
  EXPECT_EQ(s.held_out, held_out);
  EXPECT_EQ(tok.decode(s.held_out), kFiles[2]);  // the start id decodes to nothing
  // Every file held out, or none: refused, naming the manifest.
  for (size_t held : {size_t{0}, kFiles.size()}) {
    const std::string m = write_manifest(dir, kFiles, held);
    try {
      tokenize_corpus(m, tok);
      ADD_FAILURE() << "accepted a corpus with " << held << " held-out files";
    } catch (const Error& e) {
      EXPECT_CONTAINS(e.what(), m);
    }
  }
  fs::remove_all(dir);
}

TEST(TextCorpus, WindowsAreSlicesOfTheStream) {
  std::vector<int32_t> stream(50);
  for (int i = 0; i < 50; ++i) stream[static_cast<size_t>(i)] = 100 + i;
  std::mt19937_64 rng(3);
  std::set<int32_t> starts;
  for (int i = 0; i < 400; ++i) {
    const auto w = random_window(stream, 47, rng);
    ASSERT_EQ(w.size(), 47u);
    for (size_t k = 1; k < w.size(); ++k) ASSERT_EQ(w[k], w[k - 1] + 1);  // contiguous
    starts.insert(w[0]);
  }
  EXPECT_EQ(starts, (std::set<int32_t>{100, 101, 102, 103}));  // every start reachable
  EXPECT_THROW(random_window(stream, 51, rng), Error);
  EXPECT_THROW(random_window(stream, 0, rng), Error);
  const auto v = consecutive_windows(stream, 16, 10);
  ASSERT_EQ(v.size(), 3u);  // 50 tokens hold three windows of 16
  for (size_t i = 0; i < v.size(); ++i) EXPECT_EQ(v[i].front(), 100 + 16 * static_cast<int>(i));
  EXPECT_EQ(consecutive_windows(stream, 16, 2).size(), 2u);
  EXPECT_THROW(consecutive_windows(stream, 0, 2), Error);
}

}  // namespace
}  // namespace phasekv
