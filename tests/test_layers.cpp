// The folders of src/ are layers that point one way: a file may include its own layer and the
// layers below it, never one above. This test reads every source file and fails on an include
// that points up, naming the file, the line and the two layers.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <string>
#include <vector>

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// Bottom to top.
// v4 (the DeepSeek-V4 family) sits beside model (the Qwen3-style family): both build on io.
const std::vector<std::string> kLayers = {"util",    "config",  "task",  "io",    "kernels",
                                          "model",   "v4",      "runtime", "backend", "train", "eval",
                                          "report",  "probe",   "audit",  "theory", "explain",
                                          "suite",   "server",  "perf",   "cli",    "tools"};

TEST(Layers, NoIncludePointsUp) {
  std::map<std::string, int> rank;
  for (size_t i = 0; i < kLayers.size(); ++i) rank[kLayers[i]] = static_cast<int>(i);
  const fs::path src = fs::path(PHASEKV_SOURCE_DIR) / "src";
  const std::regex include("^\\s*#\\s*include\\s+\"([a-z_]+)/");
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(src)) {
    if (!entry.is_regular_file()) continue;
    const std::string layer = fs::relative(entry.path(), src).begin()->string();
    ASSERT_TRUE(rank.count(layer)) << "src/" << layer
                                   << " is not a known layer: add it to kLayers in its place";
    ++files;
    std::ifstream in(entry.path());
    int n = 0;
    for (std::string line; std::getline(in, line);) {
      ++n;
      std::smatch m;
      if (!std::regex_search(line, m, include) || !rank.count(m[1])) continue;
      EXPECT_LE(rank.at(m[1]), rank.at(layer))
          << fs::relative(entry.path(), src.parent_path()).string() << ":" << n << " (" << layer
          << ") includes " << m[1] << ", a layer above it: " << line;
    }
  }
  EXPECT_GT(files, 50) << "no sources found under " << src;
}

}  // namespace
}  // namespace phasekv
