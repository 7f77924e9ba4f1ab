#include "suite/suite.h"

#include <fmt/format.h>

#include <filesystem>
#include <numeric>
#include <regex>
#include <set>

#include "eval/sweep.h"
#include "train/train_config.h"
#include "util/config_file.h"
#include "util/error.h"
#include "util/json_read.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

const std::set<std::string> kSuiteKeys = {"name",     "base", "modulus", "examples",
                                          "paddings", "seed", "depths"};
const std::set<std::string> kRunKeys = {"name", "model", "task", "train", "study", "depth_grid"};
const std::set<std::string> kStudyKeys = {"label", "val_loss", "mean", "worst", "gap"};

StudyRow study_from_json(const json& j, const std::string& where) {
  json_read::check_keys(j, kStudyKeys, where);
  StudyRow s;
  s.label = json_read::require<std::string>(j, "label", where);
  s.val_loss = json_read::optional<double>(j, "val_loss", where);
  s.mean = json_read::optional<double>(j, "mean", where);
  s.worst = json_read::optional<double>(j, "worst", where);
  s.gap = json_read::optional<double>(j, "gap", where);
  return s;
}

void read_suite_section(const json& j, Suite& s, const std::string& where) {
  json_read::check_keys(j, kSuiteKeys, where);
  s.name = json_read::require<std::string>(j, "name", where);
  json_read::read(j, "modulus", s.modulus, where);
  json_read::read(j, "examples", s.examples, where);
  json_read::read(j, "seed", s.seed, where);
  if (j.contains("paddings")) {
    s.paddings.clear();
    for (const auto& p : j.at("paddings")) {
      if (!p.is_string() || (p != "prefix" && p != "in_sequence"))
        throw Error(where + ": 'paddings' holds " + p.dump() + " (allowed: prefix, in_sequence)");
      s.paddings.push_back(p.get<std::string>());
    }
  }
  if (j.contains("depths")) {
    s.depths.clear();
    for (const auto& d : j.at("depths")) {
      if (!d.is_number() || d.get<double>() < 0 || d.get<double>() > 1)
        throw Error(where + ": 'depths' holds " + d.dump() + " (allowed: numbers in [0, 1])");
      s.depths.push_back(d.get<double>());
    }
  }
  check_phase_grid(s.examples, s.modulus, where + ": 'examples'", where + ": 'modulus'");
  if (s.paddings.empty()) throw Error(where + ": 'paddings' is empty");
}

}  // namespace

json deep_merge(json base, const json& over) {
  if (!base.is_object() || !over.is_object()) return over;
  for (auto it = over.begin(); it != over.end(); ++it)
    base[it.key()] = base.contains(it.key()) ? deep_merge(base[it.key()], it.value()) : it.value();
  return base;
}

Suite load_suite(const std::string& path) {
  const json file = read_config_file(path);
  Suite s;
  s.path = path;
  json_read::check_keys(file, {"suite", "run"}, path);
  if (!file.contains("suite")) throw Error(path + ": missing section [suite]");
  read_suite_section(file.at("suite"), s, path + ": [suite]");
  const std::string base_rel =
      json_read::require<std::string>(file.at("suite"), "base", path + ": [suite]");
  fs::path base_path(base_rel);
  if (base_path.is_relative()) base_path = fs::path(path).parent_path() / base_path;
  const json base = read_config_file(base_path.string());
  if (base.contains("model") && base.at("model").contains("config"))
    throw Error(base_path.string() +
                ": a suite's base config needs its [model] keys inline (runs override them)");
  const std::string base_dir =
      base_path.parent_path().empty() ? "." : base_path.parent_path().string();

  if (!file.contains("run") || !file.at("run").is_array() || file.at("run").empty())
    throw Error(path + ": no [[run]] entries");
  const std::regex name_re("[A-Za-z0-9._-]+");
  std::set<std::string> names;
  for (size_t i = 0; i < file.at("run").size(); ++i) {
    const json& r = file.at("run")[i];
    std::string where = path + ": [[run]] " + std::to_string(i + 1);
    json_read::check_keys(r, kRunKeys, where);
    SuiteRun run;
    run.name = json_read::require<std::string>(r, "name", where);
    where += " '" + run.name + "'";
    if (!std::regex_match(run.name, name_re))
      throw Error(where + ": the name is a directory name (allowed: letters, digits, . _ -)");
    if (!names.insert(run.name).second) throw Error(where + ": a second run with this name");
    json over = json::object();
    for (const char* section : {"model", "task", "train"})
      if (r.contains(section)) over[section] = r.at(section);
    // Strict parsing of the merged config: a wrong key in a run fails before anything runs.
    const TrainConfig tc = train_config_from_json(deep_merge(base, over), where, base_dir);
    if (tc.corpus)
      throw Error(where +
                  ": [corpus] (a suite's runs train on a synthetic [task], which its "
                  "sweeps evaluate; train a corpus model with `phasekv train`)");
    // The run's sweeps split phases by its stride: one that does not divide the modulus would
    // fail at the first sweep, after the training (minutes to hours) was spent.
    if (const int stride = chunked_stride(tc.model); stride > 0 && s.modulus % stride != 0)
      throw Error(fmt::format(
          "{}: its stride {} does not divide the suite's modulus {} ([suite] modulus; allowed: a "
          "multiple of every run's stride, e.g. {})",
          where, stride, s.modulus,
          std::lcm(int64_t{s.modulus}, int64_t{stride})));  // int64: a stride up to 2^31 - 1
    run.config = tc.source;
    if (r.contains("study")) run.study = study_from_json(r.at("study"), where + ": study");
    json_read::read(r, "depth_grid", run.depth_grid, where);
    s.runs.push_back(std::move(run));
  }
  return s;
}

}  // namespace phasekv
