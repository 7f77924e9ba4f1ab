// `phasekv gates`: how concentrated the compressor's gates are (the study's "static gate
// concentration"). For every key and value gate of every chunked layer and KV head, over the
// entries of a batch of task contexts:
//   static      exp(H(E[a]))    the effective number of slots of the mean gate: 1 when the gate
//                                 picks the same slot in every entry, W when it is uniform on
//                                 average;
//   per-entry   E[exp(H(a))]    the mean effective number of slots of one entry: 1 when every
//                                 entry is one-hot (even on different slots), W when uniform;
//   profile     E[a]            the mean weight of each slot (which slot the gate favours).
// A gate that is concentrated per entry but uniform on average selects by content; one that is
// concentrated statically selects by offset, i.e. by phase. Vector gates are measured per channel
// and averaged over the KV head's channels. Entries with slots before position 0 (W > S, entry
// 0) are left out.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "model/decoder.h"
#include "report/report.h"
#include "task/tasks.h"

namespace phasekv {

// exp(H(a)) for a weight vector summing to 1 (0 log 0 = 0): 1 for one-hot, W for uniform.
double effective_slots(const std::vector<double>& a);

struct Concentration {
  double static_conc = 0.0;
  double per_entry = 0.0;
  std::vector<double> profile;  // E[a] per slot
  int64_t entries = 0;
};
// weights [N, C, W]: N entries, C channels (1 for a scalar gate), W slots; each [n, c, :] sums
// to 1. Static and per-entry concentration per channel, then averaged over channels.
Concentration concentration(const torch::Tensor& weights);

struct GateStat {
  int layer = 0;
  std::string side;  // "key" | "value"
  int kv_head = 0;
  std::string gate;     // "scalar" | "vector" | "mean"
  bool shared = false;  // the value side reuses the key weights (tied_kv_gates, mean)
  int width = 0, stride = 0;
  Concentration c;
  int peak_slot = 0;  // argmax of the profile
  std::string name() const;  // "L0.key.h0"
};

struct GatesOptions {
  TaskConfig task;
  int contexts = 256;  // logical examples [0, contexts), example k at phase k mod M
  int modulus = 8;
  PaddingMode padding = PaddingMode::kPrefix;
  uint64_t seed = 0;
  int batch = 32;
};

// Throws phasekv::Error when the model has no chunked layer or the options are invalid.
std::vector<GateStat> measure_gates(Decoder& model, const GatesOptions& o);

struct GateCheckpoint {
  std::string name;  // the checkpoint directory's name
  int64_t step = -1;  // from its state.json, else a number ending its name; -1: unknown
  std::vector<GateStat> gates;
};

// The subdirectories of `dir` holding a model.safetensors, ordered by step (then name).
// Throws phasekv::Error naming --checkpoints when there is none.
std::vector<GateCheckpoint> list_checkpoints(const std::string& dir);

struct GatesResult {
  std::vector<GateStat> gates;               // the model
  std::vector<GateCheckpoint> trajectory;  // the checkpoints, then the model (empty without)
  nlohmann::json meta;
  nlohmann::json to_json() const;  // gates.json
};

// Measures the model, and with checkpoints_dir every checkpoint in it (weights loaded into a copy
// of the model's config; a checkpoint whose tensors do not fit throws naming the file).
GatesResult run_gates(Decoder& model, const GatesOptions& o, const std::string& checkpoints_dir);

// Rows = gates, columns = slots, cells = mean weight (white at 1/W).
Heatmap gate_profile_heatmap(const GatesResult& r);
// The (per-entry, static) plane with the diagonal; trajectories when there are checkpoints.
PlaneChart gate_plane(const GatesResult& r);
std::string gates_csv(const GatesResult& r);
std::string gates_table(const GatesResult& r);
// Writes gates.json, gates.csv, gates_profile.svg and gates_plane.svg into dir.
void write_gates_outputs(const std::string& dir, const GatesResult& r);

}  // namespace phasekv
