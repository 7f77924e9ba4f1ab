// `phasekv tokenizer`: a sentencepiece tokenizer trained on a corpus manifest's training files
// (io/sentencepiece_tokenizer.h): held-out files stay out, any text round-trips exactly, digits
// are split, and a changed corpus file stops the training.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <random>

#include <nlohmann/json.hpp>

#include "io/sentencepiece_bpe.h"
#include "io/sentencepiece_tokenizer.h"
#include "io/tokenizer.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/manifest.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// Torch-free helpers (tests/test_util.h pulls in libtorch, which this program must not load).
fs::path temp_dir(const std::string& name) {
  const fs::path p = fs::temp_directory_path() /
                     ("phasekv_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(p);
  fs::create_directories(p);
  return p;
}
void write_text(const fs::path& p, const std::string& text) { std::ofstream(p) << text; }
std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

const char* kCode[] = {
    "def quantize(x, scale):\n    y = x / scale\n    return clamp(y, -448.0, 448.0)\n",
    "class Buffer:\n    def __init__(self, n):\n        self.data = [0] * n\n\n"
    "    def put(self, i, v):\n        self.data[i] = v\n",
    "import os\n\nfor name in os.listdir('.'):\n    print(name, len(name))\n"};

// Three small code files, the last held out; returns the manifest path.
fs::path write_corpus(const fs::path& dir) {
  json files = json::array();
  for (int i = 0; i < 3; ++i) {
    std::string text;
    for (int r = 0; r < 20; ++r) text += kCode[i];  // enough lines for a few hundred pieces
    const fs::path p = dir / ("f" + std::to_string(i) + ".py");
    write_text(p, text);
    files.push_back({{"path", p.string()},
                     {"bytes", text.size()},
                     {"sha256", sha256_hex(text)},
                     {"held_out", i == 2}});
  }
  const fs::path m = dir / "corpus.json";
  write_text(m, json{{"files", files}}.dump());
  return m;
}

TEST(Tokenizer, TrainsOnTheTrainingFilesAndRoundTripsAnyText) {
  const fs::path dir = temp_dir("tokenizer");
  const fs::path manifest = write_corpus(dir);
  SentencePieceTrainOptions o;
  o.vocab_size = 300;
  const json meta = train_sentencepiece(manifest.string(), (dir / "tok").string(), o);
  EXPECT_EQ(meta["training_files"], 2);
  EXPECT_EQ(meta["held_out_files"], 1);
  EXPECT_EQ(meta["vocab_size"], 300);
  const auto t = SentencePieceTokenizer::load((dir / "tok").string());
  EXPECT_EQ(t.size(), 300);
  // Indentation, newlines, tabs and characters never seen in training (byte fallback).
  for (const std::string& text : {std::string(kCode[1]), std::string("  x\t= 'é€'\n\n  y"),
                                 std::string(" leading space"), std::string("T.Cast(FP8")})
    EXPECT_EQ(t.decode(t.encode(text)), text);
  EXPECT_EQ(t.encode("32").size(), 2u);  // digits split: "32" is two tokens, "8" one
  EXPECT_EQ(t.encode("8").size(), 1u);
  // Learned pieces: the training files' words take fewer tokens than their characters.
  EXPECT_LT(t.encode("    return clamp(y").size(), std::string("    return clamp(y").size());
  EXPECT_THROW(t.decode({300}), Error);
  // The same corpus and options train the same model.
  train_sentencepiece(manifest.string(), (dir / "tok2").string(), o);
  EXPECT_EQ(slurp(dir / "tok" / "tokenizer.model"), slurp(dir / "tok2" / "tokenizer.model"));
  fs::remove_all(dir);
}

// phasekv's own reader of the exported vocabulary (what the server and the in-process backend
// use: libsentencepiece cannot share their process) encodes and decodes id for id as
// libsentencepiece does: code, held-out text, spaces, characters never seen in training (byte
// fallback), invalid UTF-8 (overlong forms, surrogates, stray and truncated bytes), and random
// byte strings; decoding random id sequences with byte, control and unknown pieces.
TEST(Tokenizer, InProcessReaderEqualsLibsentencepiece) {
  const fs::path dir = temp_dir("tokenizer_reader");
  const fs::path manifest = write_corpus(dir);
  for (int vocab : {300, 400}) {
    SentencePieceTrainOptions o;
    o.vocab_size = vocab;
    const std::string tok = (dir / ("tok" + std::to_string(vocab))).string();
    const json meta = train_sentencepiece(manifest.string(), tok, o);
    const auto sp = SentencePieceTokenizer::load(tok);
    const auto own = load_tokenizer_if_present(tok);
    ASSERT_TRUE(own.has_value());
    EXPECT_STREQ(own->kind(), "sentencepiece");
    ASSERT_EQ(own->size(), sp.size());
    EXPECT_EQ(own->bos_id(), 1);  // sentencepiece's <s>
    std::vector<std::string> texts = {
        "", " ", "  ", "x", kCode[0], kCode[1], kCode[2], slurp(dir / "f2.py"),
        "  x\t= 'é€'\n\n  y", " leading space", "T.Cast(FP8", "T.Cast(FP32", "▁already ▁",
        "emoji 😀 and 中文 text", "\xff\xfe abc \xc3", "\xc0\xaf overlong", "\xed\xa0\x80 surrogate",
        "\xf4\x90\x80\x80 above U+10FFFF", "trunc \xe2\x82", "\xef\xbf\xbd literal U+FFFD"};
    std::mt19937 rng(vocab);
    for (int i = 0; i < 200; ++i) {  // random bytes, and random picks of the training text
      std::string t;
      const int n = static_cast<int>(rng() % 40);
      const std::string& src = kCode[rng() % 3];
      for (int k = 0; k < n; ++k)
        t += i % 2 ? static_cast<char>(rng() % 256) : src[rng() % src.size()];
      texts.push_back(t);
    }
    for (const auto& t : texts) {
      EXPECT_EQ(own->encode(t), sp.encode(t)) << "vocab " << vocab << ", text '" << t << "'";
      EXPECT_EQ(own->decode(sp.encode(t)), sp.decode(sp.encode(t))) << "text '" << t << "'";
    }
    for (int i = 0; i < 300; ++i) {  // any ids, byte pieces 3..258 and control pieces 1, 2 too
      std::vector<int32_t> ids;
      const int n = 1 + static_cast<int>(rng() % 12);
      for (int k = 0; k < n; ++k)
        ids.push_back(static_cast<int32_t>(i % 3 ? rng() % sp.size() : rng() % 260));
      EXPECT_EQ(own->decode(ids), sp.decode(ids)) << "ids " << json(ids).dump();
    }
    for (int32_t id = 0; id < sp.size(); ++id)
      EXPECT_EQ(own->token_text(id), sp.decode({id})) << "id " << id;
    EXPECT_THROW(own->decode({sp.size()}), Error);
  }
  fs::remove_all(dir);
}

// tokenizer.json without the exported pieces, or trained with settings the reader does not
// implement, is refused naming the file and the key.
TEST(Tokenizer, InProcessReaderRefusesWhatItCannotReproduce) {
  const fs::path dir = temp_dir("tokenizer_refuse");
  const fs::path manifest = write_corpus(dir);
  SentencePieceTrainOptions o;
  o.vocab_size = 300;
  json meta = train_sentencepiece(manifest.string(), (dir / "tok").string(), o);
  const auto refused = [&](json j, const std::string& needle) {
    write_text(dir / "tok" / "tokenizer.json", j.dump());
    try {
      load_tokenizer_if_present((dir / "tok").string());
      ADD_FAILURE() << "accepted: " << needle;
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find((dir / "tok" / "tokenizer.json").string()), std::string::npos) << msg;
      EXPECT_NE(msg.find(needle), std::string::npos) << msg;
    }
  };
  json no_pieces = meta;
  no_pieces.erase("pieces");
  refused(no_pieces, "no \"pieces\"");
  json unigram = meta;
  unigram["options"]["model_type"] = "unigram";
  refused(unigram, "options.model_type is \"unigram\" (allowed: \"bpe\"");
  json bad_type = meta;
  bad_type["pieces"][5][2] = "user_defined";
  refused(bad_type, "pieces[5] has type \"user_defined\"");
  json bad_piece = meta;
  bad_piece["pieces"][7] = json::array({"", 0.0, "normal"});
  refused(bad_piece, "pieces[7]");
  json other = meta;
  other["type"] = "bpe";
  refused(other, "(allowed: \"word\", \"sentencepiece\")");
  fs::remove_all(dir);
}

TEST(Tokenizer, AChangedCorpusFileStopsTheTraining) {
  const fs::path dir = temp_dir("tokenizer_changed");
  const fs::path manifest = write_corpus(dir);
  write_text(dir / "f1.py", "changed\n");
  SentencePieceTrainOptions o;
  o.vocab_size = 300;
  try {
    train_sentencepiece(manifest.string(), (dir / "tok").string(), o);
    FAIL() << "trained on a changed file";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("files[1]: " + (dir / "f1.py").string() + " has changed: 8 bytes"),
              std::string::npos)
        << msg;
  }
  EXPECT_FALSE(fs::exists(dir / "tok" / "tokenizer.model"));
  o.vocab_size = 100;
  EXPECT_THROW(train_sentencepiece(manifest.string(), (dir / "tok").string(), o), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
