#include "io/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

#include <filesystem>
#include <sstream>

#include "util/error.h"
#include "util/fs.h"
#include "util/manifest.h"

namespace phasekv {
namespace {

using nlohmann::json;

// The non-blank lines of the training files, one sentence each.
class LineIterator : public sentencepiece::SentenceIterator {
 public:
  explicit LineIterator(const std::vector<const ManifestFile*>& files) : files_(files) { advance(); }
  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override { return {}; }
  int64_t lines = 0;

 private:
  void advance() {
    while (file_ < files_.size()) {
      const std::string& text = files_[file_]->text;
      if (pos_ >= text.size()) {
        ++file_;
        pos_ = 0;
        continue;
      }
      size_t end = text.find('\n', pos_);
      if (end == std::string::npos) end = text.size();
      line_ = text.substr(pos_, end - pos_);
      pos_ = end + 1;
      if (line_.find_first_not_of(" \t\r") == std::string::npos) continue;
      ++lines;
      return;
    }
    done_ = true;
  }
  std::vector<const ManifestFile*> files_;
  size_t file_ = 0, pos_ = 0;
  std::string line_;
  bool done_ = false;
};

// The vocabulary as [piece, score, type] by id, for phasekv's own reader (io/sentencepiece_bpe.h),
// which cannot load libsentencepiece beside libtorch.
json export_pieces(const sentencepiece::SentencePieceProcessor& sp) {
  json pieces = json::array();
  for (int id = 0; id < sp.GetPieceSize(); ++id) {
    const char* type = sp.IsUnknown(id)   ? "unknown"
                       : sp.IsControl(id) ? "control"
                       : sp.IsUnused(id)  ? "unused"
                       : sp.IsByte(id)    ? "byte"
                                          : "normal";
    pieces.push_back({sp.IdToPiece(id), sp.GetScore(id), type});
  }
  return pieces;
}

}  // namespace

json train_sentencepiece(const std::string& manifest_path, const std::string& dir,
                         const SentencePieceTrainOptions& o) {
  if (o.vocab_size < 260)
    throw Error("--vocab-size " + std::to_string(o.vocab_size) +
                " (allowed: >= 260: 256 byte pieces, <unk>, <s>, </s> and at least one more)");
  if (o.model_type != "bpe" && o.model_type != "unigram")
    throw Error("--model-type '" + o.model_type + "' (allowed: bpe, unigram)");
  const std::vector<ManifestFile> files = read_manifest_files(
      manifest_path, "another package version: write a new manifest; a tokenizer trained on "
                     "other files would differ");
  std::vector<const ManifestFile*> training;
  int held_out = 0;
  for (const auto& f : files) {
    if (f.entry.value("held_out", false))
      ++held_out;
    else
      training.push_back(&f);
  }
  if (training.empty())
    throw Error(manifest_path + ": every file is held out (allowed: at least one training file)");
  LineIterator lines(training);
  const std::unordered_map<std::string, std::string> args = {
      {"vocab_size", std::to_string(o.vocab_size)},
      {"model_type", o.model_type},
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"split_digits", "true"},
      {"byte_fallback", "true"},
      {"allow_whitespace_only_pieces", "true"},
      {"character_coverage", "1.0"},
      {"num_threads", std::to_string(std::max(1, o.threads))},
      {"input_sentence_size", "0"},  // every line, no sampling: the same model on every run
      {"shuffle_input_sentence", "false"},
      {"add_dummy_prefix", "false"},  // no invented leading space: text round-trips exactly
      {"minloglevel", "2"}};
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!status.ok())
    throw Error("sentencepiece refused to train on " + manifest_path + ": " + status.ToString());
  std::filesystem::create_directories(dir);
  write_file_atomic(dir + "/tokenizer.model", model);
  sentencepiece::SentencePieceProcessor sp;
  if (!sp.LoadFromSerializedProto(model).ok())
    throw Error("sentencepiece wrote a model it cannot load (" + dir + "/tokenizer.model)");
  json meta = {{"type", "sentencepiece"},
               {"model", "tokenizer.model"},
               {"vocab_size", sp.GetPieceSize()},
               {"manifest", manifest_path},
               {"training_files", training.size()},
               {"held_out_files", held_out},
               {"training_lines", lines.lines},
               {"options",
                {{"vocab_size", o.vocab_size},
                 {"model_type", o.model_type},
                 {"normalization", "identity"},
                 {"add_dummy_prefix", false},
                 {"remove_extra_whitespaces", false},
                 {"split_digits", true},
                 {"byte_fallback", true},
                 {"unk_surface", " \xE2\x81\x87 "}}},
               {"pieces", export_pieces(sp)}};
  write_file_atomic(dir + "/tokenizer.json", meta.dump(2) + "\n");
  return meta;
}

SentencePieceTokenizer::SentencePieceTokenizer()
    : sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {}
SentencePieceTokenizer::~SentencePieceTokenizer() = default;
SentencePieceTokenizer::SentencePieceTokenizer(SentencePieceTokenizer&&) noexcept = default;
SentencePieceTokenizer& SentencePieceTokenizer::operator=(SentencePieceTokenizer&&) noexcept =
    default;

SentencePieceTokenizer SentencePieceTokenizer::load(const std::string& dir) {
  const std::string meta_path = dir + "/tokenizer.json";
  const json meta = read_json_file(meta_path);
  if (!meta.is_object() || meta.value("type", "") != "sentencepiece" || !meta.contains("model") ||
      !meta["model"].is_string())
    throw Error(meta_path + ": not a sentencepiece tokenizer (allowed: {\"type\": "
                            "\"sentencepiece\", \"model\": FILE, ...}, written by `phasekv "
                            "tokenizer train`)");
  const std::string model_path = dir + "/" + meta["model"].get<std::string>();
  SentencePieceTokenizer t;
  const auto status = t.sp_->LoadFromSerializedProto(read_file(model_path));
  if (!status.ok()) throw Error(model_path + ": not a sentencepiece model (" + status.ToString() + ")");
  return t;
}

std::vector<int32_t> SentencePieceTokenizer::encode(const std::string& text) const {
  std::vector<int> ids;
  const auto status = sp_->Encode(text, &ids);
  if (!status.ok()) throw Error("sentencepiece cannot encode the text: " + status.ToString());
  return {ids.begin(), ids.end()};
}

std::string SentencePieceTokenizer::decode(const std::vector<int32_t>& ids) const {
  for (int32_t id : ids)
    if (id < 0 || id >= size())
      throw Error("token id " + std::to_string(id) + " is outside the vocabulary (allowed: 0 to " +
                  std::to_string(size() - 1) + ")");
  std::string text;
  const auto status = sp_->Decode(std::vector<int>(ids.begin(), ids.end()), &text);
  if (!status.ok()) throw Error("sentencepiece cannot decode: " + status.ToString());
  return text;
}

std::string SentencePieceTokenizer::piece(int32_t id) const { return sp_->IdToPiece(id); }

int SentencePieceTokenizer::size() const { return sp_->GetPieceSize(); }

}  // namespace phasekv
