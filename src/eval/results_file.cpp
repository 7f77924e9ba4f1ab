#include "eval/results_file.h"

#include <cmath>
#include <set>

#include "util/error.h"
#include "util/fs.h"
#include "util/json_read.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
using json_read::require;

// The keys record_to_json writes itself; anything else in a line belongs to `extra`.
const std::set<std::string> kRecordKeys = {
    "model",   "config_hash", "task",      "seed",      "condition",  "example_id",
    "phase",   "modulus",     "padding",   "key_pos",   "value_pos",  "query_pos",
    "target",  "prediction",  "correct",   "target_logprob", "censored", "error"};

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    const size_t nl = text.find('\n', start);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  return lines;
}

bool blank(const std::string& s) {
  return s.find_first_not_of(" \t\r") == std::string::npos;
}

}  // namespace

json record_to_json(const EvalRecord& r) {
  const bool ok = r.ok();
  const bool has_lp = ok && r.target_logprob && std::isfinite(*r.target_logprob);
  json j = {{"model", r.model},
            {"config_hash", r.config_hash},
            {"task", r.task},
            {"seed", r.seed}};
  // Plain evaluations have no condition; leaving the key out keeps their lines as they were.
  if (!r.condition.empty()) j["condition"] = r.condition;
  j.update(json{{"example_id", r.example_id},
                {"phase", r.phase},
                {"modulus", r.modulus},
                {"padding", r.padding},
                {"key_pos", r.key_pos},
                {"value_pos", r.value_pos},
                {"query_pos", r.query_pos},
                {"target", r.target},
                {"prediction", ok ? json(r.prediction) : json(nullptr)},
                {"correct", ok && r.correct},
                {"target_logprob", has_lp ? json(*r.target_logprob) : json(nullptr)},
                {"censored", r.censored},
                {"error", ok ? json(nullptr) : json(r.error)}});
  if (r.extra.is_object())
    for (const auto& [k, v] : r.extra.items())
      if (!kRecordKeys.count(k)) j[k] = v;
  return j;
}

EvalRecord record_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected a JSON object (one record per line)");
  EvalRecord r;
  r.model = require<std::string>(j, "model", where);
  r.config_hash = require<std::string>(j, "config_hash", where);
  r.task = require<std::string>(j, "task", where);
  r.seed = require<uint64_t>(j, "seed", where);
  r.condition = json_read::optional<std::string>(j, "condition", where).value_or("");
  r.example_id = require<int64_t>(j, "example_id", where);
  r.phase = require<int>(j, "phase", where);
  r.modulus = require<int>(j, "modulus", where);
  r.padding = require<std::string>(j, "padding", where);
  r.key_pos = require<int>(j, "key_pos", where);
  r.value_pos = require<int>(j, "value_pos", where);
  r.query_pos = require<int>(j, "query_pos", where);
  r.target = require<int32_t>(j, "target", where);
  if (!j.contains("error")) throw Error(where + ": missing key 'error'");
  r.error = json_read::optional<std::string>(j, "error", where).value_or("");
  if (r.ok()) r.prediction = require<int32_t>(j, "prediction", where);
  r.correct = require<bool>(j, "correct", where);
  if (!j.contains("target_logprob")) throw Error(where + ": missing key 'target_logprob'");
  r.target_logprob = json_read::optional<double>(j, "target_logprob", where);
  r.censored = require<bool>(j, "censored", where);
  if (r.example_id < 0 || r.modulus < 1 || r.phase < 0 || r.phase >= r.modulus)
    throw Error(where + ": example_id " + std::to_string(r.example_id) + ", phase " +
                std::to_string(r.phase) + " mod " + std::to_string(r.modulus) +
                " (allowed: example_id >= 0, 0 <= phase < modulus)");
  for (const auto& [k, v] : j.items())
    if (!kRecordKeys.count(k)) r.extra[k] = v;
  return r;
}

ResultsFile read_results(const std::string& path) {
  const std::string text = read_file(path);
  ResultsFile f;
  f.ends_with_newline = text.empty() || text.back() == '\n';
  const std::vector<std::string> lines = split_lines(text);
  size_t last = lines.size();
  while (last > 0 && blank(lines[last - 1])) --last;
  for (size_t i = 0; i < last; ++i) {
    if (blank(lines[i])) continue;
    const std::string where = path + " line " + std::to_string(i + 1);
    json j;
    try {
      j = json::parse(lines[i]);
    } catch (const json::exception& e) {
      // Records are appended whole and flushed; only an interrupted append leaves a broken line,
      // and only as the last one.
      if (i + 1 == last) {
        f.dropped_line = true;
        continue;
      }
      throw Error(where + " is not valid JSON (" + e.what() +
                  "): only the last line may be truncated, so the file is corrupt; move it away "
                  "or use another --out");
    }
    f.records.push_back(record_from_json(j, where));
    f.lines.push_back(lines[i]);
  }
  return f;
}

void repair_results(const std::string& path, const ResultsFile& file) {
  std::string text;
  for (const auto& line : file.lines) text += line + "\n";
  write_file_atomic(path, text);
}

void check_same_run(const ResultsFile& file, const EvalRecord& want, const std::string& path) {
  for (size_t i = 0; i < file.records.size(); ++i) {
    const EvalRecord& r = file.records[i];
    std::string what;
    if (r.model != want.model)
      what = "model '" + r.model + "', this run '" + want.model + "'";
    else if (!r.config_hash.empty() && !want.config_hash.empty() &&
             r.config_hash != want.config_hash)
      what = "config_hash " + r.config_hash + ", this run " + want.config_hash;
    else if (r.task != want.task)
      what = "task " + r.task + ", this run " + want.task;
    else if (r.seed != want.seed)
      what = "seed " + std::to_string(r.seed) + ", this run " + std::to_string(want.seed);
    else if (r.modulus != want.modulus)
      what = "modulus " + std::to_string(r.modulus) + ", this run " + std::to_string(want.modulus);
    else if (r.padding != want.padding)
      what = "padding " + r.padding + ", this run " + want.padding;
    if (!what.empty())
      throw Error(path + " holds a different run (record " + std::to_string(i + 1) +
                  ": " + what + "); use another --out, or delete the file to start over");
  }
}

}  // namespace phasekv
