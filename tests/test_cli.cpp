// The command line as a new user meets it (issue 46): each test runs the phasekv binary as a
// user would and checks what it prints, writes and returns.
#include <gtest/gtest.h>

#include <filesystem>
#include <regex>
#include <string>

#include "eval/stats.h"
#include "report/report.h"
#include "test_util.h"
#include "util/bundled.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
const std::string kBin = PHASEKV_BINARY;
const fs::path kSource = PHASEKV_SOURCE_DIR;

test::CommandResult phasekv(const std::string& args) {
  return test::run_command("timeout -s KILL 60 " + kBin + " " + args);
}

bool has(const std::string& text, const std::string& what) {
  return text.find(what) != std::string::npos;
}

std::string kv_chunked() {
  return (kSource / "models" / "kv-chunked").string();
}

TEST(Cli, AnUnknownCommandIsNamedWithTheNearestAndTheList) {
  const auto r = phasekv("swep --model x");
  EXPECT_EQ(r.status, 109) << r.err;  // CLI11's ExtrasError: 100 and up is a usage error
  EXPECT_TRUE(has(r.err, "phasekv: error: unknown command 'swep' (did you mean 'sweep'?)"))
      << r.err;
  EXPECT_FALSE(has(r.err, "A subcommand is required")) << r.err;
  for (const char* c : {"sweep", "compare", "audit", "repro", "serve"})
    EXPECT_TRUE(has(r.err, std::string("\n  ") + c + " ")) << c << " is not listed:\n" << r.err;
  // Nothing near: no guess. A command word below a command is checked the same way.
  const auto nested = phasekv("repro reprot runs/x");
  EXPECT_EQ(nested.status, 109) << nested.err;
  EXPECT_TRUE(
      has(nested.err, "phasekv repro: error: unknown command 'reprot' (did you mean 'report'?)"))
      << nested.err;
  const auto none = phasekv("");
  EXPECT_EQ(none.status, 106) << none.err;
  EXPECT_TRUE(has(none.err, "phasekv: error: no command given")) << none.err;
}

TEST(Cli, TheGuessNeedsATypoNotAnyWord) {
  EXPECT_TRUE(has(phasekv("knokcout").err, "(did you mean 'knockout'?)"));
  EXPECT_TRUE(has(phasekv("sweeep").err, "(did you mean 'sweep'?)"));
  for (const char* word : {"x", "deploy"}) {
    const auto r = phasekv(word);
    EXPECT_TRUE(has(r.err, std::string("unknown command '") + word + "'\n")) << r.err;
  }
}

TEST(Cli, VersionIsTheConfiguredDescription) {
  const auto r = phasekv("--version");
  EXPECT_EQ(r.status, 0) << r.err;
  EXPECT_EQ(r.out, std::string("phasekv ") + PHASEKV_VERSION_STRING + "\n");
  EXPECT_GT(std::string(PHASEKV_VERSION_STRING).size(), 0u);
}

// `--threads 17` printed CLI11's bare line and 105: now the prefix, the flag, the allowed range
// and which --help to read.
TEST(Cli, ParseErrorsArePrefixedAndSayWhatIsAllowed) {
  const auto r = phasekv("sweep --model " + kv_chunked() +
                         " --task kv --examples 1 --modulus 8 --padding prefix --out /tmp/x "
                         "--threads 100000");
  EXPECT_EQ(r.status, 105) << r.err;
  EXPECT_EQ(r.err.rfind("phasekv: error: --threads: 100000 is not an allowed thread count "
                        "(allowed: 0..",
                        0),
            0u)
      << r.err;
  EXPECT_TRUE(has(r.err, "Run 'phasekv sweep --help' for more information.")) << r.err;
  const auto missing = phasekv("sweep --model " + kv_chunked());
  EXPECT_EQ(missing.err.rfind("phasekv: error: ", 0), 0u) << missing.err;
  EXPECT_TRUE(has(missing.err, "is required")) << missing.err;
}

// "--examples INT=0 REQUIRED": a value the user must give shows no default, in every command.
TEST(Cli, HelpShowsNoDefaultBesideRequired) {
  const std::regex default_and_required("=\\S+ REQUIRED");
  for (const char* c :
       {"sweep", "compare", "info", "logits", "init", "train", "audit", "serve", "knockout",
        "gates", "gate-cycle", "probe", "flips", "repro report", "explain report", "bench dump"}) {
    const auto r = phasekv(std::string(c) + " --help");
    EXPECT_EQ(r.status, 0) << c << "\n" << r.err;
    EXPECT_FALSE(std::regex_search(r.out, default_and_required)) << c << "\n" << r.out;
  }
  const auto sweep = phasekv("sweep --help");
  EXPECT_TRUE(has(sweep.out, "kv|lookup|passkey")) << sweep.out;
}

}  // namespace
}  // namespace phasekv
