// Word-level tokenizer of synthetic-vocabulary models, and the task files a trained model
// directory carries next to config.json and model.safetensors:
//
//   tokenizer.json  {"type": "word", "tokens": ["<pad>", "<bos>", ...]}   (index = token id)
//   task.json       the TaskConfig the model was trained on (task_config_to_json)
//
// Synthetic models see token ids only; the names (TaskVocab::token_names) exist so that prompts,
// logs and the HTTP server can speak text. One word is one token, separated by whitespace: there
// is no sub-word merging, so text and ids are in one-to-one correspondence and a phase computed
// on ids is the phase the model sees.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <unordered_map>
#include <variant>
#include <vector>

#include "io/sentencepiece_bpe.h"
#include "task/task_file.h"
#include "task/tasks.h"

namespace phasekv {

class WordTokenizer {
 public:
  // Throws phasekv::Error on an empty list, an empty word, a word containing whitespace or a
  // duplicate word (each would make encode/decode ambiguous). `where` names the source.
  explicit WordTokenizer(std::vector<std::string> tokens, const std::string& where = "tokenizer");
  // The tokenizer of a task's vocabulary: tokens()[id] == vocab.token_name(id).
  static WordTokenizer from_vocab(const TaskVocab& vocab);

  // Splits on whitespace; an unknown word throws phasekv::Error naming it.
  std::vector<int32_t> encode(const std::string& text) const;
  // Words joined by single spaces; an id outside [0, size()) throws phasekv::Error.
  std::string decode(const std::vector<int32_t>& ids) const;

  int size() const { return static_cast<int>(tokens_.size()); }
  const std::vector<std::string>& tokens() const { return tokens_; }

  nlohmann::json to_json() const;
  static WordTokenizer from_json(const nlohmann::json& j, const std::string& where);
  static WordTokenizer load(const std::string& path);
  void save(const std::string& path) const;  // atomic

 private:
  std::vector<std::string> tokens_;
  std::unordered_map<std::string, int32_t> ids_;
};

// A model directory's tokenizer: tokenizer.json of type "word" (the synthetic tasks' vocabulary,
// above) or "sentencepiece" (text and code, trained by `phasekv tokenizer train`:
// io/sentencepiece_bpe.h). What the server, the in-process backend and its users see.
class Tokenizer {
 public:
  Tokenizer(WordTokenizer words) : impl_(std::move(words)) {}
  Tokenizer(SentencePieceBpe pieces) : impl_(std::move(pieces)) {}

  std::vector<int32_t> encode(const std::string& text) const;
  std::string decode(const std::vector<int32_t>& ids) const;
  // One token as responses show it: the word, or the piece's text (a byte piece alone, part of a
  // character, shows as U+FFFD). Throws phasekv::Error on an id outside [0, size()).
  std::string token_text(int32_t id) const;
  // What separates two tokens' texts in decode(): " " between words, "" between pieces.
  const char* separator() const;
  // The id that starts a sequence: "<bos>" (word) or the control piece "<s>", if the vocabulary
  // has one.
  std::optional<int32_t> bos_id() const;
  int size() const;
  const char* kind() const;  // "word" | "sentencepiece"

 private:
  std::variant<WordTokenizer, SentencePieceBpe> impl_;
};

// Writes DIR/task.json (task/task_file.h) and DIR/tokenizer.json (the task's vocabulary), each
// atomically; creates DIR if missing. Validates the config first, so a bad config writes nothing.
void save_task_files(const std::string& dir, const TaskConfig& task);
// DIR/tokenizer.json when the directory has one, else nullopt (a model made by `phasekv init`
// has none). A present but invalid file throws naming it.
std::optional<Tokenizer> load_tokenizer_if_present(const std::string& dir);

}  // namespace phasekv
