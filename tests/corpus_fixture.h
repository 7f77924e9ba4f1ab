// A tiny code corpus for tests of corpus training (train/text_corpus.h, [corpus] in the trainer):
// files written into a temporary directory with their manifest, and the 1024-piece tokenizer the
// fuzz target uses (trained on the Python standard library).
#pragma once
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "io/tokenizer.h"
#include "util/error.h"
#include "util/manifest.h"

namespace phasekv::test {

inline const char* const kFixtureTokenizerDir = PHASEKV_SOURCE_DIR "/fuzz/data/sentencepiece-1024";

inline Tokenizer fixture_tokenizer() {
  auto t = load_tokenizer_if_present(kFixtureTokenizerDir);
  if (!t) throw Error("fuzz/data/sentencepiece-1024/tokenizer.json is missing");
  return *t;
}

// Writes the files (the last `held_out` of them held out) and their manifest; returns its path.
inline std::string write_manifest(const std::filesystem::path& dir,
                                  const std::vector<std::string>& texts, size_t held_out) {
  nlohmann::json files = nlohmann::json::array();
  for (size_t i = 0; i < texts.size(); ++i) {
    // Appended, not "m" + ...: GCC 12 warns (-Wstringop-overflow) on that temporary, wrongly.
    std::string name = "m";
    name += std::to_string(i);
    name += ".py";
    const std::filesystem::path p = dir / name;
    std::ofstream(p) << texts[i];
    files.push_back({{"path", p.string()},
                     {"bytes", texts[i].size()},
                     {"sha256", sha256_hex(texts[i])},
                     {"held_out", i + held_out >= texts.size()}});
  }
  const std::filesystem::path m = dir / "manifest.json";
  std::ofstream(m) << nlohmann::json{{"files", files}}.dump();
  return m.string();
}

}  // namespace phasekv::test
