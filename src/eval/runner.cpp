#include "eval/runner.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <optional>
#include <ostream>
#include <set>
#include <utility>

#include "util/duration.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {
namespace {

namespace fs = std::filesystem;

// done/total, items/s, errors, the mode's note, ETA: at most one line every 2 s, and a last one.
class ProgressLine {
 public:
  ProgressLine(const RunOptions& o, int64_t total) : o_(o), total_(total) {}
  void add(int64_t done, int64_t errors) {
    done_ += done;
    errors_ += errors;
    if (!o_.progress) return;
    const auto now = std::chrono::steady_clock::now();
    if (done_ < total_ && now - last_ < std::chrono::seconds(2)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
    const std::string note = o_.progress_note ? o_.progress_note() : "";
    *o_.progress << fmt::format(
                        "{}: {}/{} ({:.0f} %)  {:.1f} items/s  errors {}{}{}  ETA {}\n", o_.label,
                        done_, total_, total_ ? 100.0 * static_cast<double>(done_) / total_ : 100.0,
                        rate, errors_, note.empty() ? "" : "  ", note,
                        rate > 0 ? format_duration(static_cast<double>(total_ - done_) / rate)
                                 : std::string("?"))
                 << std::flush;
  }

 private:
  const RunOptions& o_;
  int64_t total_, done_ = 0, errors_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_ = start_;
};

// Latest record per item: a success is never replaced, an error is (a rerun retries it, and the
// file then holds both lines).
void keep(std::map<ItemKey, EvalRecord>& latest, EvalRecord r) {
  const ItemKey key = r.key();
  auto it = latest.find(key);
  if (it == latest.end())
    latest.emplace(key, std::move(r));
  else if (!it->second.ok())
    it->second = std::move(r);
}

void create_out_dir(const std::string& dir) {
  try {
    fs::create_directories(dir);
  } catch (const fs::filesystem_error& e) {
    throw Error("cannot create output directory " + dir + ": " + e.what());
  }
}

// The error of a run whose backend stopped (Backend::stop_reason): why, and what is kept.
RunStopped stopped_run(const Backend& backend, const RunOptions& o, const std::string& path,
                       const std::map<ItemKey, EvalRecord>& latest, int64_t total_items) {
  int64_t done = 0;
  for (const auto& [key, r] : latest) done += r.ok() ? 1 : 0;
  return RunStopped(fmt::format(
      "{} stopped: {}. {} has {} successful records; {} items of this run are still to score: "
      "rerun the same command to resume (exit {})",
      o.label, backend.stop_reason(), path, done, total_items - done, kRunStoppedExit));
}

// Scores `pending` in batches, appending each batch's lines before the next one is scored.
void score_pending(Backend& backend, EvalMode& mode, const RunOptions& o,
                   const std::vector<EvalItem>& pending, const std::string& path,
                   std::map<ItemKey, EvalRecord>& latest, int64_t total_items) {
  AppendFile out(path);  // a failed append (disk full) leaves the records before it whole
  ProgressLine progress(o, static_cast<int64_t>(pending.size()));
  const size_t batch = std::max<size_t>(1, mode.batch_size());
  for (size_t start = 0; start < pending.size(); start += batch) {
    const std::vector<EvalItem> items(
        pending.begin() + static_cast<long>(start),
        pending.begin() + static_cast<long>(std::min(pending.size(), start + batch)));
    std::vector<EvalRecord> records;
    try {
      records = mode.evaluate(backend, items);
    } catch (const std::exception&) {  // e.g. a task's tokenization through a server now down
      if (!backend.stop_reason().empty()) throw stopped_run(backend, o, path, latest, total_items);
      throw;
    }
    if (records.size() != items.size())
      throw Error(fmt::format("internal: the evaluation returned {} records for {} items",
                              records.size(), items.size()));
    // A backend that stopped failed this batch's unfinished items for its own reason, not
    // theirs: those are left unwritten so the file holds only real outcomes.
    const std::string stopped = backend.stop_reason();
    std::string lines;
    int64_t errors = 0, kept = 0;
    for (size_t i = 0; i < records.size(); ++i) {
      if (records[i].key() != items[i].key())
        throw Error("internal: a record came back for another item than asked");
      if (!stopped.empty() && !records[i].ok()) continue;
      lines += record_to_json(records[i]).dump() + "\n";
      errors += records[i].ok() ? 0 : 1;
      ++kept;
      keep(latest, std::move(records[i]));
    }
    out.append(lines);
    progress.add(kept, errors);
    if (!stopped.empty()) throw stopped_run(backend, o, path, latest, total_items);
  }
}

}  // namespace

RunResult run_items(Backend& backend, EvalMode& mode, const RunOptions& o) {
  if (o.out_dir.empty()) throw Error("no output directory given (--out DIR)");
  const DirLock lock(o.out_dir);  // a second sweep or audit into the same --out is refused
  RunResult run;
  run.path = (fs::path(o.out_dir) / "results.jsonl").string();

  // Read and check an earlier run before anything is written.
  std::optional<ResultsFile> existing;
  if (fs::exists(run.path)) {
    existing = read_results(run.path);
    check_same_run(*existing, mode.identity(), run.path);
  }
  const std::vector<EvalItem> items = mode.items();
  run.items = static_cast<int64_t>(items.size());
  std::set<ItemKey> wanted;
  for (const auto& it : items) wanted.insert(it.key());

  std::map<ItemKey, EvalRecord> latest;
  if (existing)
    for (const auto& r : existing->records) {
      if (wanted.count(r.key()))
        keep(latest, r);
      else
        ++run.ignored;
    }
  std::vector<EvalItem> pending;
  for (const auto& it : items) {
    auto found = latest.find(it.key());
    if (found != latest.end() && found->second.ok())
      ++run.resumed;
    else
      pending.push_back(it);
  }

  create_out_dir(o.out_dir);
  if (existing && existing->needs_repair()) {
    repair_results(run.path, *existing);
    run.repaired = true;
    if (o.progress)
      *o.progress << "resume: " << run.path
                  << (existing->dropped_line ? ": dropped a truncated last line\n"
                                             : ": completed the last line\n");
  }
  if (o.progress && run.resumed > 0)
    *o.progress << fmt::format("resume: {} of {} items already in {}\n", run.resumed, run.items,
                               run.path);
  const auto started = std::chrono::steady_clock::now();
  score_pending(backend, mode, o, pending, run.path, latest, run.items);
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  run.scored = static_cast<int64_t>(pending.size());
  run.latest = std::move(latest);
  return run;
}

Tally tally(const RunResult& run, const std::string& condition, int modulus) {
  return tally(run, std::vector<std::string>{condition}, modulus);
}

Tally tally(const RunResult& run, const std::vector<std::string>& conditions, int modulus) {
  Tally t;
  t.per_phase.assign(static_cast<size_t>(modulus), 0);
  std::vector<double> lp_sum(static_cast<size_t>(modulus), 0.0);
  std::vector<int64_t> lp_n(static_cast<size_t>(modulus), 0);
  for (const auto& [key, r] : run.latest) {
    if (r.phase >= modulus ||
        std::find(conditions.begin(), conditions.end(), r.condition) == conditions.end())
      continue;
    if (!r.ok()) {
      if (t.errors++ == 0) t.first_error = r.error;
      continue;
    }
    const auto p = static_cast<size_t>(r.phase);
    t.outcomes.push_back({r.example_id, r.phase, r.correct, r.key_pos});
    ++t.per_phase[p];
    if (r.censored) ++t.censored;
    if (r.target_logprob && std::isfinite(*r.target_logprob)) {
      lp_sum[p] += *r.target_logprob;
      ++lp_n[p];
    }
  }
  for (size_t p = 0; p < lp_sum.size(); ++p)
    t.mean_logprob_by_phase.push_back(lp_n[p]
                                          ? nlohmann::json(lp_sum[p] / static_cast<double>(lp_n[p]))
                                          : nlohmann::json(nullptr));
  return t;
}

void require_every_phase(const Tally& t, const std::string& path) {
  for (size_t p = 0; p < t.per_phase.size(); ++p)
    if (t.per_phase[p] == 0)
      throw Error(fmt::format(
          "phase {} has no successful outcome ({} failed items in all, first: {}); {} keeps "
          "what was scored: rerun the same command to retry the failed ones",
          p, t.errors, t.first_error.empty() ? "-" : t.first_error, path));
}

}  // namespace phasekv
