// Natural filler text for long-document audits (`phasekv audit --filler MANIFEST`): sentences
// from text files that Debian packages install (data/filler/debian-licenses.json lists the
// license texts of base-files), pinned by a manifest of paths, sizes and SHA-256 digests, so that
// two audits with the same manifest read the same documents. Invented sentences repeat every few
// tokens, which a model can learn to skip; natural text is what long-context benchmarks (NIAH,
// RULER) hide their needles in.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace phasekv {

struct FillerCorpus {
  std::string manifest_path;
  std::vector<std::string> sentences;  // in document order, each with a leading space
  nlohmann::json describe() const;     // manifest path, files, sentence count
  nlohmann::json files;                // the manifest's files, as checked
};

// Reads the manifest (util/manifest.h: {"files": [{"path", "bytes", "sha256"}, ...]}), checks
// every file's size and SHA-256 (a missing or changed file throws phasekv::Error naming the
// manifest, the file and both values) and splits the texts into sentences: whitespace runs become
// one space, a sentence ends at '.', '!' or '?' before a space, and sentences with digits (a
// section number could pass for a key or a value), characters outside printable ASCII, or fewer
// than 4 words are left out.
FillerCorpus load_filler_corpus(const std::string& manifest_path);

}  // namespace phasekv
