// A sub-word tokenizer for real text and code, trained with Debian's libsentencepiece on a
// corpus manifest (util/manifest.h's reader: paths, sizes, SHA-256, each file's "held_out"
// flag), stored in a directory as
//
//   tokenizer.model   the sentencepiece model
//   tokenizer.json    {"type": "sentencepiece", "model": "tokenizer.model", "vocab_size", the
//                      manifest, the training files and options}
//
// Settings for code: no normalisation (identity), whitespace kept as written (runs of spaces are
// indentation), digits split (a number is its digits, so "8" and "32" are 1 and 2 tokens), and
// byte fallback, so any text encodes and decodes back to itself, newlines included (sentencepiece
// trains on lines; a newline becomes its byte piece).
#pragma once
#include <cstdint>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace phasekv {

struct SentencePieceTrainOptions {
  int vocab_size = 4096;
  std::string model_type = "bpe";  // bpe | unigram
  int threads = 1;
};

// Trains on the lines of the manifest's files without "held_out": true and writes DIR/
// tokenizer.model and DIR/tokenizer.json (atomically; DIR is created). Returns tokenizer.json.
// Throws phasekv::Error on a bad manifest or option, or when sentencepiece refuses (its message).
nlohmann::json train_sentencepiece(const std::string& manifest_path, const std::string& dir,
                                   const SentencePieceTrainOptions& options);

class SentencePieceTokenizer {
 public:
  // DIR/tokenizer.json of type "sentencepiece" and its model file; throws naming the file.
  static SentencePieceTokenizer load(const std::string& dir);
  ~SentencePieceTokenizer();
  SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept;
  SentencePieceTokenizer& operator=(SentencePieceTokenizer&&) noexcept;

  std::vector<int32_t> encode(const std::string& text) const;
  // Throws phasekv::Error on an id outside [0, size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  std::string piece(int32_t id) const;
  int size() const;

 private:
  SentencePieceTokenizer();
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

}  // namespace phasekv
