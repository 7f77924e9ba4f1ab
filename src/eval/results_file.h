// results.jsonl: one JSON record per evaluated item, appended and flushed as the run goes, so an
// interrupted run loses at most the line it was writing. docs/RESULTS.md documents the fields.
//
// Every evaluation mode (sweep, audit, knockout, ...) writes the same record shape: the run's
// identity (model, config hash, task, seed, modulus, padding), the item's key (condition,
// example_id, phase), the scored positions and the outcome. A mode's own fields live in `extra`
// and are written at the top level of the line.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

namespace phasekv {

// (condition, example_id, phase): what a record answers; the resume key.
using ItemKey = std::tuple<std::string, int64_t, int>;

struct EvalRecord {
  // The run's identity: equal in every record of one results.jsonl.
  std::string model;        // Backend::model_id()
  std::string config_hash;  // "" when the backend does not know it
  std::string task;         // "kv" | "passkey" | "text-kv" ...
  uint64_t seed = 0;
  int modulus = 1;
  std::string padding;  // "prefix" | "in_sequence"
  // The item.
  std::string condition;  // "" for a plain evaluation; a mode's variant otherwise
  int64_t example_id = 0;
  int phase = 0;
  // What was scored: absolute positions in the scored context.
  int key_pos = 0;
  int value_pos = 0;
  int query_pos = 0;  // the last context position: the prediction made here is scored
  int32_t target = 0;
  // The outcome.
  int32_t prediction = -1;  // -1 (null in JSON) on error
  bool correct = false;
  std::optional<double> target_logprob;  // null on error, when censored, or when not finite
  bool censored = false;
  std::string error;  // "" (null in JSON) when the item was scored
  nlohmann::json extra = nlohmann::json::object();  // mode-specific fields (top level in JSON)

  ItemKey key() const { return {condition, example_id, phase}; }
  bool ok() const { return error.empty(); }
};

nlohmann::json record_to_json(const EvalRecord& r);
// Strict: throws phasekv::Error naming `where` and the missing or mistyped key. Keys it does not
// know go to `extra`.
EvalRecord record_from_json(const nlohmann::json& j, const std::string& where);

// A results.jsonl as read. A last line that does not parse (an interrupted append) is dropped and
// reported in `dropped_line`; any other bad line throws phasekv::Error naming the file and line.
struct ResultsFile {
  std::vector<EvalRecord> records;  // in file order
  std::vector<std::string> lines;   // the raw text of each kept record, for a lossless rewrite
  bool dropped_line = false;
  bool ends_with_newline = true;
  bool needs_repair() const { return dropped_line || !ends_with_newline; }
};
ResultsFile read_results(const std::string& path);

// Rewrites `path` (atomically) with the kept lines of `file`, each ending in a newline, so that
// the next append starts on a fresh line.
void repair_results(const std::string& path, const ResultsFile& file);

// Throws phasekv::Error when a record of `file` belongs to another run than `want` (model,
// config hash when both know it, task, seed, modulus, padding): mixing two runs' records would
// give a summary of neither.
void check_same_run(const ResultsFile& file, const EvalRecord& want, const std::string& path);

}  // namespace phasekv
