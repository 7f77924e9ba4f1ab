// `phasekv knockout`: which heads carry retrieval at which phases (the study's "phase
// specialisation"). At the final position of every prompt (where the answer is predicted), the
// outputs of the query heads that read one KV head of one layer are replaced by their mean over a
// disjoint calibration set; nothing else changes (model/attention.h AttentionProbe). Whole-layer
// mode replaces the layer's attention output at that position instead (what the study could do
// on DeepSeek-V4).
//
// The knockout is a SweepMode (eval/sweep.h) whose conditions are "clean" and one per unit
// ("L1.H0", or "L1" for a whole layer): resumable, streamed to OUT/results.jsonl. Each unit's
// records are paired with the clean ones of the same example and phase (summarize_paired in
// eval/stats.h): per phase the accuracy and the relative change 100 (ko - clean) / clean with a
// paired cluster-bootstrap CI, and the phase-specialisation index with its permutation test.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/local_backend.h"
#include "eval/stats.h"
#include "eval/sweep.h"
#include "report/report.h"

namespace phasekv {

// Calibration prompts are the logical examples kCalibrationIdBase + k, k in [0, calibration),
// at phase k mod M: disjoint from the evaluated examples [0, examples) for any examples < 1e9.
constexpr uint64_t kCalibrationIdBase = 1000000000ULL;

enum class KnockoutUnit { kHead, kLayer, kBoth };
KnockoutUnit knockout_unit_from_string(const std::string& s);  // head|layer|both, names --unit
std::string to_string(KnockoutUnit u);

struct KnockoutOptions {
  SweepOptions sweep;  // task, examples, modulus, padding, seed, stride (the fold), out_dir, batch
  int calibration = 64;
  KnockoutUnit unit = KnockoutUnit::kHead;
  std::vector<int> layers;  // empty: every layer
};

struct KnockoutTarget {
  std::string condition;  // "L1.H0" | "L1"
  int layer = 0;
  int kv_head = -1;  // -1: the whole layer
};

struct KnockoutResult {
  std::string label;
  int modulus = 0, fold = 0;
  PhaseSummary clean;
  std::vector<KnockoutTarget> targets;
  std::vector<PairedSummary> effects;  // one per target
  nlohmann::json meta;
  RunResult run;
  nlohmann::json to_json() const;  // knockout.json
};

// Means of the per-head outputs ([H, hd]) and of the attention output ([D]) at the final
// position, per layer, over the calibration prompts.
struct KnockoutMeans {
  std::vector<torch::Tensor> heads, layer_out;
};
KnockoutMeans calibrate_knockout(Decoder& model, const SweepOptions& o, int calibration);

// The probes (one per layer) that knock `t` out with `means`.
std::vector<AttentionProbe> knockout_probes(const KnockoutMeans& means, const KnockoutTarget& t);

// Validates (throws phasekv::Error, writes nothing), calibrates, runs or resumes the knockout
// sweep and summarises it.
KnockoutResult run_knockout(LocalBackend& backend, const KnockoutOptions& o);

// knockout.csv: condition,layer,kv_head,phase,n,acc_clean,acc,change_pp,rel_change_pct,
// rel_ci_lo,rel_ci_hi (accuracies as fractions).
std::string knockout_csv(const KnockoutResult& r);
// Rows = targets, columns = phases, cells = relative change in % (0 white, -100 red).
Heatmap knockout_heatmap(const KnockoutResult& r);
// Text for the terminal: one line per target with its drop, index, p and verdict.
std::string knockout_table(const KnockoutResult& r);
// Writes knockout.json, knockout.csv, knockout.svg into dir.
void write_knockout_outputs(const std::string& dir, const KnockoutResult& r);

}  // namespace phasekv
