// A sentencepiece BPE tokenizer in phasekv's own process, without libsentencepiece (which cannot
// share a process with libtorch: src/tools/tokenizer_main.cpp). It reads the vocabulary that
// `phasekv tokenizer train` exports into tokenizer.json ("pieces": [piece, score, type] by id) and
// encodes and decodes exactly as libsentencepiece does for the settings that training uses
// (io/sentencepiece_tokenizer.h; tested id for id against libsentencepiece in
// tests/tokenizer/test_tokenizer.cpp):
//
//   normalise  identity, except that each ' ' becomes U+2581 and each byte that is not part of
//              valid UTF-8 becomes U+FFFD; no dummy prefix, no whitespace removal
//   encode     the text's characters as symbols; repeatedly merge the adjacent pair whose
//              concatenation is a normal piece with the highest score (ties: the leftmost pair);
//              a symbol that is no piece becomes its UTF-8 bytes' pieces <0xXX> (byte fallback)
//   decode     control pieces give nothing, the unknown piece its surface (" \u2047 "), runs of
//              byte pieces their bytes (each byte of an invalid UTF-8 sequence becomes U+FFFD),
//              other pieces their text with U+2581 as ' '
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace phasekv {

class SentencePieceBpe {
 public:
  enum class Type { kNormal, kUnknown, kControl, kUnused, kByte };
  // tokenizer.json's object (type "sentencepiece"); `where` names the file in errors. Throws
  // phasekv::Error when the pieces are missing (a tokenizer.json of an older `tokenizer train`:
  // retrain it), malformed, or trained with settings this reader does not implement.
  static SentencePieceBpe from_json(const nlohmann::json& j, const std::string& where);

  std::vector<int32_t> encode(const std::string& text) const;
  // Throws phasekv::Error on an id outside [0, size()).
  std::string decode(const std::vector<int32_t>& ids) const;
  // The piece as stored (U+2581 for spaces; "<0x41>" for a byte piece).
  const std::string& piece(int32_t id) const { return pieces_[static_cast<size_t>(id)]; }
  Type type(int32_t id) const { return types_[static_cast<size_t>(id)]; }
  int size() const { return static_cast<int>(pieces_.size()); }

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<Type> types_;
  // Normal and unused pieces, looked up by string_view (no copy per candidate pair).
  struct Hash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, Hash, std::equal_to<>> mergeable_;
  int32_t byte_ids_[256] = {};
  int32_t unk_id_ = -1;
  std::string unk_surface_;
};

}  // namespace phasekv
