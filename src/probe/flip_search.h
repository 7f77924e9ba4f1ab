// The flip search (docs/PROBE.md): the padding probe without a hand-written prompt. Over
// completion sites drawn from a corpus's held-out files, does the model's greedy next token
// change with the filler length L in front of the code, and does the change repeat with the
// compressor's stride S? Run on a compressed model and its full-attention control with the same
// sites, fillers and lengths, the rates say how often real code meets a periodic weak spot.
//
// A site is a cursor in a held-out file at the start of a word (a letter or digit after a
// character that is neither), with at least `context_chars` of the file before it; its code is
// the file from the start of the line at or before cursor - context_chars up to the cursor. Sites
// are drawn by the seed from every such cursor, the same for every model (text, not token ids).
// An item is (family, site, L) with the context ids(filler of L tokens) ++ ids(code), as in the
// probe (probe/probe.h): only the code's phase mod S moves with L. Its record: the greedy next
// token (`prediction`), whether it is the first token of the file's next word (`correct`), and
// log P(that token).
//
// Per (family, site) over L in [l_min, l_max]: constant (one greedy token at every L), a flip
// (two or more), and a periodic flip: the greedy token at each residue L mod S is a majority
// pattern that is not constant and that at least `agree` of the lengths follow (the study's
// `T.Cast(FP` example: 60 of 64 rankings). A control period P != S (default S + 1) applies the
// same test at another period, so a rate can be read against what chance patterns give.
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "eval/runner.h"
#include "probe/probe.h"

namespace phasekv {

struct FlipSearchSpec {
  std::string source;          // the spec file, for messages
  std::string manifest;        // the corpus manifest (its "held_out" files), resolved
  int sites = 256;             // sites drawn
  int context_chars = 400;     // code before each cursor, in whole lines
  int l_min = 16, l_max = 31;  // filler lengths L
  uint64_t seed = 0;
  double agree = 0.9;  // share of lengths that must follow a periodic pattern
  std::vector<FillerFamily> families;
  nlohmann::json to_json() const;
  std::string hash() const;  // names the spec in the records
};

// TOML or JSON: manifest (relative to the spec file), sites, context_chars, lengths = [l_min,
// l_max], seed, agree and [[family]] entries as in a probe spec. Throws phasekv::Error naming the
// file and the key.
FlipSearchSpec flip_search_spec_from_json(const nlohmann::json& j, const std::string& where,
                                          const std::string& base_dir);
FlipSearchSpec flip_search_spec_from_file(const std::string& path);

struct FlipSite {
  int id = 0;
  std::string file;          // as the manifest names it
  int64_t offset = 0;        // the cursor's byte offset in the file
  int line = 0;              // its 1-based line
  std::string code;          // the text before the cursor (whole lines)
  std::string next_word;     // the word after the cursor (letters, digits, _)
  std::string continuation;  // the rest of the cursor's line, at most 60 bytes
};

// The spec's sites, in (file, offset) order. Reads and checks the manifest's held-out files
// (util/manifest.h); deterministic in the spec. Throws phasekv::Error when the held-out
// files hold fewer eligible cursors than spec.sites.
std::vector<FlipSite> pick_flip_sites(const FlipSearchSpec& spec);

// The per-(family, site) verdicts: "constant", "flip" or "periodic" at period `period` (>= 2)
// of greedy tokens indexed by L = l_min, l_min + 1, ...; `agree` as in the spec. Exposed for tests.
std::string classify_flips(const std::vector<int32_t>& top1_by_length, int l_min, int period,
                           double agree);

class FlipSearchMode : public EvalMode {
 public:
  // Tokenizes every site's code and next word and the families' fillers with the backend. Throws
  // phasekv::Error when a context (l_max + the longest code) exceeds the backend's context.
  FlipSearchMode(Backend& backend, FlipSearchSpec spec, std::vector<FlipSite> sites,
                 EvalRecord identity);
  EvalRecord identity() const override { return identity_; }
  std::vector<EvalItem> items() const override;  // every (family, site, reachable L)
  size_t batch_size() const override { return 64; }
  std::vector<EvalRecord> evaluate(Backend& backend, const std::vector<EvalItem>& batch) override;
  const std::map<std::string, std::vector<int>>& unreachable() const { return unreachable_; }

 private:
  FlipSearchSpec spec_;
  std::vector<FlipSite> sites_;
  EvalRecord identity_;
  std::vector<std::vector<int32_t>> code_ids_;
  std::vector<int32_t> word_first_;  // the first token of each site's next word
  std::map<std::string, std::map<int, ProbePrompt>> fillers_;
  std::map<std::string, std::vector<int>> unreachable_;
  TokenTexts top1_text_;
};

struct FlipSummaryOptions {
  int stride = 0;          // S (required, >= 2)
  int control_period = 0;  // 0 = S + 1
  int examples = 6;        // periodic sites written as probe specs (examples/)
};

// flips.json: per family and site the greedy tokens by L and the verdicts (a (family, site) with
// fewer than two cycles of S and of the control period among its lengths is left out and
// counted in too_few_lengths); the rates of flips and
// periodic flips at S and at the control period, and of sites whose greedy token is the file's
// next word at some lengths and not at others (all, and periodic ones), with Wilson 95%
// intervals; accuracy (the greedy token is the file's next word) by L mod S over every scored
// record; and the example
// sites, those right at some phases and wrong at others first. Throws phasekv::Error when no
// record succeeded.
nlohmann::json summarize_flips(const FlipSearchSpec& spec, const std::vector<FlipSite>& sites,
                               const RunResult& run, const FlipSummaryOptions& options);

// A probe spec (probe/probe.h) for one example site of a summary: its code, its two alternating
// greedy tokens as candidates (the file's next word's token first when it is one of them), the
// spec's lengths and families; `phasekv probe` draws its charts.
nlohmann::json flip_example_probe_spec(const nlohmann::json& example, const FlipSearchSpec& spec);

std::string flips_verdict(const nlohmann::json& summary);

}  // namespace phasekv
