// `phasekv gate-cycle`: do the gates decide which phases are weak? For a model whose chunked
// layers have W = S, the offset-specific gate parameters are cycled by D slots,
//   Z'_i = Z_{(i-D) mod W},   b'_i = b_{(i-D) mod W}      (payload maps C_i unchanged),
// and the model is swept again. If the gates carry the phase preference, the accuracy profile
// moves with them: A_D(r) = A_0((r - D) mod S). fit_cycle (eval/stats.h) measures how well, with
// the boundary phase left out of the headline R^2 (the study: 0.66-1.00, the boundary stays weak).
//
// Scalar gates cycle gate_* [W, Hkv, D] and bias_* [W, Hkv]; vector gates (one map per lane,
// W = S: one lane) cycle only their per-slot bias bias_* [W, Hkv, hd]. Key and value gates move
// together. The run is a SweepMode with conditions "d0" (unshifted) and "d+1", "d-2", ...:
// resumable, one results.jsonl.
#pragma once
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "backend/local_backend.h"
#include "eval/stats.h"
#include "eval/sweep.h"
#include "report/report.h"

namespace phasekv {

// Throws phasekv::Error, naming the flag, unless every selected layer is chunked with W = S and
// a learned gate (not mean), and the heads are KV heads of the model. Returns the stride.
int check_cyclable(const ModelConfig& cfg, const std::vector<int>& layers,
                   const std::vector<int>& heads);

// Cycles the gate parameters of the selected layers and KV heads by delta slots, in place (a
// permutation: cycling by -delta restores the weights bit for bit).
void cycle_gates(Decoder& model, int delta, const std::vector<int>& layers,
                 const std::vector<int>& heads);

struct GateCycleOptions {
  SweepOptions sweep;       // the sweep's task, examples, modulus, padding, seed, out_dir, batch
  std::vector<int> deltas;  // non-zero shifts (a multiple of W is the identity)
  std::vector<int> layers;  // empty: every chunked layer
  std::vector<int> heads;   // empty: every KV head
};

struct GateCycleResult {
  std::string label;
  int modulus = 0, stride = 0;
  std::vector<int> layers, heads;
  PhaseSummary reference;                 // d = 0
  std::map<int, PhaseSummary> shifted;    // per delta
  CycleFit fit;
  nlohmann::json meta;
  RunResult run;
  nlohmann::json to_json() const;  // gate_cycle.json
};

// "d0", "d+1", "d-2".
std::string delta_condition(int delta);

GateCycleResult run_gate_cycle(LocalBackend& backend, const GateCycleOptions& o);

// Predicted against observed accuracy change per (delta, folded phase), boundary points hollow.
PlaneChart gate_cycle_chart(const GateCycleResult& r);
std::string gate_cycle_table(const GateCycleResult& r);
// Writes gate_cycle.json, gate_cycle.csv and gate_cycle.svg into dir.
void write_gate_cycle_outputs(const std::string& dir, const GateCycleResult& r);

}  // namespace phasekv
