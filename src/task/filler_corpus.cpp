#include "task/filler_corpus.h"

#include <algorithm>
#include <cctype>

#include "util/error.h"
#include "util/manifest.h"

namespace phasekv {

using json = nlohmann::json;

namespace {

bool usable(const std::string& sentence) {
  int words = 0;
  for (size_t i = 0; i < sentence.size(); ++i) {
    const auto c = static_cast<unsigned char>(sentence[i]);
    if (std::isdigit(c) || c < 0x20 || c > 0x7E) return false;
    if (c == ' ' && i + 1 < sentence.size() && sentence[i + 1] != ' ') ++words;
  }
  return words >= 4;
}

void split_sentences(const std::string& text, std::vector<std::string>& out) {
  std::string flat;  // whitespace runs as one space
  for (char c : text) {
    const bool space = std::isspace(static_cast<unsigned char>(c)) != 0;
    if (space && (flat.empty() || flat.back() == ' ')) continue;
    flat.push_back(space ? ' ' : c);
  }
  size_t start = 0;
  for (size_t i = 0; i < flat.size(); ++i) {
    const bool end = (flat[i] == '.' || flat[i] == '!' || flat[i] == '?') &&
                     (i + 1 == flat.size() || flat[i + 1] == ' ');
    if (!end) continue;
    size_t from = start;
    while (from < i && flat[from] == ' ') ++from;
    std::string s(1, ' ');
    s.append(flat, from, i + 1 - from);
    if (usable(s)) out.push_back(std::move(s));
    start = i + 1;
  }
}

}  // namespace

FillerCorpus load_filler_corpus(const std::string& manifest_path) {
  FillerCorpus c;
  c.manifest_path = manifest_path;
  for (const ManifestFile& f : read_manifest_files(
           manifest_path, "another package version: write a new manifest, since the filler of "
                          "earlier audits would differ")) {
    c.files.push_back(f.entry);
    split_sentences(f.text, c.sentences);
  }
  if (c.sentences.empty()) throw Error(manifest_path + ": the files hold no usable sentence");
  return c;
}

json FillerCorpus::describe() const {
  return {{"manifest", manifest_path}, {"files", files}, {"sentences", sentences.size()}};
}

}  // namespace phasekv
