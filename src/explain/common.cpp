#include "explain/common.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "eval/results_file.h"
#include "util/error.h"

namespace phasekv {

void require_same_settings(const std::string& out_dir, const nlohmann::json& want) {
  const std::string path = (std::filesystem::path(out_dir) / "results.jsonl").string();
  if (!std::filesystem::exists(path)) return;
  const ResultsFile file = read_results(path);
  for (const EvalRecord& r : file.records)
    for (const auto& [key, value] : want.items()) {
      const nlohmann::json have = r.extra.contains(key) ? r.extra[key] : nlohmann::json(nullptr);
      if (have != value)
        throw Error(fmt::format(
            "{} holds records made with {} = {}, this run has {} = {}: use another --out, or the "
            "same settings to resume",
            path, key, have.dump(), key, value.dump()));
    }
}

std::vector<PairedOutcome> pair_conditions(const RunResult& run, const std::string& reference,
                                           const std::string& variant) {
  std::vector<PairedOutcome> out;
  for (const auto& [key, r] : run.latest) {
    if (r.condition != variant || !r.ok()) continue;
    auto ref = run.latest.find(ItemKey{reference, r.example_id, r.phase});
    if (ref == run.latest.end() || !ref->second.ok()) continue;
    out.push_back({r.example_id, r.phase, ref->second.correct, r.correct});
  }
  return out;
}

std::vector<int> select_indices(const std::vector<int>& chosen, int n, const std::string& flag) {
  std::set<int> out;
  for (int i : chosen) {
    if (i < 0 || i >= n)
      throw Error(fmt::format("{}: {} is outside [0, {}) (allowed: 0 ... {})", flag, i, n, n - 1));
    out.insert(i);
  }
  if (chosen.empty())
    for (int i = 0; i < n; ++i) out.insert(i);
  return {out.begin(), out.end()};
}

RunResult run_analysis(Backend& backend, SweepMode& mode, const SweepOptions& o) {
  RunOptions ro;
  ro.out_dir = o.out_dir;
  ro.label = o.progress_label;
  ro.progress = o.progress;
  ro.progress_note = o.progress_note;
  return run_items(backend, mode, ro);
}

nlohmann::json analysis_meta(const SweepOptions& o, const EvalRecord& identity,
                             const nlohmann::json& described, const RunResult& run,
                             const std::string& key, nlohmann::json settings) {
  nlohmann::json meta = o.model_meta.is_object() ? o.model_meta : nlohmann::json::object();
  meta["model_id"] = identity.model;
  meta["backend"] = described;
  settings["task"] = task_config_to_json(o.task);
  settings["examples"] = o.examples;
  settings["modulus"] = o.modulus;
  settings["padding"] = identity.padding;
  settings["seed"] = o.seed;
  settings["results"] = "results.jsonl";
  meta[key] = std::move(settings);
  meta["records"] = {{"scored_this_run", run.scored},
                     {"resumed", run.resumed},
                     {"ignored", run.ignored}};
  return meta;
}

std::string unit_name(int layer, int kv_head) {
  return kv_head >= 0 ? fmt::format("L{}.H{}", layer, kv_head) : fmt::format("L{}", layer);
}

}  // namespace phasekv
