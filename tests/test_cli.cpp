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

std::string kv_chunked() {
  return (kSource / "models" / "kv-chunked").string();
}

TEST(Cli, AnUnknownCommandIsNamedWithTheNearestAndTheList) {
  const auto r = phasekv("swep --model x");
  EXPECT_EQ(r.status, 109) << r.err;  // CLI11's ExtrasError: 100 and up is a usage error
  EXPECT_CONTAINS(r.err, "phasekv: error: unknown command 'swep' (did you mean 'sweep'?)");
  EXPECT_NOT_CONTAINS(r.err, "A subcommand is required");
  for (const char* c : {"sweep", "compare", "audit", "repro", "serve"})
    EXPECT_CONTAINS(r.err, std::string("\n  ") + c + " ") << c << " is not listed:\n" << r.err;
  // Nothing near: no guess. A command word below a command is checked the same way.
  const auto nested = phasekv("repro reprot runs/x");
  EXPECT_EQ(nested.status, 109) << nested.err;
  EXPECT_CONTAINS(nested.err,
                  "phasekv repro: error: unknown command 'reprot' (did you mean 'report'?)");
  const auto none = phasekv("");
  EXPECT_EQ(none.status, 106) << none.err;
  EXPECT_CONTAINS(none.err, "phasekv: error: no command given");
}

TEST(Cli, TheGuessNeedsATypoNotAnyWord) {
  EXPECT_CONTAINS(phasekv("knokcout").err, "(did you mean 'knockout'?)");
  EXPECT_CONTAINS(phasekv("sweeep").err, "(did you mean 'sweep'?)");
  for (const char* word : {"x", "deploy"}) {
    const auto r = phasekv(word);
    EXPECT_CONTAINS(r.err, std::string("unknown command '") + word + "'\n");
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
  EXPECT_CONTAINS(r.err, "Run 'phasekv sweep --help' for more information.");
  const auto missing = phasekv("sweep --model " + kv_chunked());
  EXPECT_EQ(missing.err.rfind("phasekv: error: ", 0), 0u) << missing.err;
  EXPECT_CONTAINS(missing.err, "is required");
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
  EXPECT_CONTAINS(sweep.out, "kv|lookup|passkey");
}

TEST(Cli, InfoTakesTheModelOneWayOrTheOther) {
  const auto help = phasekv("info --help");
  EXPECT_NOT_CONTAINS(help.out, "REQUIRED");
  EXPECT_EQ(phasekv("info " + kv_chunked()).status, 0);
  EXPECT_EQ(phasekv("info --model " + kv_chunked()).status, 0);
  const auto none = phasekv("info");
  EXPECT_NE(none.status, 0);
  EXPECT_CONTAINS(none.err,
                  "phasekv: error: the model directory (phasekv info DIR, or --model "
                  "DIR) is required");
  const auto both = phasekv("info " + kv_chunked() + " --model " + kv_chunked());
  EXPECT_NE(both.status, 0);
  EXPECT_CONTAINS(both.err, "excludes");
}

// Without --stream the whole sequence is one forward: --chunk alone was silently ignored.
TEST(Cli, ChunkWithoutStreamIsAnErrorNamingBoth) {
  const auto r = phasekv("logits --model " + kv_chunked() + " --tokens 1,2,3 --chunk 2");
  EXPECT_NE(r.status, 0) << r.out;
  EXPECT_CONTAINS(r.err, "phasekv: error: --chunk requires --stream");
  EXPECT_EQ(phasekv("logits --model " + kv_chunked() + " --tokens 1,2,3 --stream --chunk 2").status,
            0);
}

TEST(Cli, OutNamingAFileIsRefusedBeforeAnythingRuns) {
  const fs::path dir = test::temp_dir("cli_out_file");
  const fs::path file = dir / "taken";
  test::write_text(file, "x");
  const std::string sweep = "sweep --model " + kv_chunked() +
                            " --task kv --examples 1 --modulus 8 --padding prefix --out ";
  for (const fs::path& out : {file, file / "sub"}) {
    const auto r = phasekv(sweep + out.string());
    EXPECT_NE(r.status, 0) << r.out;
    EXPECT_CONTAINS(r.err,
                    "phasekv: error: --out: " + file.string() + " is a file, not a directory");
    EXPECT_NOT_CONTAINS(r.err, "filesystem error");
  }
  const auto logits =
      phasekv("logits --model " + kv_chunked() + " --tokens 1 --out " + dir.string());
  EXPECT_CONTAINS(logits.err, "--out: " + dir.string() + " is a directory");
  // Below the flags, the library's own directory creation says the same, naming the file.
  EXPECT_TRUE(test::throws_containing([&] { ensure_directory((file / "a" / "b").string()); },
                                      file.string() + " is a file, not a directory"));
  EXPECT_EQ(output_dir_problem((dir / "new" / "deeper").string()), "");
  fs::remove_all(dir);
}

// Two sweeps' summary.json (no model needed): `compare` requires --out and warns when M differs.
TEST(Cli, CompareNeedsOutAndWarnsWhenTheModuliDiffer) {
  const fs::path dir = test::temp_dir("cli_compare");
  const auto m8 = summarize(test::simulate_outcomes(std::vector<double>(8, 0.9), 40, 1), 8, 4);
  const auto m24 = summarize(test::simulate_outcomes(std::vector<double>(24, 0.9), 40, 2), 24, 4);
  const auto meta = nlohmann::json::object();
  write_sweep_outputs((dir / "a").string(), "a", m8, meta);
  write_sweep_outputs((dir / "b").string(), "b", m8, meta);
  write_sweep_outputs((dir / "c").string(), "c", m24, meta);
  const std::string a = (dir / "a").string(), b = (dir / "b").string(), c = (dir / "c").string();

  const auto no_out = phasekv("compare " + a + " " + b);
  EXPECT_NE(no_out.status, 0);
  EXPECT_CONTAINS(no_out.err, "phasekv: error: --out is required");

  const auto same = phasekv("compare " + a + " " + b + " --out " + (dir / "ab").string());
  EXPECT_EQ(same.status, 0) << same.err;
  EXPECT_NOT_CONTAINS(same.err, "warning");
  EXPECT_NOT_CONTAINS(test::slurp(dir / "ab" / "compare.html"), "class=\"warning\"");

  const auto mixed = phasekv("compare " + a + " " + c + " --out " + (dir / "ac").string());
  EXPECT_EQ(mixed.status, 0) << mixed.err;
  EXPECT_CONTAINS(mixed.err, "phasekv: warning: the sweeps have different moduli (" + a +
                                 ": M = 8, " + c + ": M = 24)");
  EXPECT_CONTAINS(test::slurp(dir / "ac" / "compare.html"), "class=\"warning\"");
  fs::remove_all(dir);
}

TEST(Cli, BundledPathsResolveFromTheShareDirOnlyWhenMissingHere) {
  const fs::path dir = test::temp_dir("cli_bundled");
  const fs::path share = dir / "share" / "phasekv";
  fs::create_directories(share / "models" / "m");
  EXPECT_EQ(resolve_bundled("models/m", share.string()), (share / "models" / "m").string());
  EXPECT_EQ(resolve_bundled("models/absent", share.string()), "models/absent");
  EXPECT_EQ(resolve_bundled("/abs/models/m", share.string()), "/abs/models/m");
  // A path that exists where the user stands wins: `tests` exists in the test's working
  // directory only when run from the source tree, so make one that surely does.
  fs::create_directories(share / "here");
  const fs::path cwd = fs::current_path();
  fs::current_path(dir);
  fs::create_directories(dir / "here");
  EXPECT_EQ(resolve_bundled("here", share.string()), "here");
  fs::current_path(cwd);
  fs::remove_all(dir);
}

// The layout `cmake --install` makes: PREFIX/bin/phasekv and PREFIX/share/phasekv/models. Run
// from a directory without models/, the installed binary finds the bundled model; the build's
// binary there does not.
TEST(Cli, TheInstalledBinaryFindsTheBundledModels) {
  const fs::path dir = test::temp_dir("cli_install");
  fs::create_directories(dir / "prefix" / "bin");
  fs::create_directories(dir / "prefix" / "share" / "phasekv");
  fs::copy_file(kBin, dir / "prefix" / "bin" / "phasekv");
  fs::create_directory_symlink(kSource / "models", dir / "prefix" / "share" / "phasekv" / "models");
  fs::create_directories(dir / "elsewhere");
  const std::string cd = "cd " + (dir / "elsewhere").string() + " && ";
  const auto installed = test::run_command(cd + (dir / "prefix" / "bin" / "phasekv").string() +
                                           " info models/kv-chunked");
  EXPECT_EQ(installed.status, 0) << installed.err;
  EXPECT_CONTAINS(installed.out,
                  (dir / "prefix" / "share" / "phasekv" / "models" / "kv-chunked").string());
  const auto built = test::run_command(cd + kBin + " info models/kv-chunked");
  EXPECT_NE(built.status, 0);
  EXPECT_CONTAINS(built.err, "models/kv-chunked");
  fs::remove_all(dir);
}

}  // namespace
}  // namespace phasekv
