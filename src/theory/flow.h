// Gradient flow of the idealised model (theory/model.h) from a random start, its trajectory, and
// what it ends in: which position each head picked and which positions no head covers.
#pragma once
#include <iosfwd>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "theory/model.h"

namespace phasekv::theory {

// Every field has the name of the `phasekv theory` flag that sets it (underscores as dashes).
struct FlowConfig {
  std::string integrator = "euler";  // "euler" or "rk4": c(t + dt) from dc/dt = -grad L(c)
  double dt = 4.0;                   // step of flow time
  double time = 1000.0;              // flow time integrated (steps = ceil(time / dt))
  int record_every = 5;              // steps between trajectory records (the last step is kept)
  int eval_contexts = 256;           // fresh contexts for accuracy and gate statistics
  double threshold = 0.9;            // a head is concentrated when its mean p^K(r_h) and
                                     // p^V(r_h + 1) are both at least this
  bool stop_when_concentrated = false;  // end early once every head is concentrated
};

// Throws phasekv::Error naming the flag and its allowed range.
void validate(const FlowConfig& f);

struct FlowRecord {
  int step = 0;
  double t = 0.0;
  double train_loss = 0.0;  // on the fixed sample the flow descends
  Model::Probe eval;        // on the fresh evaluation sample
};

struct HeadOutcome {
  int r = 0;          // argmax_r of the head's mean key weight
  double key = 0.0;   // mean p^K(r)
  double value = 0.0; // mean p^V(r + 1), 0 when r = S - 1 (no successor in the chunk)
  bool concentrated = false;
};

struct FlowResult {
  ModelConfig model;
  FlowConfig flow;
  std::vector<FlowRecord> records;
  std::vector<HeadOutcome> heads;
  // Per non-final position r in [0, S-1): accuracy at least 0.5 at the end, and some
  // concentrated head with r_h = r. A weak spot is a position that is not covered.
  std::vector<bool> covered, picked;
  bool all_covered = false;    // every non-final position covered (by accuracy)
  bool all_concentrated = false;
  int distinct_positions = 0;  // distinct r_h among concentrated heads
  double concentration_time = -1.0;  // first recorded t with every head concentrated; -1: never
  double seconds = 0.0;              // wall time
};

// Integrates the flow; `progress` (optional) gets one line per record.
FlowResult run_flow(const ModelConfig& model, const FlowConfig& flow,
                    std::ostream* progress = nullptr);

// Classifies heads and coverage from a probe (used by run_flow on its last record).
void classify(const Model::Probe& probe, double threshold, FlowResult& out);

nlohmann::json to_json(const FlowResult& r, bool with_records = true);

// Long-format CSVs of a trajectory: gates.csv (step,t,branch,head,position,weight),
// concentration.csv (step,t,branch,head,static_eff,entry_eff,entry_max) and accuracy.csv
// (step,t,position,accuracy,target_prob,train_loss,eval_loss).
std::string gates_csv(const FlowResult& r);
std::string concentration_csv(const FlowResult& r);
std::string accuracy_csv(const FlowResult& r);

// The probability that m heads, each picking one of n positions uniformly and independently,
// cover all n: n! S(m, n) / n^m (inclusion-exclusion). The baseline with no force between heads.
double random_cover_probability(int m, int n);

}  // namespace phasekv::theory
