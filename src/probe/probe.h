// The padding probe: the study's `T.Cast(FP` experiment as an evaluation mode of the runner
// (eval/runner.h), for any Backend (an in-process model or a served one).
//
// A probe spec names the code up to a cursor, candidate continuations ("8", "32") and the
// correct one, filler families and a range of filler lengths L. The context of one item is
//
//     ids(filler text) ++ ids(code)          filler text = head + unit x k + tail
//
// where L = |ids(filler text)| is the number of tokens before the code, so the code's tokens are
// the same at every L and start at position L: only its phase mod S changes. For each family the
// smallest k giving each L is used (a sub-word tokenizer may merge repeated units, so some L
// can be unreachable; they are reported). Each candidate is tokenized on its own and appended
// as ids; its probability is the product of its tokens' conditional probabilities.
//
// One record per (family, L): condition = the family, phase = L (the run's modulus is the largest
// L + 1, so every L is a valid phase), target = the correct
// candidate's first token, prediction = the greedy next token, correct = the correct candidate
// has the highest probability of the candidates; the candidates' probabilities, the margin
// P(correct) - P(best wrong) and the winner are fields of the record (docs/PROBE.md).
#pragma once
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "eval/runner.h"

namespace phasekv {

struct FillerFamily {
  std::string name;
  std::string head, unit, tail;  // filler text = head + unit x k + tail
};

// A spec's "family" list ([[family]] name, head, unit, tail), checked: at least one, names unique
// and usable as file names, units non-empty. Throws phasekv::Error naming `where` and the key.
std::vector<FillerFamily> filler_families_from_json(const nlohmann::json& j, const std::string& where);
nlohmann::json filler_families_to_json(const std::vector<FillerFamily>& families);

struct ProbeSpec {
  std::string source;  // the spec file, for messages
  std::string code;    // the code up to the cursor
  std::vector<FillerFamily> families;
  std::vector<std::string> candidates;  // continuations, at least 2
  int correct = 0;                      // index into candidates
  int l_min = 0, l_max = 63;            // filler lengths L (tokens before the code)
  nlohmann::json to_json() const;
  std::string hash() const;  // FNV-1a 64 hex of to_json(): names the spec in the records
};

// Reads a TOML or JSON spec (docs/PROBE.md). Throws phasekv::Error naming the file, the key and
// what is allowed: empty code, fewer than 2 candidates, a `correct` that is not a candidate, no
// family, duplicate family names, an empty unit, a length range outside 0 <= l_min <= l_max.
ProbeSpec probe_spec_from_json(const nlohmann::json& j, const std::string& where);
ProbeSpec probe_spec_from_file(const std::string& path);

struct ProbePrompt {
  int k = 0;                        // units in the filler
  std::vector<int32_t> filler_ids;  // L = filler_ids.size()
};

// The token ids of one probe against one backend's tokenizer.
struct ProbePlan {
  std::vector<int32_t> code_ids;
  std::vector<std::vector<int32_t>> candidate_ids;  // per candidate
  // Per family, per reachable L in [l_min, l_hi].
  std::map<std::string, std::map<int, ProbePrompt>> prompts;
  std::map<std::string, std::vector<int>> unreachable;  // per family, L values no k gives
};

// Tokenizes the code, the candidates and the fillers for L in [spec.l_min, l_hi] (l_hi >=
// spec.l_max: --retest needs lengths past l_max). Throws phasekv::Error when a candidate or the
// code tokenizes to nothing (or the tokenizer refuses it), when the longest context (l_hi + code
// + the longest candidate) exceeds the backend's max_context, or when a family reaches no L.
ProbePlan plan_probe(Backend& backend, const ProbeSpec& spec, int l_hi);

// One family's fillers: for each L in [l_min, l_hi] the smallest k whose filler text tokenizes
// to L tokens; `unreachable` gets the L that no k gives. Throws phasekv::Error (naming `source`)
// when no L is reachable or the tokenizer refuses the text.
std::map<int, ProbePrompt> plan_fillers(Backend& backend, const FillerFamily& family, int l_min,
                                        int l_hi, const std::string& source,
                                        std::vector<int>& unreachable);

// The texts of greedy tokens, each detokenized once (a probe meets few distinct ones; served, each
// is a request); "" when the backend cannot detokenize it: a record keeps the id, the text is a
// convenience.
class TokenTexts {
 public:
  const std::string& of(Backend& backend, int32_t id);

 private:
  std::map<int32_t, std::string> texts_;
};

class ProbeMode : public EvalMode {
 public:
  ProbeMode(ProbeSpec spec, ProbePlan plan, EvalRecord identity);
  EvalRecord identity() const override { return identity_; }
  std::vector<EvalItem> items() const override;  // every (family, L) of the plan
  size_t batch_size() const override { return 16; }
  std::vector<EvalRecord> evaluate(Backend& backend, const std::vector<EvalItem>& batch) override;

 private:
  ProbeSpec spec_;
  ProbePlan plan_;
  EvalRecord identity_;
  TokenTexts top1_text_;
};

struct ProbeSummaryOptions {
  int stride = 0;         // S for the tables by L mod S; 0: the detected period (if p < 0.05)
  int retest = 1;         // K: answers at L, L+1, ..., L+K-1 compared
  int permutations = 1000;
  uint64_t seed = 12345;
};

// probe.json: per family and L the candidates' probabilities, the margin and the winner; tables
// by L mod S; the period of the margin (eval/value_period.h) over L in [l_min, l_max]; the
// rankings that follow the period; and with retest > 1 the agreement of K shifted answers.
// Throws phasekv::Error when no record succeeded.
nlohmann::json summarize_probe(const ProbeSpec& spec, const RunResult& run,
                               const ProbeSummaryOptions& options);

// The one-line verdict printed after a probe (from summarize_probe's JSON).
std::string probe_verdict(const nlohmann::json& summary);

// probe.svg (the margin against L, one line per family) and one chart per family of the
// candidates' probabilities against L; dotted lines every S tokens. Written atomically to dir.
void write_probe_charts(const std::string& dir, const nlohmann::json& summary);

}  // namespace phasekv
