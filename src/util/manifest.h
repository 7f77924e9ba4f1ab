// Corpus manifests: a list of text files pinned by path, size and SHA-256
// ({"files": [{"path", "bytes", "sha256", ...}, ...]}), so that two runs with the same manifest
// read the same bytes. The one manifest reader of every corpus: the audit's filler
// (task/filler_corpus.h), the tokenizer's training text (io/sentencepiece_tokenizer.h) and the
// code models' training text (train/text_corpus.h).
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace phasekv {

// One file of a corpus manifest ({"files": [{"path", "bytes", "sha256", ...}, ...]}), read and
// checked: its entry as written (a corpus may add keys, e.g. "held_out").
struct ManifestFile {
  std::string path, text;
  nlohmann::json entry;
};
// Every file of a manifest, in its order, after checking its size and SHA-256: a missing or
// changed file throws phasekv::Error naming the manifest, the file and both values, followed by
// `if_changed` (what to do about it). The one manifest reader of every corpus (the audit's filler,
// the tokenizer's code).
std::vector<ManifestFile> read_manifest_files(const std::string& manifest_path,
                                              const std::string& if_changed);

// Lowercase hex SHA-256 of `bytes` (OpenSSL).
std::string sha256_hex(const std::string& bytes);

}  // namespace phasekv
