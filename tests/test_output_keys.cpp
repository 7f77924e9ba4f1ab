// docs/RESULTS.md's table of output keys against the writers (issue 45, section 3): every key a
// writer writes is in the table under its file, and every key the table lists for a file is
// written, unless the table marks it optional. The writers run in process on small inputs; the
// ones that need a model or a server (results.jsonl's mode fields, audit.json outside its period
// report, conform.json outside its "conform" object) are listed in the table but not run here.
//
// Table conventions (RESULTS.md says the same): `a.b` is key b inside object a, `a[].b` key b in
// the objects of array a, `a.*` an object whose keys are data (or free-form, or another file's
// schema) and are not listed; a meaning that starts with "optional" marks a key some runs do not
// write. PHASEKV_PRINT_KEYS=1 prints every file's written keys.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "audit/period_report.h"
#include "eval/conform.h"
#include "eval/results_file.h"
#include "eval/stats.h"
#include "explain/explanation.h"
#include "explain/gate_cycle.h"
#include "explain/gates.h"
#include "explain/knockout.h"
#include "probe/flip_search.h"
#include "probe/probe.h"
#include "report/report.h"
#include "theory/flow.h"

namespace phasekv {
namespace {

using nlohmann::json;

struct TableKey {
  bool optional = false;
};

// file -> key -> row. Keys ending in ".*" are stored without the suffix in `subtrees`.
struct OutputTable {
  std::map<std::string, std::map<std::string, TableKey>> keys;
  std::map<std::string, std::map<std::string, TableKey>> subtrees;
};

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t");
  if (a == std::string::npos) return "";
  return s.substr(a, s.find_last_not_of(" \t") - a + 1);
}

// A Markdown row's cells; "\|" inside a cell is not a separator.
std::vector<std::string> cells(const std::string& line) {
  std::vector<std::string> out;
  std::string cur;
  for (size_t i = 1; i < line.size(); ++i) {
    if (line[i] == '\\' && i + 1 < line.size() && line[i + 1] == '|') {
      cur += '|';
      ++i;
    } else if (line[i] == '|') {
      out.push_back(trim(cur));
      cur.clear();
    } else {
      cur += line[i];
    }
  }
  return out;
}

std::vector<std::string> backticked(const std::string& cell) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = cell.find('`', pos)) != std::string::npos) {
    const size_t end = cell.find('`', pos + 1);
    if (end == std::string::npos) break;
    out.push_back(cell.substr(pos + 1, end - pos - 1));
    pos = end + 1;
  }
  return out;
}

OutputTable read_table() {
  const std::string path = std::string(PHASEKV_SOURCE_DIR) + "/docs/RESULTS.md";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  OutputTable t;
  std::string line;
  bool inside = false;
  while (std::getline(in, line)) {
    if (line.rfind("| file | key | meaning | glossary term |", 0) == 0) {
      inside = true;
      std::getline(in, line);  // |---|---|---|---|
      continue;
    }
    if (!inside) continue;
    if (line.empty() || line[0] != '|') break;
    const std::vector<std::string> c = cells(line);
    EXPECT_EQ(c.size(), 4u) << line;
    if (c.size() != 4) continue;
    std::string file;
    for (char ch : c[0])
      if (ch != '`') file += ch;
    const bool optional = c[2].rfind("optional", 0) == 0 || c[2].rfind("Optional", 0) == 0;
    const std::vector<std::string> ks = backticked(c[1]);
    EXPECT_FALSE(ks.empty()) << line;
    for (const std::string& k : ks) {
      if (k.size() > 2 && k.compare(k.size() - 2, 2, ".*") == 0)
        t.subtrees[file][k.substr(0, k.size() - 2)].optional = optional;
      else
        t.keys[file][k].optional = optional;
    }
  }
  EXPECT_FALSE(t.keys.empty()) << "no table headed | file | key | meaning | glossary term | in "
                               << path;
  return t;
}

const OutputTable& table() {
  static const OutputTable t = read_table();
  return t;
}

// Every path of j: "a", "a.b", "a[].b" (objects inside arrays); a subtree's paths stop at it.
void flatten(const json& j, const std::string& prefix,
             const std::map<std::string, TableKey>& subtrees, std::set<std::string>& out) {
  if (subtrees.count(prefix)) return;
  if (j.is_object()) {
    for (const auto& [k, v] : j.items()) {
      const std::string p = prefix.empty() ? k : prefix + "." + k;
      out.insert(p);
      flatten(v, p, subtrees, out);
    }
  } else if (j.is_array()) {
    for (const auto& v : j)
      if (v.is_object() || v.is_array()) flatten(v, prefix + "[]", subtrees, out);
  }
}

bool under(const std::string& key, const std::string& scope) {
  return scope.empty() || key == scope || key.rfind(scope + ".", 0) == 0 ||
         key.rfind(scope + "[]", 0) == 0;
}

// `written` against the table's rows for `file` (only those under `scope` when it is given:
// a writer that makes one part of the file).
void check(const std::string& file, const std::set<std::string>& written,
           const std::string& scope = "") {
  const std::map<std::string, TableKey> none;
  const auto& keys = table().keys.count(file) ? table().keys.at(file) : none;
  const auto& subtrees = table().subtrees.count(file) ? table().subtrees.at(file) : none;
  ASSERT_FALSE(keys.empty() && subtrees.empty()) << file << " has no row in docs/RESULTS.md";
  if (std::getenv("PHASEKV_PRINT_KEYS")) {
    std::cout << file << ":";
    for (const auto& k : written) std::cout << " " << k;
    std::cout << "\n";
  }
  for (const std::string& w : written) {
    if (keys.count(w) || subtrees.count(w)) continue;
    bool parent = false;  // an object or array whose keys the table lists
    for (const auto& [k, row] : keys) parent = parent || under(k, w);
    for (const auto& [s, row] : subtrees) parent = parent || under(s, w);
    EXPECT_TRUE(parent) << file << ": the writer writes `" << w
                        << "`, which docs/RESULTS.md's table does not list";
  }
  for (const auto& [k, row] : keys) {
    if (!row.optional && under(k, scope)) {
      EXPECT_TRUE(written.count(k))
          << file << ": docs/RESULTS.md lists `" << k << "`, which the writer does not write";
    }
  }
  for (const auto& [s, row] : subtrees) {
    if (!row.optional && under(s, scope)) {
      EXPECT_TRUE(written.count(s))
          << file << ": docs/RESULTS.md lists `" << s << ".*`, which the writer does not write";
    }
  }
}

void check_json(const std::string& file, const json& j, const std::string& scope = "") {
  std::set<std::string> written;
  const std::map<std::string, TableKey> none;
  flatten(j, "", table().subtrees.count(file) ? table().subtrees.at(file) : none, written);
  check(file, written, scope);
}

void check_csv(const std::string& file, const std::string& csv) {
  std::set<std::string> columns;
  std::stringstream header(csv.substr(0, csv.find('\n')));
  std::string c;
  while (std::getline(header, c, ',')) columns.insert(c);
  check(file, columns);
}

// Outcomes of `examples` examples at every phase of M: correct except at the boundary phases of
// stride 4 for every other example, so the summaries have a period, a split and a stride test.
std::vector<PhaseOutcome> outcomes(int M, int examples = 24) {
  std::vector<PhaseOutcome> out;
  for (int e = 0; e < examples; ++e)
    for (int r = 0; r < M; ++r) out.push_back({e, r, !(r % 4 == 3 && e % 2 == 0) && (e + r) % 7});
  return out;
}

SummaryOptions quick() {
  SummaryOptions o;
  o.bootstrap_reps = 20;
  o.permutations = 20;
  o.max_permutations = 20;
  o.period_bootstrap = 4;
  return o;
}

PhaseSummary summary(int M = 8) {
  return summarize(outcomes(M), M, 4, quick());
}

TEST(OutputKeys, SummaryJsonAndPhaseCsv) {
  json j = summary().to_json();
  j["label"] = "label";
  j["meta"] = {{"model_id", "m"}};
  check_json("summary.json", j);
  check_csv("phase.csv", phase_csv(summary()));
}

TEST(OutputKeys, ResultsJsonl) {
  EvalRecord r;
  r.model = "m";
  r.task = "kv";
  r.padding = "prefix";
  r.condition = "ensemble=2";
  r.target_logprob = -0.5;
  check_json("results.jsonl", record_to_json(r));
}

// A knockout of the given units at M = 8, S = 4, whose loss sits at phase 1 mod 4.
KnockoutResult knockout(const std::vector<KnockoutTarget>& targets) {
  KnockoutResult k;
  k.label = "knockout";
  k.modulus = 8;
  k.fold = 4;
  k.clean = summary();
  k.targets = targets;
  std::vector<PairedOutcome> pairs;
  for (int e = 0; e < 12; ++e)
    for (int r = 0; r < 8; ++r) pairs.push_back({e, r, true, r % 4 != 1});
  for (size_t i = 0; i < k.targets.size(); ++i)
    k.effects.push_back(summarize_paired(pairs, 8, 4, quick()));
  k.meta = {{"knockout",
             {{"unit", "head"}, {"examples", 12}, {"padding", "prefix"}, {"calibration", 4}}}};
  return k;
}

TEST(OutputKeys, KnockoutJsonAndCsv) {
  const KnockoutResult k = knockout({{"L0.H0", 0, 0}, {"L1", 1, -1}});
  check_json("knockout.json", k.to_json());
  check_csv("knockout.csv", knockout_csv(k));
}

// One key gate of W = S = 4 that favours slot 0.
GateStat key_gate() {
  GateStat s;
  s.side = "key";
  s.gate = "scalar";
  s.width = s.stride = 4;
  s.c.profile = {0.7, 0.1, 0.1, 0.1};
  s.c.entries = 10;
  s.c.per_entry = 1.5;
  s.c.static_conc = 2.5;
  return s;
}

TEST(OutputKeys, GatesJsonAndCsv) {
  GatesResult g;
  GateStat v = key_gate();
  v.side = "value";
  g.gates = {key_gate(), v};
  GateCheckpoint c;
  c.name = "step-100";
  c.step = 100;
  c.gates = g.gates;
  g.trajectory = {c};
  g.meta = {{"contexts", 4}};
  check_json("gates.json", g.to_json());
  check_csv("gates.csv", gates_csv(g));
}

TEST(OutputKeys, GateCycleJson) {
  GateCycleResult g;
  g.label = "cycle";
  g.modulus = 8;
  g.stride = 4;
  g.layers = {0};
  g.heads = {0};
  g.reference = summary();
  g.shifted[1] = summary();
  std::map<int, std::vector<PhaseOutcome>> shifted{{1, outcomes(8)}};
  g.fit = fit_cycle(outcomes(8), shifted, 8, 4, quick());
  g.meta = {{"gate_cycle", {{"deltas", {1}}}}};
  check_json("gate_cycle.json", g.to_json());
}

TEST(OutputKeys, ConformJson) {
  ConformSummary s;
  s.condition = "ubatch=1";
  s.modulus = 4;
  s.phases.resize(4);
  s.jumps.push_back({3, 1, 0.5});
  s.flagged = {3};
  check_json("conform.json", {{"conform", s.to_json()}}, "conform");
}

TEST(OutputKeys, AuditJsonPeriodReport) {
  json period = period_report(outcomes(8), summary(), quick());
  // summary_with_stride_P: P is the detected period.
  const json written = period;
  for (const auto& [k, v] : written.items())
    if (k.rfind("summary_with_stride_", 0) == 0) {
      period["summary_with_stride_P"] = v;
      period.erase(k);
    }
  check_json("audit.json", {{"period", period}}, "period");
}

// Records of a probe or flip search as the runner keeps them: one per (family, L).
RunResult filler_run(int l_min, int l_max, bool probe) {
  RunResult run;
  for (const char* family : {"equals", "hashes"})
    for (int L = l_min; L <= l_max; ++L) {
      EvalRecord r;
      r.condition = family;
      r.example_id = probe ? 0 : 7;
      r.phase = L;
      r.target = '8';
      r.prediction = L % 4 >= 2 ? '8' : '3';
      r.correct = r.prediction == r.target;
      const double p8 = L % 4 >= 2 ? 0.7 : 0.2;
      r.extra = {
          {"L", L},
          {"margin", p8 - (0.98 - p8)},
          {"candidates",
           {{{"prob", p8}, {"censored", false}}, {{"prob", 0.98 - p8}, {"censored", false}}}},
          {"top1", std::string(1, static_cast<char>(r.prediction))}};
      run.latest[r.key()] = r;
    }
  return run;
}

// The study's probe: "8" against "32" over L in [8, 23], two filler families.
ProbeSpec probe_spec() {
  return probe_spec_from_json(
      {{"code", "x = T.Cast(FP"},
       {"candidates", {"8", "32"}},
       {"correct", "8"},
       {"lengths", {8, 23}},
       {"family",
        {{{"name", "equals"}, {"head", ""}, {"unit", "="}, {"tail", "\n"}},
         {{"name", "hashes"}, {"head", "# "}, {"unit", "#"}, {"tail", "\n"}}}}},
      "probe.toml");
}

TEST(OutputKeys, ProbeJson) {
  ProbeSummaryOptions o;
  o.stride = 4;
  o.retest = 2;
  o.permutations = 20;
  check_json("probe.json", summarize_probe(probe_spec(), filler_run(8, 24, true), o));
}

TEST(OutputKeys, FlipsJson) {
  FlipSearchSpec spec;
  spec.l_min = 8;
  spec.l_max = 23;
  spec.families = {{"equals", "", "=", "\n"}, {"hashes", "# ", "#", "\n"}};
  FlipSite site;
  site.id = 7;
  site.file = "a.py";
  site.code = "x = f(";
  site.next_word = "8";
  FlipSummaryOptions o;
  o.stride = 4;
  std::vector<FlipSite> sites(7);  // the records' site is example 7
  sites.push_back(site);
  check_json("flips.json", summarize_flips(spec, sites, filler_run(8, 23, false), o));
}

TEST(OutputKeys, TheoryJsonAndCsvs) {
  theory::ModelConfig m;
  m.heads = 2;
  m.stride = 4;
  m.chunks = 2;
  m.vocab = 16;
  m.contexts = 8;
  theory::FlowConfig f;
  f.time = 2;
  f.eval_contexts = 8;
  f.record_every = 1;
  const theory::FlowResult r = theory::run_flow(m, f);
  check_json("theory.json", theory::to_json(r));
  check_csv("concentration.csv", theory::concentration_csv(r));
  check_csv("gates.csv (theory)", theory::gates_csv(r));
  check_csv("accuracy.csv", theory::accuracy_csv(r));
}

// Files written before the keys followed the glossary read as before: knockout.json's "fold",
// gates.json's "per_window" and probe.json's "by_residue[].r".
TEST(OutputKeys, FilesWithTheOldKeysStillRead) {
  const json now = knockout({{"L0.H0", 0, 0}}).to_json();
  json old = now;
  old.erase("stride");
  old["fold"] = 4;
  for (auto& u : old["units"]) {
    u.erase("stride");
    u["fold"] = 4;
    u["specialisation"].erase("stride");
    u["specialisation"]["fold"] = 4;
  }

  GatesResult g;
  g.gates = {key_gate()};
  g.meta = {{"contexts", 4}, {"modulus", 8}, {"padding", "prefix"}};
  const json gates_now = g.to_json();
  json gates_old = gates_now;
  for (auto& gate : gates_old["gates"]) {
    gate["windows"] = gate["entries"];
    gate["per_window"] = gate["per_entry"];
    gate.erase("entries");
    gate.erase("per_entry");
  }

  auto markdown = [](const json& knockout, const json& gates) {
    return explanation_markdown({{"knockout", "ko", knockout, {}}, {"gates", "gates", gates, {}}},
                                {{}, {}}, "", "phasekv explain report");
  };
  const std::string expected = markdown(now, gates_now);
  EXPECT_NE(expected.find("folded mod 4"), std::string::npos);
  EXPECT_NE(expected.find("| 1.50 |"), std::string::npos) << expected;
  EXPECT_EQ(markdown(old, gates_old), expected);

  ProbeSummaryOptions o;
  o.stride = 4;
  o.permutations = 20;
  const json probe_now = summarize_probe(probe_spec(), filler_run(8, 23, true), o);
  json probe_old = probe_now;
  for (auto& row : probe_old["by_residue"]) {
    row["r"] = row["phase"];
    row.erase("phase");
  }
  EXPECT_NE(probe_verdict(probe_now).find("mean margin by L mod 4: 0:"), std::string::npos);
  EXPECT_EQ(probe_verdict(probe_old), probe_verdict(probe_now));
}

}  // namespace
}  // namespace phasekv
