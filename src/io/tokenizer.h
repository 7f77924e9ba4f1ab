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
#include <vector>

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

// Writes DIR/task.json (task/task_file.h) and DIR/tokenizer.json (the task's vocabulary), each
// atomically; creates DIR if missing. Validates the config first, so a bad config writes nothing.
void save_task_files(const std::string& dir, const TaskConfig& task);
// DIR/tokenizer.json when the directory has one, else nullopt (a model made by `phasekv init`
// has none). A present but invalid file throws.
std::optional<WordTokenizer> load_tokenizer_if_present(const std::string& dir);

}  // namespace phasekv
