#include "explain/gates.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <regex>

#include "model/model_dir.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

double effective_slots(const std::vector<double>& a) {
  double h = 0.0;
  for (double x : a)
    if (x > 0.0) h -= x * std::log(x);
  return std::exp(h);
}

Concentration concentration(const torch::Tensor& weights) {
  TORCH_CHECK(weights.dim() == 3, "concentration: weights must be [N, C, W]");
  auto a = weights.to(torch::kFloat64).contiguous();
  const int64_t N = a.size(0), C = a.size(1), W = a.size(2);
  Concentration c;
  c.entries = N;
  c.profile.assign(static_cast<size_t>(W), 0.0);
  if (N == 0) return c;
  // exp(H) per entry and channel: -sum a log a, with 0 log 0 = 0.
  auto plogp = torch::where(a > 0, a * torch::log(a.clamp_min(1e-300)), torch::zeros_like(a));
  auto per_entry = torch::exp(-plogp.sum(-1));        // [N, C]
  auto mean = a.mean(0);                               // [C, W]
  auto mlogm = torch::where(mean > 0, mean * torch::log(mean.clamp_min(1e-300)),
                            torch::zeros_like(mean));
  auto stat = torch::exp(-mlogm.sum(-1));              // [C]
  c.per_entry = per_entry.mean().item<double>();
  c.static_conc = stat.mean().item<double>();
  auto prof = mean.mean(0);
  for (int64_t i = 0; i < W; ++i) c.profile[static_cast<size_t>(i)] = prof[i].item<double>();
  (void)C;
  return c;
}

std::string GateStat::name() const { return fmt::format("L{}.{}.h{}", layer, side, kv_head); }

namespace {

std::string gate_name(GateKind g) {
  switch (g) {
    case GateKind::kScalar:
      return "scalar";
    case GateKind::kVector:
      return "vector";
    case GateKind::kMean:
      return "mean";
  }
  return "scalar";
}

void validate(const GatesOptions& o) {
  if (o.contexts < 1) throw Error("--contexts is " + std::to_string(o.contexts) + " (allowed: >= 1)");
  if (o.modulus < 1) throw Error("--modulus is " + std::to_string(o.modulus) + " (allowed: >= 1)");
  if (o.batch < 1) throw Error("--batch is " + std::to_string(o.batch) + " (allowed: >= 1)");
  validate(o.task, "task config");
}

// [B, n, W, Hkv(, hd)] -> per KV head g: [entries, channels, W] over entries j >= j_first.
torch::Tensor head_entries(const torch::Tensor& w, int64_t g, int64_t j_first) {
  auto x = w.narrow(1, j_first, w.size(1) - j_first).select(3, g);  // [B, n', W(, hd)]
  if (x.dim() == 3) x = x.unsqueeze(-1);                              // [B, n', W, 1]
  x = x.movedim(2, 3);                                                // [B, n', C, W]
  return x.reshape({-1, x.size(2), x.size(3)});
}

}  // namespace

std::vector<GateStat> measure_gates(Decoder& model, const GatesOptions& o) {
  validate(o);
  const ModelConfig& cfg = model->cfg;
  std::vector<size_t> chunked;
  for (size_t l = 0; l < cfg.layers.size(); ++l)
    if (cfg.layers[l].kind == AttentionKind::kChunked) chunked.push_back(l);
  if (chunked.empty())
    throw Error("the model has no chunked layer, so it has no compressor gates to measure "
                "(gates needs kind = \"chunked\" in some layer)");
  torch::NoGradGuard no_grad;
  // Weights per (layer, side): entries of every context, concatenated.
  std::map<std::pair<size_t, int>, std::vector<torch::Tensor>> collected;
  for (int start = 0; start < o.contexts; start += o.batch) {
    const int n = std::min(o.batch, o.contexts - start);
    std::vector<std::vector<int32_t>> contexts;
    for (int k = start; k < start + n; ++k) {
      const LogicalExample lg = make_logical_example(o.task, o.seed, static_cast<uint64_t>(k));
      contexts.push_back(materialize(lg, o.modulus, k % o.modulus, o.padding, false).tokens);
    }
    const int64_t T = static_cast<int64_t>(contexts[0].size());
    if (T > cfg.max_context)
      throw Error(fmt::format("contexts of {} tokens exceed the model's max_context {}", T,
                              cfg.max_context));
    auto tokens = torch::empty({n, T}, torch::kInt64);
    auto acc = tokens.accessor<int64_t, 2>();
    for (int b = 0; b < n; ++b)
      for (int64_t t = 0; t < T; ++t) acc[b][t] = contexts[static_cast<size_t>(b)][t];
    std::vector<AttentionProbe> probes(cfg.layers.size());
    for (size_t l : chunked) probes[l].capture_gates = true;
    model->hidden(tokens, &probes);
    for (size_t l : chunked) {
      collected[{l, 0}].push_back(probes[l].gate_k);
      if (probes[l].gate_v.defined()) collected[{l, 1}].push_back(probes[l].gate_v);
    }
  }
  std::vector<GateStat> out;
  for (const auto& [key, parts] : collected) {
    const auto [l, side] = key;
    const AttentionConfig& a = cfg.layers[l];
    // The first entry with no slot before position 0 on every head's grid:
    // jS + S - W - o >= 0 for the largest offset o.
    int64_t o = a.grid_offset;
    for (int h : a.kv_head_offsets) o = std::max<int64_t>(o, h);
    const int64_t j_first = (a.width - a.stride + o + a.stride - 1) / a.stride;
    auto w = torch::cat(parts, 0);
    if (j_first >= w.size(1))
      throw Error(fmt::format("layer {}: the contexts ({} tokens) hold no complete entry of {} "
                              "slots", l, w.size(1) * a.stride, a.width));
    for (int64_t g = 0; g < cfg.n_kv_heads; ++g) {
      GateStat s;
      s.layer = static_cast<int>(l);
      s.side = side == 0 ? "key" : "value";
      s.kv_head = static_cast<int>(g);
      s.gate = gate_name(a.gate);
      s.shared = side == 1 && (a.tied_kv_gates || a.gate == GateKind::kMean);
      s.width = a.width;
      s.stride = a.stride;
      s.c = concentration(head_entries(w, g, j_first));
      s.peak_slot = static_cast<int>(
          std::max_element(s.c.profile.begin(), s.c.profile.end()) - s.c.profile.begin());
      out.push_back(s);
    }
  }
  // key before value within a layer and head: order by layer, head, side.
  std::stable_sort(out.begin(), out.end(), [](const GateStat& x, const GateStat& y) {
    return std::tie(x.layer, x.kv_head, x.side) < std::tie(y.layer, y.kv_head, y.side);
  });
  return out;
}

std::vector<GateCheckpoint> list_checkpoints(const std::string& dir) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir))
    throw Error("--checkpoints: " + dir + " is not a directory (give a directory whose "
                "subdirectories each hold a model.safetensors)");
  std::vector<GateCheckpoint> out;
  const std::regex trailing("([0-9]+)$");
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory() || !fs::exists(e.path() / "model.safetensors")) continue;
    GateCheckpoint c;
    c.name = e.path().filename().string();
    const fs::path state = e.path() / "state.json";
    if (fs::exists(state)) {
      const nlohmann::json j = read_json_file(state.string());
      if (j.contains("step") && j["step"].is_number_integer()) c.step = j["step"].get<int64_t>();
    }
    std::smatch m;
    if (c.step < 0 && std::regex_search(c.name, m, trailing)) c.step = std::stoll(m[1]);
    out.push_back(c);
  }
  if (out.empty())
    throw Error("--checkpoints: " + dir + " has no subdirectory with a model.safetensors");
  std::sort(out.begin(), out.end(), [](const GateCheckpoint& a, const GateCheckpoint& b) {
    return std::tie(a.step, a.name) < std::tie(b.step, b.name);
  });
  return out;
}

GatesResult run_gates(Decoder& model, const GatesOptions& o, const std::string& checkpoints_dir) {
  GatesResult r;
  r.gates = measure_gates(model, o);
  if (!checkpoints_dir.empty()) {
    r.trajectory = list_checkpoints(checkpoints_dir);
    Decoder copy(model->cfg);
    copy->eval();
    for (auto& c : r.trajectory) {
      load_weights(copy, (std::filesystem::path(checkpoints_dir) / c.name / "model.safetensors").string());
      c.gates = measure_gates(copy, o);
    }
    GateCheckpoint final_model;
    final_model.name = "model";
    final_model.gates = r.gates;
    r.trajectory.push_back(final_model);
  }
  r.meta = {{"contexts", o.contexts},
            {"modulus", o.modulus},
            {"padding", to_string(o.padding)},
            {"seed", o.seed},
            {"task", task_config_to_json(o.task)}};
  return r;
}

namespace {

nlohmann::json gate_json(const GateStat& s) {
  return {{"name", s.name()},          {"layer", s.layer},
          {"side", s.side},            {"kv_head", s.kv_head},
          {"gate", s.gate},            {"shared_with_key", s.shared},
          {"width", s.width},          {"stride", s.stride},
          {"entries", s.c.entries},    {"static", s.c.static_conc},
          {"per_entry", s.c.per_entry}, {"profile", s.c.profile},
          {"peak_slot", s.peak_slot}};
}

}  // namespace

nlohmann::json GatesResult::to_json() const {
  nlohmann::json gs = nlohmann::json::array(), traj = nlohmann::json::array();
  for (const auto& g : gates) gs.push_back(gate_json(g));
  for (const auto& c : trajectory) {
    nlohmann::json cg = nlohmann::json::array();
    for (const auto& g : c.gates) cg.push_back(gate_json(g));
    traj.push_back({{"checkpoint", c.name},
                    {"step", c.step >= 0 ? nlohmann::json(c.step) : nlohmann::json(nullptr)},
                    {"gates", cg}});
  }
  // The value gate's peak relative to the key gate's, per layer and head (mod W).
  nlohmann::json offsets = nlohmann::json::array();
  for (const auto& k : gates) {
    if (k.side != "key") continue;
    for (const auto& v : gates)
      if (v.side == "value" && v.layer == k.layer && v.kv_head == k.kv_head && !v.shared)
        offsets.push_back({{"layer", k.layer},
                           {"kv_head", k.kv_head},
                           {"key_peak", k.peak_slot},
                           {"value_peak", v.peak_slot},
                           {"value_minus_key", ((v.peak_slot - k.peak_slot) % k.width + k.width) %
                                                   k.width}});
  }
  return {{"analysis", "gates"},
          {"gates", gs},
          {"peak_offsets", offsets},
          {"trajectory", traj},
          {"meta", meta}};
}

Heatmap gate_profile_heatmap(const GatesResult& r) {
  Heatmap h;
  h.title = "mean gate weight by slot";
  h.caption = "E[a_i] over the entries of the contexts; white = uniform 1/W, blue above, red below";
  h.x_label = "slot i of the entry (token jS + S - W + i)";
  h.y_label = "layer.side.KV head";
  h.decimals = 2;
  int W = 0;
  for (const auto& g : r.gates) W = std::max(W, g.width);
  for (int i = 0; i < W; ++i) h.cols.push_back(std::to_string(i));
  h.center = W > 0 ? 1.0 / W : 0.0;
  h.limit = W > 1 ? 1.0 - 1.0 / W : 1.0;
  for (const auto& g : r.gates) {
    h.rows.push_back(g.name());
    std::vector<double> row(g.c.profile);
    row.resize(static_cast<size_t>(W), std::nan(""));
    h.values.push_back(row);
  }
  return h;
}

PlaneChart gate_plane(const GatesResult& r) {
  PlaneChart c;
  c.title = "gate concentration: per entry vs static";
  c.x_label = "per-entry E[exp(H(a))] (1 = one-hot entries)";
  c.y_label = "static exp(H(E[a])) (1 = same slot in every entry)";
  c.lo = 1.0;
  for (const auto& g : r.gates) c.hi = std::max(c.hi, static_cast<double>(g.width));
  if (r.trajectory.empty()) {
    c.caption = "one point per gate; on the diagonal: as concentrated on average as per entry";
    for (const auto& g : r.gates)
      c.series.push_back({g.name(), {{g.c.per_entry, g.c.static_conc, false,
                                      fmt::format("{}: per-entry {:.2f}, static {:.2f}", g.name(),
                                                  g.c.per_entry, g.c.static_conc)}},
                          false});
    return c;
  }
  c.caption = "one trajectory per gate over the checkpoints; the large dot is the final model";
  for (size_t i = 0; i < r.gates.size(); ++i) {
    PlaneSeries s{r.gates[i].name(), {}, true};
    for (const auto& ck : r.trajectory) {
      if (i >= ck.gates.size()) continue;
      const GateStat& g = ck.gates[i];
      s.points.push_back({g.c.per_entry, g.c.static_conc, false,
                          fmt::format("{} @ {}: per-entry {:.2f}, static {:.2f}", g.name(),
                                      ck.name, g.c.per_entry, g.c.static_conc)});
    }
    c.series.push_back(s);
  }
  return c;
}

std::string gates_csv(const GatesResult& r) {
  std::string out = "checkpoint,step,gate,layer,side,kv_head,static,per_entry,peak_slot,profile\n";
  auto rows = [&](const std::string& ck, int64_t step, const std::vector<GateStat>& gates) {
    for (const auto& g : gates) {
      std::string prof;
      for (double p : g.c.profile) prof += (prof.empty() ? "" : " ") + fmt::format("{:.4f}", p);
      out += fmt::format("{},{},{},{},{},{},{:.4f},{:.4f},{},{}\n", ck,
                         step >= 0 ? std::to_string(step) : "", g.name(), g.layer, g.side,
                         g.kv_head, g.c.static_conc, g.c.per_entry, g.peak_slot, prof);
    }
  };
  if (r.trajectory.empty()) rows("model", -1, r.gates);
  for (const auto& c : r.trajectory) rows(c.name, c.step, c.gates);
  return out;
}

std::string gates_table(const GatesResult& r) {
  std::string out = fmt::format("{:<14} {:>7} {:>10} {:>5}  profile\n", "gate", "static",
                                "per-entry", "peak");
  for (const auto& g : r.gates) {
    std::string prof;
    for (double p : g.c.profile) prof += fmt::format(" {:.2f}", p);
    out += fmt::format("{:<14} {:>7.2f} {:>10.2f} {:>5}  {}{}\n", g.name(), g.c.static_conc,
                       g.c.per_entry, g.peak_slot, prof, g.shared ? "  (= key gate)" : "");
  }
  return out;
}

void write_gates_outputs(const std::string& dir, const GatesResult& r) {
  write_file_atomic(dir + "/gates.json", r.to_json().dump(2) + "\n");
  write_file_atomic(dir + "/gates.csv", gates_csv(r));
  write_file_atomic(dir + "/gates_profile.svg", heatmap_svg(gate_profile_heatmap(r)));
  write_file_atomic(dir + "/gates_plane.svg", plane_svg(gate_plane(r)));
}

}  // namespace phasekv
