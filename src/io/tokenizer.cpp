#include "io/tokenizer.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <sstream>

#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

bool has_space(const std::string& word) {
  for (unsigned char ch : word)
    if (std::isspace(ch)) return true;
  return false;
}

}  // namespace

WordTokenizer::WordTokenizer(std::vector<std::string> tokens, const std::string& where)
    : tokens_(std::move(tokens)) {
  if (tokens_.empty()) throw Error(where + ": the token list is empty");
  for (size_t i = 0; i < tokens_.size(); ++i) {
    const std::string& w = tokens_[i];
    if (w.empty() || has_space(w))
      throw Error(where + ": token " + std::to_string(i) + " '" + w +
                  "' is empty or contains whitespace (a word-level token must be one word)");
    if (!ids_.emplace(w, static_cast<int32_t>(i)).second)
      throw Error(where + ": token '" + w + "' appears twice (ids " + std::to_string(ids_.at(w)) +
                  " and " + std::to_string(i) + "); every word must map to one id");
  }
}

WordTokenizer WordTokenizer::from_vocab(const TaskVocab& vocab) {
  return WordTokenizer(vocab.token_names(), "task vocabulary");
}

std::vector<int32_t> WordTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> out;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    auto it = ids_.find(word);
    if (it == ids_.end())
      throw Error("unknown word '" + word + "': not in the tokenizer's " +
                  std::to_string(tokens_.size()) + "-word vocabulary (e.g. '" + tokens_.front() +
                  "', '" + tokens_.back() + "')");
    out.push_back(it->second);
  }
  return out;
}

std::string WordTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 0 || id >= size())
      throw Error("token id " + std::to_string(id) + " is outside the tokenizer's vocabulary [0, " +
                  std::to_string(size()) + ")");
    if (!out.empty()) out += ' ';
    out += tokens_[static_cast<size_t>(id)];
  }
  return out;
}

nlohmann::json WordTokenizer::to_json() const {
  return {{"type", "word"}, {"tokens", tokens_}};
}

WordTokenizer WordTokenizer::from_json(const nlohmann::json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected a JSON object {\"type\", \"tokens\"}");
  if (!j.contains("type") || j["type"] != "word")
    throw Error(where + ": key 'type' is " + (j.contains("type") ? j["type"].dump() : "missing") +
                " (allowed: \"word\", \"sentencepiece\")");
  for (auto it = j.begin(); it != j.end(); ++it)
    if (it.key() != "type" && it.key() != "tokens")
      throw Error(where + ": unknown key '" + it.key() + "' (allowed: type, tokens)");
  if (!j.contains("tokens") || !j["tokens"].is_array())
    throw Error(where + ": key 'tokens' must be an array of strings (index = token id)");
  std::vector<std::string> tokens;
  for (const auto& t : j["tokens"]) {
    if (!t.is_string())
      throw Error(where + ": key 'tokens' entry " + std::to_string(tokens.size()) +
                  " is not a string");
    tokens.push_back(t.get<std::string>());
  }
  return WordTokenizer(std::move(tokens), where);
}

WordTokenizer WordTokenizer::load(const std::string& path) {
  return from_json(read_json_file(path), path);
}

void WordTokenizer::save(const std::string& path) const {
  write_file_atomic(path, to_json().dump(1) + "\n");
}

void save_task_files(const std::string& dir, const TaskConfig& task) {
  save_task_config(dir, task);
  WordTokenizer::from_vocab(task_vocab(task)).save(dir + "/tokenizer.json");
}

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  return std::visit([&](const auto& t) { return t.encode(text); }, impl_);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  return std::visit([&](const auto& t) { return t.decode(ids); }, impl_);
}

std::string Tokenizer::token_text(int32_t id) const { return decode({id}); }

const char* Tokenizer::separator() const {
  return std::holds_alternative<WordTokenizer>(impl_) ? " " : "";
}

std::optional<int32_t> Tokenizer::bos_id() const {
  if (const auto* w = std::get_if<WordTokenizer>(&impl_)) {
    const auto& words = w->tokens();
    const auto it = std::find(words.begin(), words.end(), "<bos>");
    if (it != words.end()) return static_cast<int32_t>(it - words.begin());
    return std::nullopt;
  }
  const auto& p = std::get<SentencePieceBpe>(impl_);
  for (int32_t id = 0; id < p.size(); ++id)
    if (p.piece(id) == "<s>" && p.type(id) == SentencePieceBpe::Type::kControl) return id;
  return std::nullopt;
}

int Tokenizer::size() const {
  return std::visit([](const auto& t) { return t.size(); }, impl_);
}

const char* Tokenizer::kind() const {
  return std::holds_alternative<WordTokenizer>(impl_) ? "word" : "sentencepiece";
}

std::optional<Tokenizer> load_tokenizer_if_present(const std::string& dir) {
  const std::string path = dir + "/tokenizer.json";
  if (!std::filesystem::exists(path)) return std::nullopt;
  const nlohmann::json j = read_json_file(path);
  if (j.is_object() && j.value("type", "") == "sentencepiece")
    return Tokenizer(SentencePieceBpe::from_json(j, path));
  return Tokenizer(WordTokenizer::from_json(j, path));
}

}  // namespace phasekv
