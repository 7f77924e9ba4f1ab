// The in-process sentencepiece tokenizer (io/sentencepiece_bpe.h) on what clients send it: any
// bytes as text to encode, and as token ids to decode, with a vocabulary trained on the Python
// standard library (fuzz/data/sentencepiece-1024, `phasekv tokenizer train --manifest
// data/corpus/python-stdlib.json --vocab-size 1024`). Oracles: every id is in the vocabulary;
// decoding an encoding is a fixed point after one pass (invalid bytes become U+FFFD once, then
// stay); printable ASCII text and newlines round-trip exactly; decoding in-range ids never throws.
#include "fuzz_util.h"
#include "io/sentencepiece_bpe.h"
#include "util/fs.h"

namespace {

using phasekv::SentencePieceBpe;

const SentencePieceBpe& tokenizer() {
  static const SentencePieceBpe t = [] {
    const std::string path = PHASEKV_SOURCE_DIR "/fuzz/data/sentencepiece-1024/tokenizer.json";
    return SentencePieceBpe::from_json(phasekv::read_json_file(path), path);
  }();
  return t;
}

[[noreturn]] void finding(const std::string& what, const std::string& text) {
  std::fprintf(stderr, "fuzz finding: %s (text of %zu bytes)\n", what.c_str(), text.size());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const SentencePieceBpe& t = tokenizer();
  const std::string text = phasekv::fuzz::as_string(data, size);
  const auto ids = t.encode(text);
  for (int32_t id : ids)
    if (id < 0 || id >= t.size()) finding("id " + std::to_string(id) + " out of range", text);
  const std::string once = t.decode(ids);
  if (t.decode(t.encode(once)) != once) finding("decode(encode) is not a fixed point", text);
  bool plain = true;
  for (unsigned char c : text) plain = plain && ((c >= 0x20 && c < 0x7F) || c == '\n' || c == '\t');
  if (plain && once != text) finding("printable ASCII did not round-trip", text);
  std::vector<int32_t> any;
  for (size_t i = 0; i + 1 < size; i += 2)
    any.push_back(static_cast<int32_t>((data[i] << 8 | data[i + 1]) % t.size()));
  t.decode(any);
  return 0;
}
