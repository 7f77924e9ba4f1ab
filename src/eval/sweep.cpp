#include "eval/sweep.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <ostream>
#include <utility>

#include "report/report.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

using json = nlohmann::json;
using PairKey = std::pair<int64_t, int>;  // (example_id, phase)

// ---------------------------------------------------------------------------------------------
// Record (de)serialisation: strict, so a hand-edited or foreign file fails with the key's name.

const json& field(const json& j, const char* key, const std::string& where) {
  if (!j.contains(key)) throw Error(where + ": missing key '" + key + "'");
  return j[key];
}

[[noreturn]] void type_error(const char* key, const std::string& where, const char* expected) {
  throw Error(where + ": key '" + key + "' is not " + expected);
}

int64_t get_int(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_number_integer()) type_error(key, where, "an integer");
  return v.get<int64_t>();
}

uint64_t get_uint(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_number_unsigned()) type_error(key, where, "a non-negative integer");
  return v.get<uint64_t>();
}

bool get_bool(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_boolean()) type_error(key, where, "true or false");
  return v.get<bool>();
}

std::string get_string(const json& j, const char* key, const std::string& where) {
  const json& v = field(j, key, where);
  if (!v.is_string()) type_error(key, where, "a string");
  return v.get<std::string>();
}

}  // namespace

json sweep_record_to_json(const SweepRecord& r) {
  const bool ok = r.error.empty();
  const bool has_lp = ok && r.target_logprob && std::isfinite(*r.target_logprob);
  return {{"model", r.model},
          {"config_hash", r.config_hash},
          {"task", r.task},
          {"seed", r.seed},
          {"example_id", r.example_id},
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
          {"error", ok ? json(nullptr) : json(r.error)}};
}

SweepRecord sweep_record_from_json(const json& j, const std::string& where) {
  if (!j.is_object()) throw Error(where + ": expected a JSON object (one record per line)");
  SweepRecord r;
  r.model = get_string(j, "model", where);
  r.config_hash = get_string(j, "config_hash", where);
  r.task = get_string(j, "task", where);
  r.seed = get_uint(j, "seed", where);
  r.example_id = get_int(j, "example_id", where);
  r.phase = static_cast<int>(get_int(j, "phase", where));
  r.modulus = static_cast<int>(get_int(j, "modulus", where));
  r.padding = get_string(j, "padding", where);
  r.key_pos = static_cast<int>(get_int(j, "key_pos", where));
  r.value_pos = static_cast<int>(get_int(j, "value_pos", where));
  r.query_pos = static_cast<int>(get_int(j, "query_pos", where));
  r.target = static_cast<int32_t>(get_int(j, "target", where));
  const json& error = field(j, "error", where);
  if (!error.is_null() && !error.is_string()) type_error("error", where, "null or a string");
  if (error.is_string()) r.error = error.get<std::string>();
  if (r.error.empty()) r.prediction = static_cast<int32_t>(get_int(j, "prediction", where));
  r.correct = get_bool(j, "correct", where);
  const json& lp = field(j, "target_logprob", where);
  if (!lp.is_null() && !lp.is_number()) type_error("target_logprob", where, "null or a number");
  if (lp.is_number()) r.target_logprob = lp.get<double>();
  r.censored = get_bool(j, "censored", where);
  if (r.example_id < 0 || r.modulus < 1 || r.phase < 0 || r.phase >= r.modulus)
    throw Error(where + ": example_id " + std::to_string(r.example_id) + ", phase " +
                std::to_string(r.phase) + " mod " + std::to_string(r.modulus) +
                " (allowed: example_id >= 0, 0 <= phase < modulus)");
  return r;
}

ResultsFile read_results(const std::string& path) {
  const std::string text = read_file(path);
  ResultsFile f;
  f.ends_with_newline = text.empty() || text.back() == '\n';
  std::vector<std::string> lines;
  for (size_t start = 0; start < text.size();) {
    const size_t nl = text.find('\n', start);
    const size_t end = nl == std::string::npos ? text.size() : nl;
    lines.push_back(text.substr(start, end - start));
    start = end + 1;
  }
  auto blank = [](const std::string& s) {
    return s.find_first_not_of(" \t\r") == std::string::npos;
  };
  size_t last = lines.size();
  while (last > 0 && blank(lines[last - 1])) --last;
  for (size_t i = 0; i < last; ++i) {
    if (blank(lines[i])) continue;
    const std::string where = path + " line " + std::to_string(i + 1);
    json j;
    try {
      j = json::parse(lines[i]);
    } catch (const json::parse_error& e) {
      // Records are appended whole; only an interrupted append leaves a broken last line.
      if (i + 1 == last) {
        f.dropped_line = true;
        continue;
      }
      throw Error(where + " is not valid JSON (" + e.what() +
                  "): only the last line may be truncated, so the file is corrupt; move it away "
                  "or use another --out");
    }
    f.records.push_back(sweep_record_from_json(j, where));
    f.lines.push_back(lines[i]);
  }
  return f;
}

namespace {

// ---------------------------------------------------------------------------------------------
// Validation: everything that can be checked before a file is touched.

int meta_int(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int>() : 0;
}

std::string meta_string(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

void validate_options(const SweepOptions& o) {
  if (o.examples < 1)
    throw Error("--examples is " + std::to_string(o.examples) + " (allowed: >= 1)");
  if (o.modulus < 1)
    throw Error("--modulus is " + std::to_string(o.modulus) +
                " (allowed: >= 1; a multiple of the stride, e.g. 8 for S = 4)");
  if (o.batch < 1) throw Error("--batch is " + std::to_string(o.batch) + " (allowed: >= 1)");
  if (o.stride < 0)
    throw Error("--stride is " + std::to_string(o.stride) + " (allowed: >= 1, or 0 = the model's)");
  if (o.padding != PaddingMode::kPrefix && o.padding != PaddingMode::kInSequence)
    throw Error("unknown padding mode (allowed: prefix, in_sequence)");
  if (o.task.kind != TaskKind::kKv && o.task.kind != TaskKind::kPasskey)
    throw Error("unknown task (allowed: kv, passkey)");
  validate(o.task, "task config");
  if (o.stride > 0 && o.modulus % o.stride != 0)
    throw Error(fmt::format(
        "--stride {} does not divide the modulus {}: the phase r = p mod M determines p mod S only "
        "when S divides M (use a modulus that is a multiple of the stride)",
        o.stride, o.modulus));
  if (o.out_dir.empty()) throw Error("no output directory given (--out DIR)");
}

// The context a request sends: materialized without the answer, so it ends at the target key.
TaskExample materialize_request(const LogicalExample& lg, const SweepOptions& o, int phase) {
  TaskExample ex = materialize(lg, o.modulus, phase, o.padding, false);
  if (ex.target().query_pos + 1 != static_cast<int>(ex.tokens.size()))
    throw Error("internal: the materialized context does not end at the target query key");
  return ex;
}

// Every example of a sweep has the same length (it depends on the modulus only), so example 0
// decides whether the sweep fits the model.
void check_fits(Backend& backend, const json& described, const SweepOptions& o) {
  const TaskExample ex = materialize_request(make_logical_example(o.task, o.seed, 0), o, 0);
  const int64_t len = static_cast<int64_t>(ex.tokens.size());
  if (len > backend.max_context())
    throw Error(fmt::format(
        "context of {} tokens exceeds the model's max_context {} (the task's context_len {} "
        "without the answer, plus {} padding tokens for modulus {}); lower the modulus or the "
        "task's context_len",
        len, backend.max_context(), o.task.context_len, o.modulus - 1, o.modulus));
  const int vocab = meta_int(described, "vocab_size");
  const int task_vocab_size = task_vocab(o.task).vocab_size();
  if (vocab > 0 && task_vocab_size > vocab)
    throw Error(fmt::format(
        "the task's vocabulary has {} tokens but the model's vocab_size is {} (the task config "
        "must be the one the model was trained on)",
        task_vocab_size, vocab));
}

// The fields every record of one sweep shares.
SweepRecord record_template(Backend& backend, const json& described, const SweepOptions& o) {
  SweepRecord r;
  r.model = backend.model_id();
  r.config_hash = meta_string(o.model_meta, "config_hash");
  if (r.config_hash.empty()) r.config_hash = meta_string(described, "config_hash");
  r.task = to_string(o.task.kind);
  r.seed = o.seed;
  r.modulus = o.modulus;
  r.padding = to_string(o.padding);
  return r;
}

// An existing results.jsonl must come from the same sweep: mixing records of two models or seeds
// would produce a summary of neither.
void check_same_sweep(const ResultsFile& f, const SweepRecord& want, const std::string& path) {
  for (size_t i = 0; i < f.records.size(); ++i) {
    const SweepRecord& r = f.records[i];
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
      throw Error(path + " holds a different sweep (record " + std::to_string(i + 1) + ": " + what +
                  "); use another --out, or delete the file to start over");
  }
}

// The stride the statistics use, and where it came from.
std::pair<int, std::string> choose_stride(const SweepOptions& o, const json& described,
                                          std::ostream* progress) {
  if (o.stride > 0) return {o.stride, "option"};
  int s = meta_int(o.model_meta, "stride");
  if (s <= 0) s = meta_int(described, "stride");
  if (s <= 0) return {0, "unknown"};
  if (o.modulus % s != 0) {
    if (progress)
      *progress << fmt::format(
          "warning: the model's stride {} does not divide the modulus {}; no interior/boundary "
          "split (use a multiple of {})\n",
          s, o.modulus, s);
    return {0, fmt::format("model stride {} does not divide the modulus", s)};
  }
  return {s, "model"};
}

// ---------------------------------------------------------------------------------------------
// Scoring.

// Latest record per (example, phase): a success is never replaced, an error is (a rerun retries
// it, and the file then holds both lines).
void keep(std::map<PairKey, SweepRecord>& latest, SweepRecord r) {
  const PairKey key{r.example_id, r.phase};
  auto it = latest.find(key);
  if (it == latest.end())
    latest.emplace(key, std::move(r));
  else if (!it->second.error.empty())
    it->second = std::move(r);
}

SweepRecord make_record(const SweepRecord& base, const TaskExample& ex, const ScoreResult& res) {
  SweepRecord r = base;
  const TaskQuery& t = ex.target();
  r.example_id = static_cast<int64_t>(ex.logical_id);
  r.phase = ex.phase;
  r.key_pos = t.key_pos;
  r.value_pos = t.value_pos;
  r.query_pos = t.query_pos;
  r.target = t.answer;
  if (!res.error.empty()) {
    r.error = res.error;
    return r;
  }
  r.prediction = res.argmax;
  r.correct = res.argmax == t.answer;
  r.censored = res.censored;
  if (!res.censored) r.target_logprob = res.target_logprob;
  return r;
}

void rewrite_results(const std::string& path, const ResultsFile& f) {
  std::string text;
  for (const auto& line : f.lines) text += line + "\n";
  write_file_atomic(path, text);
}

class Progress {
 public:
  Progress(std::ostream* out, size_t total) : out_(out), total_(total) {}
  void update(size_t done, bool final = false) {
    if (!out_) return;
    const auto now = std::chrono::steady_clock::now();
    if (!final && now - last_ < std::chrono::seconds(5)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    *out_ << fmt::format("sweep: {}/{} scored ({:.0f} %, {:.1f}/s)\n", done, total_,
                         total_ ? 100.0 * static_cast<double>(done) / total_ : 100.0,
                         secs > 0 ? static_cast<double>(done) / secs : 0.0)
          << std::flush;
  }

 private:
  std::ostream* out_;
  size_t total_;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

// Scores `pending` in batches, appending each batch's records to `out` before the next one.
void score_pending(Backend& backend, const SweepOptions& o, const SweepRecord& base,
                   const std::vector<PairKey>& pending, std::ofstream& out, const std::string& path,
                   std::map<PairKey, SweepRecord>& latest) {
  Progress progress(o.progress, pending.size());
  std::optional<LogicalExample> lg;
  for (size_t start = 0; start < pending.size(); start += static_cast<size_t>(o.batch)) {
    const size_t end = std::min(pending.size(), start + static_cast<size_t>(o.batch));
    std::vector<TaskExample> examples;
    std::vector<ScoreRequest> requests;
    for (size_t i = start; i < end; ++i) {
      const auto [id, phase] = pending[i];
      if (!lg || static_cast<int64_t>(lg->id) != id)
        lg = make_logical_example(o.task, o.seed, static_cast<uint64_t>(id));
      examples.push_back(materialize_request(*lg, o, phase));
      requests.push_back({examples.back().tokens, examples.back().target().answer});
    }
    const std::vector<ScoreResult> results = backend.score(requests);
    if (results.size() != requests.size())
      throw Error(fmt::format("backend {} returned {} results for {} requests", base.model,
                              results.size(), requests.size()));
    std::string lines;
    for (size_t i = 0; i < results.size(); ++i) {
      SweepRecord r = make_record(base, examples[i], results[i]);
      lines += sweep_record_to_json(r).dump() + "\n";
      keep(latest, std::move(r));
    }
    out << lines;
    out.flush();
    if (!out) throw Error("cannot append to " + path + " (disk full?)");
    progress.update(end);
  }
  if (!pending.empty()) progress.update(pending.size(), true);
}

// ---------------------------------------------------------------------------------------------
// Summary.

struct Tally {
  std::vector<PhaseOutcome> outcomes;
  int64_t errors = 0, censored = 0, ignored = 0;
  std::string first_error;
  std::vector<int64_t> per_phase;  // successful outcomes
  json mean_logprob = json::array();
};

Tally tally(const std::map<PairKey, SweepRecord>& latest, const SweepOptions& o) {
  Tally t;
  t.per_phase.assign(static_cast<size_t>(o.modulus), 0);
  std::vector<double> lp_sum(static_cast<size_t>(o.modulus), 0.0);
  std::vector<int64_t> lp_n(static_cast<size_t>(o.modulus), 0);
  for (const auto& [key, r] : latest) {
    // Records of examples beyond this run's count (an earlier, larger sweep) stay in the file.
    if (r.example_id >= o.examples) {
      ++t.ignored;
      continue;
    }
    if (!r.error.empty()) {
      if (t.errors++ == 0) t.first_error = r.error;
      continue;
    }
    const auto p = static_cast<size_t>(r.phase);
    t.outcomes.push_back({r.example_id, r.phase, r.correct});
    ++t.per_phase[p];
    if (r.censored) ++t.censored;
    if (r.target_logprob && std::isfinite(*r.target_logprob)) {
      lp_sum[p] += *r.target_logprob;
      ++lp_n[p];
    }
  }
  for (size_t p = 0; p < lp_sum.size(); ++p)
    t.mean_logprob.push_back(lp_n[p] ? json(lp_sum[p] / static_cast<double>(lp_n[p]))
                                     : json(nullptr));
  return t;
}

void require_every_phase(const Tally& t, const std::string& path) {
  for (size_t p = 0; p < t.per_phase.size(); ++p)
    if (t.per_phase[p] == 0)
      throw Error(fmt::format(
          "phase {} has no successful outcome ({} failed requests in all, first: {}); {} keeps "
          "what was scored: rerun the same command to retry the failed ones",
          p, t.errors, t.first_error.empty() ? "-" : t.first_error, path));
}

json build_meta(const SweepOptions& o, const json& described, const SweepRecord& base,
                const Tally& t, const std::pair<int, std::string>& stride, int64_t scored,
                int64_t resumed) {
  json meta = o.model_meta.is_object() ? o.model_meta : json::object();
  if (!o.model_meta.is_null() && !o.model_meta.is_object()) meta["model"] = o.model_meta;
  meta["model_id"] = base.model;
  meta["config_hash"] = base.config_hash;
  meta["backend"] = described;
  meta["sweep"] = {{"task", task_config_to_json(o.task)},
                   {"examples", o.examples},
                   {"modulus", o.modulus},
                   {"padding", base.padding},
                   {"seed", o.seed},
                   {"stride", stride.first > 0 ? json(stride.first) : json(nullptr)},
                   {"stride_source", stride.second},
                   {"batch", o.batch},
                   {"results", "results.jsonl"}};
  meta["records"] = {{"outcomes", static_cast<int64_t>(t.outcomes.size())},
                     {"scored_this_run", scored},
                     {"resumed", resumed},
                     {"errors", t.errors},
                     {"censored", t.censored},
                     {"ignored_beyond_examples", t.ignored}};
  if (!t.first_error.empty()) meta["records"]["first_error"] = t.first_error;
  meta["mean_target_logprob_by_phase"] = t.mean_logprob;
  meta["shortcut_ceiling"] = shortcut_ceiling(o.task, o.seed, o.examples);
  return meta;
}

}  // namespace

SweepResult run_sweep(Backend& backend, const SweepOptions& o) {
  validate_options(o);
  const json described = backend.describe();
  check_fits(backend, described, o);
  const SweepRecord base = record_template(backend, described, o);
  const std::string path = (std::filesystem::path(o.out_dir) / "results.jsonl").string();

  // Read and check an earlier run before anything is written.
  std::optional<ResultsFile> existing;
  if (std::filesystem::exists(path)) {
    existing = read_results(path);
    check_same_sweep(*existing, base, path);
  }
  const auto stride = choose_stride(o, described, o.progress);

  std::map<PairKey, SweepRecord> latest;
  if (existing)
    for (const auto& r : existing->records) keep(latest, r);
  std::vector<PairKey> pending;
  int64_t resumed = 0;
  for (int64_t e = 0; e < o.examples; ++e) {
    for (int r = 0; r < o.modulus; ++r) {
      auto it = latest.find({e, r});
      if (it != latest.end() && it->second.error.empty())
        ++resumed;
      else
        pending.push_back({e, r});
    }
  }

  try {
    std::filesystem::create_directories(o.out_dir);
  } catch (const std::filesystem::filesystem_error& e) {
    throw Error("cannot create output directory " + o.out_dir + ": " + e.what());
  }
  if (existing && (existing->dropped_line || !existing->ends_with_newline)) {
    rewrite_results(path, *existing);
    if (o.progress)
      *o.progress << "resume: " << path
                  << (existing->dropped_line ? ": dropped a truncated last line\n"
                                             : ": completed the last line\n");
  }
  if (o.progress && resumed > 0)
    *o.progress << fmt::format("resume: {} of {} evaluations already in {}\n", resumed,
                               static_cast<int64_t>(o.examples) * o.modulus, path);
  {
    std::ofstream out(path, std::ios::binary | std::ios::app);
    if (!out) throw Error("cannot open " + path + " for appending");
    score_pending(backend, o, base, pending, out, path, latest);
  }

  const Tally t = tally(latest, o);
  require_every_phase(t, path);
  SweepResult result;
  result.summary = summarize(t.outcomes, o.modulus, stride.first, o.stats);
  result.scored = static_cast<int64_t>(pending.size());
  result.resumed = resumed;
  result.errors = t.errors;
  result.censored = t.censored;
  result.meta = build_meta(o, described, base, t, stride, result.scored, resumed);
  result.label = fmt::format("{} {} {} M={}", base.model, base.task, base.padding, o.modulus);
  write_sweep_outputs(o.out_dir, result.label, result.summary, result.meta);
  if (o.out) {
    *o.out << terminal_table(result.summary, result.label);
    *o.out << fmt::format(
        "records: {} scored now, {} resumed, {} errors, {} censored; shortcut ceiling {:.3f}\n"
        "wrote {}/{{results.jsonl, summary.json, phase.csv, phase.svg, report.html}}\n",
        result.scored, resumed, t.errors, t.censored, result.meta["shortcut_ceiling"].get<double>(),
        o.out_dir);
  }
  return result;
}

}  // namespace phasekv
