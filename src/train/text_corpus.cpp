#include "train/text_corpus.h"

#include "util/error.h"
#include "util/manifest.h"

namespace phasekv {

TokenStreams tokenize_corpus(const std::string& manifest_path, const Tokenizer& tokenizer) {
  const auto files = read_manifest_files(
      manifest_path, "another package version: write a new manifest (scripts/code-corpus.sh)");
  TokenStreams s;
  const auto bos = tokenizer.bos_id();
  for (const ManifestFile& f : files) {
    const bool held_out = f.entry.value("held_out", false);
    auto& stream = held_out ? s.held_out : s.train;
    ++(held_out ? s.held_out_files : s.train_files);
    if (bos) stream.push_back(*bos);
    const auto ids = tokenizer.encode(f.text);
    stream.insert(stream.end(), ids.begin(), ids.end());
  }
  if (s.train_files == 0 || s.held_out_files == 0)
    throw Error(manifest_path + ": " + std::to_string(s.train_files) + " training and " +
                std::to_string(s.held_out_files) +
                " held-out files (allowed: at least one of each, \"held_out\": true marks them)");
  return s;
}

std::vector<int32_t> random_window(const std::vector<int32_t>& stream, int64_t n,
                                   std::mt19937_64& rng) {
  const auto size = static_cast<int64_t>(stream.size());
  if (n < 1 || n > size)
    throw Error("a window of " + std::to_string(n) + " tokens from a stream of " +
                std::to_string(size) + " (allowed: 1 to the stream's length)");
  const int64_t start = std::uniform_int_distribution<int64_t>(0, size - n)(rng);
  return {stream.begin() + start, stream.begin() + start + n};
}

std::vector<std::vector<int32_t>> consecutive_windows(const std::vector<int32_t>& stream,
                                                      int64_t n, int64_t max_windows) {
  if (n < 1) throw Error("a window of " + std::to_string(n) + " tokens (allowed: >= 1)");
  std::vector<std::vector<int32_t>> out;
  for (int64_t at = 0; at + n <= static_cast<int64_t>(stream.size()) &&
                       static_cast<int64_t>(out.size()) < max_windows;
       at += n)
    out.emplace_back(stream.begin() + at, stream.begin() + at + n);
  return out;
}

}  // namespace phasekv
