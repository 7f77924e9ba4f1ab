// A reproduction suite (`phasekv repro`): a list of training runs that share one base training
// config, each followed by phase sweeps of the trained model. The suite file is written before the
// runs; every run of it is kept in the results table, negative results included.
//
//   [suite]
//   name = "study"
//   base = "study-base.toml"            # a training config (relative to the suite file)
//   modulus = 24                        # sweeps: phases mod M
//   examples = 200                      # logical examples per sweep
//   paddings = ["prefix", "in_sequence"]
//   seed = 0                            # names the sweeps' logical examples
//
//   [[run]]
//   name = "W8S8-1kv"                   # [A-Za-z0-9._-]+, unique: the run's directory
//   model.attention = { stride = 8, width = 8 }   # deep-merged into the base (tables merge,
//   train = { seed = 1 }                          #   anything else replaces)
//   study = { label = "W8/S8, 1 KV", mean = 50.6, worst = 5.7, gap = 75.3, val_loss = 2.478 }
//   depth_grid = true                   # also a depth x phase sweep grid
//
// Every run's resolved config is a complete training config (model keys inline), checked by the
// same strict parser as `phasekv train` before anything runs.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace phasekv {

// The study's published figures for the row a run mirrors (accuracy %, gap pp).
struct StudyRow {
  std::string label;
  std::optional<double> val_loss, mean, worst, gap;
};

struct SuiteRun {
  std::string name;
  nlohmann::json config;  // the resolved training config (TOML keys as JSON)
  std::optional<StudyRow> study;
  bool depth_grid = false;
};

struct Suite {
  std::string path;  // the suite file
  std::string name;
  int modulus = 24;
  int examples = 200;
  uint64_t seed = 0;
  std::vector<std::string> paddings = {"prefix", "in_sequence"};
  std::vector<double> depths = {0.0, 0.25, 0.5, 0.75, 1.0};  // the depth x phase grid
  std::vector<SuiteRun> runs;
};

// Parses and checks the suite file and every run's resolved training config; throws
// phasekv::Error naming the file, the run and the key.
Suite load_suite(const std::string& path);

// Objects merge key by key (recursively); any other value of `over` replaces `base`'s.
nlohmann::json deep_merge(nlohmann::json base, const nlohmann::json& over);

}  // namespace phasekv
