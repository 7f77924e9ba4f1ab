// `phasekv conform` against a real llama-server serving DeepSeek-V4 (issue 41, section 2): a
// seeded V4 at the lookup geometry (configs/v4/lookup.json: an indexer choosing 8 entries) is
// converted to GGUF and served at -ub 1, 5 and 512 with flash attention off and on, with 4 slots
// busy at once, and with each prompt sent in 3 pieces through the prompt cache
// (scripts/interop/conform-deepseek4.sh). Label `llamacpp`; skipped, saying why, when
// llama-server is not built (bash scripts/interop-llamacpp.sh builds it; CI does not) or
// llama.cpp's gguf-py or Debian's numpy are missing.

#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

namespace fs = std::filesystem;

namespace {

const std::string kSource = PHASEKV_SOURCE_DIR;
const std::string kServer = PHASEKV_LLAMACPP_SRC "/build/bin/llama-server";
const std::string kGgufPy = PHASEKV_LLAMACPP_SRC "/gguf-py";
const std::string kPython = "/usr/bin/python3";

int run(const std::string& cmd, std::string& output) {
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return -1;
  char buf[4096];
  size_t n = 0;
  while ((n = fread(buf, 1, sizeof buf, p)) > 0) output.append(buf, n);
  const int st = pclose(p);
  return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

std::string skip_reason() {
  if (!fs::exists(kServer))
    return "llama-server is not built at " + kServer +
           " (bash scripts/interop-llamacpp.sh builds it, about 20 minutes on 2 cores)";
  if (!fs::exists(kGgufPy)) return "llama.cpp's gguf-py is missing at " + kGgufPy;
  std::string out;
  if (run(kPython + " -c 'import numpy'", out) != 0)
    return kPython + " cannot import numpy (install Debian's python3-numpy)";
  return "";
}

const nlohmann::json* condition(const nlohmann::json& report, const std::string& name) {
  for (const auto& c : report["conditions"])
    if (c["conform"]["condition"] == name) return &c;
  return nullptr;
}

TEST(LlamaCppConform, DeepSeekV4ConformsWithFlashAttentionOffUnderEveryBatchingCondition) {
  if (const std::string why = skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const fs::path dir = fs::temp_directory_path() / ("phasekv-conform-" + std::to_string(getpid()));
  fs::create_directories(dir);
  std::string log;
  ASSERT_EQ(run(std::string(PHASEKV_BINARY) + " init --config " + kSource +
                    "/configs/v4/lookup.json --seed 1 --out " + (dir / "model").string(),
                log),
            0)
      << log;
  // The recipe's task (configs/train/v4-lookup.toml): what the sweep asks the model.
  std::ofstream(dir / "model" / "task.json")
      << R"({"name": "lookup", "n_keys": 32, "n_values": 32, "n_filler": 8, "n_records": 12,
            "n_demos": 8, "context_len": 43, "target_depth": -1.0, "distinct_values": true,
            "min_context_len": 0, "n_queries": 1, "record_format": "kv"})";
  const int status = run("cd " + kSource + " && PHASEKV=" + PHASEKV_BINARY +
                             " EXAMPLES=4 MODULUS=8 PORT=$((18000 + $$ % 1000)) bash "
                             "scripts/interop/conform-deepseek4.sh " +
                             (dir / "model").string() + " " + (dir / "out").string(),
                         log);
  ASSERT_EQ(status, 0) << log;
  std::ifstream in(dir / "out" / "conform.json");
  const nlohmann::json report = nlohmann::json::parse(in);
  ASSERT_EQ(report["conditions"].size(), 8u) << log;
  for (const auto& c : report["conditions"]) {
    const auto& s = c["conform"];
    EXPECT_EQ(s["items"], 32) << s["condition"];
    EXPECT_EQ(s["missing"], 0) << s["condition"];
    EXPECT_EQ(s["censored"], 0) << s["condition"];
    EXPECT_TRUE(s["flagged_phases"].empty()) << s["condition"] << ": " << s["verdict"];
  }
  for (const char* name : {"ub1-fa-off", "ub5-fa-off", "ub512-fa-off", "np4-c4", "pieces3"}) {
    const auto* c = condition(report, name);
    ASSERT_NE(c, nullptr) << name;
    EXPECT_LT((*c)["conform"]["max_dlogprob"].get<double>(), 1e-4) << name;
    EXPECT_EQ((*c)["conform"]["greedy_flips"], 0) << name;
  }
  // The pieces really came from the prompt cache; flash attention takes another (f16) path.
  EXPECT_GT((*condition(report, "pieces3"))["engine"]["usage"]["cached_prompt_tokens"], 0);
  const double off = (*condition(report, "ub512-fa-off"))["conform"]["typical_dlogprob"];
  for (const char* name : {"ub1-fa-on", "ub5-fa-on", "ub512-fa-on"})
    EXPECT_GT((*condition(report, name))["conform"]["typical_dlogprob"].get<double>(), 10 * off)
        << name;
  fs::remove_all(dir);
}

}  // namespace
