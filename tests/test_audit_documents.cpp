// Long documents in text audits (issue 21): natural filler text from Debian's license files,
// pinned by data/filler/debian-licenses.json (sizes and SHA-256, a changed file refused), the
// target record at chosen depths, and a depth x length grid audited at every phase with a
// summary per cell, against the llama.cpp fake's planted period-4 weak spot.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <set>

#include "audit_cli.h"
#include "eval/results_file.h"
#include "fake_llamacpp.h"
#include "task/doc_grid.h"
#include "task/filler_corpus.h"
#include "test_util.h"
#include "util/error.h"
#include "util/fs.h"
#include "util/manifest.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

const std::string kManifest = std::string(PHASEKV_SOURCE_DIR) + "/data/filler/debian-licenses.json";

TEST(FillerCorpus, TheManifestPinsDebianTextsIntoSentencesWithoutDigits) {
  const FillerCorpus c = load_filler_corpus(kManifest);
  EXPECT_EQ(c.files.size(), 7u);
  EXPECT_GT(c.sentences.size(), 500u);
  for (const auto& s : c.sentences) {
    ASSERT_GE(s.size(), 2u);
    EXPECT_EQ(s[0], ' ');
    EXPECT_NE(s[1], ' ');
    EXPECT_EQ(s.find_first_of("0123456789\n\t"), std::string::npos) << s;
    EXPECT_TRUE(s.back() == '.' || s.back() == '!' || s.back() == '?') << s;
  }
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
}

// The second manifest is long enough for documents of 128K tokens without repeating its filler:
// more than a megabyte of sentences, 8 bytes per token of 131,072 tokens.
TEST(FillerCorpus, TheVimManualsHoldDocumentsOf128KTokens) {
  const FillerCorpus c =
      load_filler_corpus(std::string(PHASEKV_SOURCE_DIR) + "/data/filler/vim-manual.json");
  EXPECT_EQ(c.files.size(), 45u);
  size_t bytes = 0;
  for (const auto& s : c.sentences) {
    bytes += s.size();
    EXPECT_EQ(s.find_first_of("0123456789\n\t"), std::string::npos) << s;
  }
  EXPECT_GT(bytes, size_t{8} * 131072);
  EXPECT_GT(c.sentences.size(), 10000u);
}

TEST(FillerCorpus, AChangedOrMissingFileIsRefusedNamingBothDigests) {
  const fs::path dir = test::temp_dir("filler");
  const fs::path text = dir / "doc.txt";
  write_file_atomic(text.string(), "This is the first sentence here. And here is another one!\n");
  const std::string digest = sha256_hex(read_file(text.string()));
  const json manifest = {
      {"files", {{{"path", text.string()}, {"bytes", fs::file_size(text)}, {"sha256", digest}}}}};
  write_file_atomic((dir / "m.json").string(), manifest.dump());
  const FillerCorpus c = load_filler_corpus((dir / "m.json").string());
  EXPECT_EQ(c.sentences, std::vector<std::string>(
                             {" This is the first sentence here.", " And here is another one!"}));
  // Same size, one letter changed: the digest catches it.
  write_file_atomic(text.string(), "This is the first sentence hers. And here is another one!\n");
  EXPECT_TRUE(test::throws_containing(
      [&] { load_filler_corpus((dir / "m.json").string()); },
      "has changed: " + std::to_string(fs::file_size(text)) + " bytes, SHA-256 "));
  EXPECT_TRUE(
      test::throws_containing([&] { load_filler_corpus((dir / "m.json").string()); }, digest));
  fs::remove(text);
  EXPECT_TRUE(test::throws_containing([&] { load_filler_corpus((dir / "m.json").string()); },
                                      "does not exist"));
  write_file_atomic((dir / "bad.json").string(), R"({"files":[{"path":"x"}]})");
  EXPECT_TRUE(test::throws_containing([&] { load_filler_corpus((dir / "bad.json").string()); },
                                      "files[0]"));
}

TEST(DocGrid, LengthsAndDepthsAsNiahSpacesThem) {
  EXPECT_EQ(parse_token_list("1024,4096", "--context-tokens"), std::vector<int>({1024, 4096}));
  EXPECT_EQ(parse_depths("linear:5", "--depths"), std::vector<double>({0, 25, 50, 75, 100}));
  // Logistic spacing crowds the depths near the document's ends.
  EXPECT_EQ(parse_depths("sigmoid:5", "--depths"), std::vector<double>({0, 7.6, 50, 92.4, 100}));
  EXPECT_EQ(parse_depths("0,33.5,100", "--depths"), std::vector<double>({0, 33.5, 100}));
  EXPECT_TRUE(parse_depths("", "--depths").empty());
  for (const char* bad : {"10", "64,64", "64,", "x", "64.5"})
    EXPECT_THROW(parse_token_list(bad, "--context-tokens"), Error) << bad;
  for (const char* bad : {"101", "50,25", "-1", "linear:1", "cubic:4", "50,50"})
    EXPECT_THROW(parse_depths(bad, "--depths"), Error) << bad;
  const auto cells = doc_grid({64, 128}, {0, 100});
  ASSERT_EQ(cells.size(), 4u);
  EXPECT_EQ(cells[1].condition, "L64_d100");
  EXPECT_EQ(cells[2].context_tokens, 128);
  EXPECT_EQ(doc_grid({64}, {}).front().condition, "") << "one cell: a plain audit";
}

TEST(AuditDocuments, ADepthByLengthGridOfNaturalTextFindsTheWeakPhasesInEveryCell) {
  test::FakeLlamaServer server;
  const fs::path out = test::temp_dir("audit_docs") / "grid";
  const auto cli = test::run_audit_cli(
      server.endpoint(), "any", out, "--filler " + kManifest,
      "--modulus 8 --examples 6 --records 3 --context-tokens 60,160 --depths 0,50,100");
  ASSERT_EQ(cli.status, 0) << cli.log;
  const json a = json::parse(read_file((out / "audit.json").string()));
  EXPECT_EQ(a["filler"]["manifest"], kManifest);
  EXPECT_EQ(a["period"]["detected_period"], 4) << a["period"].dump();
  ASSERT_EQ(a["cells"].size(), 6u);
  for (const auto& c : a["cells"]) {
    // The fake's weak spot: key positions 3 mod 4 answer a lone UTF-8 byte.
    EXPECT_EQ(c["worst_phase"].get<int>() % 4, 3) << c.dump();
    EXPECT_DOUBLE_EQ(c["worst_acc"].get<double>(), 0.0) << c.dump();
    EXPECT_DOUBLE_EQ(c["gap_pp"].get<double>(), 100.0) << c.dump();
    EXPECT_EQ(c["outcomes"], 48);
    // Depth 0 and 100 are the body's ends (after the intro; before the last records' text);
    // between them the target goes to the nearest sentence boundary, coarse in short bodies.
    if (c["depth_pct"] != 50.0) {
      EXPECT_NEAR(c["depth_measured_pct"].get<double>(), c["depth_pct"].get<double>(), 15.0)
          << c.dump();
    }
  }
  EXPECT_CONTAINS(cli.log, "depth x length (worst phase: accuracy, gap pp):");
  // The per-phase table per length: every depth of a length pooled, one accuracy per phase.
  ASSERT_EQ(a["lengths"].size(), 2u);
  EXPECT_EQ(a["lengths"][0]["context_len"], 60);
  EXPECT_EQ(a["lengths"][1]["context_len"], 160);
  for (const auto& row : a["lengths"]) {
    ASSERT_EQ(row["phase_acc"].size(), 8u) << row.dump();
    for (int r = 0; r < 8; ++r) {
      EXPECT_EQ(row["phase_n"][r], 18) << "3 depths x 6 examples at r = " << r;
      if (r % 4 == 3) {
        EXPECT_DOUBLE_EQ(row["phase_acc"][r].get<double>(), 0.0) << row.dump();
      }
    }
    EXPECT_DOUBLE_EQ(row["gap_pp"].get<double>(), 100.0) << row.dump();
  }
  EXPECT_CONTAINS(cli.log, "per-phase accuracy by context length (all depths pooled):");
  // The HTML report shows the same per-length table and the depth x length cells.
  const std::string html = read_file((out / "report.html").string());
  EXPECT_CONTAINS(html, "<h2>By context length</h2>");
  EXPECT_CONTAINS(html, "Worst-phase accuracy (%) by depth and context length");
  EXPECT_CONTAINS(html, "<td class=\"num\">160</td>");
  // Every length's weak phases (3 and 7) are shown at 0.000 and the worst one is marked.
  EXPECT_CONTAINS(html, "<td class=\"num worst\">0.000</td>");
  // Longer documents have longer prompts, each cell at its own length.
  const auto records = read_results((out / "results.jsonl").string()).records;
  ASSERT_EQ(records.size(), 288u);
  int short_len = 0, long_len = 0;
  for (const auto& r : records) {
    EXPECT_EQ(r.key_pos % 8, r.phase);
    EXPECT_TRUE(r.extra.value("position_ok", false)) << r.condition;
    (r.condition.rfind("L60_", 0) == 0 ? short_len : long_len) = r.query_pos;
  }
  EXPECT_GT(long_len, short_len + 50);
  // A rerun resumes every cell: nothing is left to score.
  const auto again = test::run_audit_cli(
      server.endpoint(), "any", out, "--filler " + kManifest + " --dry-run",
      "--modulus 8 --examples 6 --records 3 --context-tokens 60,160 --depths 0,50,100");
  EXPECT_CONTAINS(again.log, "plan: 0 of 288 items to score");
}

// Multi-needle: three targets per document, each asked by its own question and scored on its own.
// Every needle visits every phase, its own key at the record's phase; the fake's weak spot (key
// positions 3 mod 4) is found per needle; the needles of one example are the same document with
// different targets; needle 0 is the single-needle audit's target, record for record.
TEST(AuditDocuments, SeveralNeedlesPerDocumentAreScoredSeparatelyAtEveryPhase) {
  test::FakeLlamaServer server;
  const fs::path dir = test::temp_dir("audit_needles");
  const std::string flags = "--modulus 8 --examples 5 --records 6 --context-tokens 120";
  const auto cli = test::run_audit_cli(server.endpoint(), "any", dir / "multi",
                                       "--filler " + kManifest, flags + " --needles 3");
  ASSERT_EQ(cli.status, 0) << cli.log;
  const json a = json::parse(read_file((dir / "multi" / "audit.json").string()));
  EXPECT_EQ(a["task"]["needles"], 3);
  ASSERT_EQ(a["needles"].size(), 3u);
  for (const auto& n : a["needles"]) {
    EXPECT_EQ(n["outcomes"], 40) << n.dump();
    EXPECT_EQ(n["worst_phase"].get<int>() % 4, 3) << n.dump();
    EXPECT_DOUBLE_EQ(n["gap_pp"].get<double>(), 100.0) << n.dump();
  }
  EXPECT_EQ(a["period"]["detected_period"], 4) << a["period"].dump();
  EXPECT_CONTAINS(cli.log, "per needle (each scored by its own question; all cells pooled):");
  const auto records = read_results((dir / "multi" / "results.jsonl").string()).records;
  ASSERT_EQ(records.size(), 120u);
  std::map<std::pair<int64_t, int>, std::set<int32_t>> targets;  // (example, phase) -> targets
  std::map<std::pair<int64_t, int>, int> key_pos_needle0;
  for (const auto& r : records) {
    const int needle = r.extra.value("needle", -1);
    ASSERT_GE(needle, 0) << r.condition;
    EXPECT_EQ(r.condition, "n" + std::to_string(needle));
    EXPECT_EQ(r.key_pos % 8, r.phase);
    EXPECT_TRUE(r.extra.value("position_ok", false));
    targets[{r.example_id, r.phase}].insert(r.target);
    if (needle == 0) key_pos_needle0[{r.example_id, r.phase}] = r.key_pos;
  }
  int distinct = 0;
  for (const auto& [key, t] : targets) distinct += t.size() == 3 ? 1 : 0;
  EXPECT_EQ(distinct, 40) << "three different values asked of every document";
  // The single-needle audit of the same examples: needle 0's prompts, key for key.
  const auto one = test::run_audit_cli(server.endpoint(), "any", dir / "one",
                                       "--filler " + kManifest, flags);
  ASSERT_EQ(one.status, 0) << one.log;
  for (const auto& r : read_results((dir / "one" / "results.jsonl").string()).records) {
    EXPECT_EQ(r.condition, "");
    EXPECT_EQ(r.key_pos, (key_pos_needle0[{r.example_id, r.phase}])) << r.example_id;
  }
  // More needles than records is refused before anything is sent.
  const auto bad = test::run_audit_cli(server.endpoint(), "any", dir / "bad", "",
                                       flags + " --needles 7");
  EXPECT_NE(bad.status, 0);
  EXPECT_CONTAINS(bad.log, "--needles is 7 (allowed: 1..--n-records = 6)");
}

// A document longer than the --filler corpus wraps around it: every such record says so
// (filler_repeats), audit.json counts them and the run warns; a corpus long enough says nothing.
TEST(AuditDocuments, ADocumentLongerThanTheCorpusIsFlaggedAsRepeatingItsFiller) {
  const fs::path dir = test::temp_dir("audit_wrap");
  const fs::path text = dir / "doc.txt";
  write_file_atomic(text.string(), "The river runs past the old mill. Grass grows on the hill.\n");
  const json manifest = {{"files",
                          {{{"path", text.string()},
                            {"bytes", fs::file_size(text)},
                            {"sha256", sha256_hex(read_file(text.string()))}}}}};
  write_file_atomic((dir / "m.json").string(), manifest.dump());
  test::FakeLlamaServer server;
  const auto cli =
      test::run_audit_cli(server.endpoint(), "any", dir / "out", "--filler " + (dir / "m.json").string(),
                          "--modulus 4 --examples 2 --records 2 --context-tokens 120");
  ASSERT_EQ(cli.status, 0) << cli.log;
  const json a = json::parse(read_file((dir / "out" / "audit.json").string()));
  EXPECT_EQ(a["records"]["filler_repeats"], 8) << a["records"].dump();
  // The plan says so before anything is scored (--dry-run shows it too).
  EXPECT_EQ(a["plan"]["filler_repeats"], 8) << a["plan"].dump();
  EXPECT_CONTAINS(cli.log, "filler: 8 of 8 items' documents are longer than the filler corpus");
  EXPECT_CONTAINS(cli.log, "longer than the --filler corpus (2 sentences)");
  for (const auto& r : read_results((dir / "out" / "results.jsonl").string()).records)
    EXPECT_TRUE(r.extra.value("filler_repeats", false));
  // The Debian corpus (578 sentences) covers a 160-token document: no flag.
  const auto long_corpus = test::run_audit_cli(server.endpoint(), "any", dir / "out2",
                                               "--filler " + kManifest,
                                               "--modulus 4 --examples 2 --records 2 --context-tokens 160");
  ASSERT_EQ(long_corpus.status, 0) << long_corpus.log;
  EXPECT_EQ(json::parse(read_file((dir / "out2" / "audit.json").string()))["records"]["filler_repeats"], 0);
  EXPECT_NOT_CONTAINS(long_corpus.log, "longer than the --filler corpus");
}

}  // namespace
}  // namespace phasekv
