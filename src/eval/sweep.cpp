#include "eval/sweep.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <ostream>
#include <thread>
#include <utility>

#include "eval/mitigations.h"
#include "eval/plan.h"
#include "task/prompt_edits.h"
#include "util/error.h"
#include "util/hash.h"

namespace phasekv {
namespace {

using json = nlohmann::json;

// ---------------------------------------------------------------------------------------------
// Validation: everything that can be checked before a file is touched.

int meta_int(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_number_integer() ? j[key].get<int>() : 0;
}

std::string meta_string(const json& j, const char* key) {
  return j.is_object() && j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : "";
}

void validate_options(const SweepOptions& o) {
  check_phase_grid(o.examples, o.modulus, "--examples", "--modulus");
  if (o.batch < 1) throw Error("--batch is " + std::to_string(o.batch) + " (allowed: >= 1)");
  if (o.stride < 0)
    throw Error("--stride is " + std::to_string(o.stride) + " (allowed: >= 1, or 0 = the model's)");
  if (o.padding != PaddingMode::kPrefix && o.padding != PaddingMode::kInSequence)
    throw Error("unknown padding mode (allowed: prefix, in_sequence)");
  if (o.task.kind != TaskKind::kKv && o.task.kind != TaskKind::kPasskey &&
      o.task.kind != TaskKind::kLookup)
    throw Error("unknown task (allowed: kv, passkey, lookup)");
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

// What one item sends: the context materialized at `phase`, with the recent copy when asked,
// and one request per ensemble shift (shift 0 first: that context itself).
struct ItemRequests {
  TaskExample example;  // what the record reports: the unshifted context
  std::vector<ScoreRequest> requests;
};

ItemRequests item_requests(const LogicalExample& lg, const SweepOptions& o, int phase,
                           const std::vector<int>& shifts) {
  ItemRequests out{materialize_request(lg, o, phase), {}};
  if (o.recent_copy) out.example = with_recent_copy(std::move(out.example));
  for (int s : shifts)
    out.requests.push_back(
        {s == 0 ? out.example.tokens : shifted_context(lg, out.example.tokens, s),
         out.example.target().answer});
  return out;
}

// Every example of a sweep has the same length (it depends on the modulus and the mitigations
// only), so example 0 decides whether the sweep fits the model.
void check_fits(Backend& backend, const json& described, const SweepOptions& o) {
  const ItemRequests item = item_requests(make_logical_example(o.task, o.seed, 0), o, 0,
                                          ensemble_shifts(o, backend.model_stride()));
  const int64_t plain = static_cast<int64_t>(item.example.tokens.size()) - (o.recent_copy ? 2 : 0);
  int64_t len = 0;
  for (const auto& r : item.requests) len = std::max<int64_t>(len, r.context.size());
  if (len > backend.max_context())
    throw Error(fmt::format(
        "context of {} tokens exceeds the model's max_context {} (the task's context_len {} "
        "without the answer, plus {} padding tokens for modulus {}{}); lower the modulus or the "
        "task's context_len",
        len, backend.max_context(), o.task.context_len, plain - (o.task.context_len - 1),
        o.modulus,
        len > plain ? fmt::format(", plus {} tokens of --ensemble / --recent-copy", len - plain)
                    : ""));
  const int vocab = meta_int(described, "vocab_size");
  const int task_vocab_size = task_vocab(o.task).vocab_size();
  if (vocab > 0 && task_vocab_size > vocab)
    throw Error(fmt::format(
        "the task's vocabulary has {} tokens but the model's vocab_size is {} (the task config "
        "must be the one the model was trained on)",
        task_vocab_size, vocab));
}

// The fields every record of one sweep shares.
EvalRecord record_template(Backend& backend, const json& described, const SweepOptions& o) {
  EvalRecord r;
  r.model = backend.model_id();
  r.config_hash = meta_string(o.model_meta, "config_hash");
  if (r.config_hash.empty()) r.config_hash = meta_string(described, "config_hash");
  r.task = to_string(o.task.kind);
  r.seed = o.seed;
  r.modulus = o.modulus;
  r.padding = to_string(o.padding);
  return r;
}

// The stride the statistics use, and where it came from.
std::pair<int, std::string> choose_stride(const SweepOptions& o, const Backend& backend,
                                          std::ostream* progress) {
  if (o.stride > 0) return {o.stride, "option"};
  const int s = backend.model_stride();
  if (s <= 0) return {0, "unknown"};
  if (o.modulus % s != 0) {
    // Only a warning before issue 20: a sweep ran to the end without the split nobody asked to
    // lose. Now the caller must say so with --stride.
    if (!o.stride_given)
      throw Error(fmt::format(
          "--modulus {} is not a multiple of the model's stride {}: the phase r = p mod M would "
          "not determine p mod S (allowed: a multiple of {}, e.g. {}; or give --stride "
          "explicitly, --stride 0 = no interior/boundary split)",
          o.modulus, s, s, 2 * s));
    if (progress)
      *progress << fmt::format(
          "warning: the model's stride {} does not divide the modulus {}; no interior/boundary "
          "split (use a multiple of {})\n",
          s, o.modulus, s);
    return {0, fmt::format("model stride {} does not divide the modulus", s)};
  }
  return {s, "model"};
}

json build_meta(const SweepOptions& o, const json& described, int model_stride,
                const EvalRecord& base, const Tally& t, const std::pair<int, std::string>& stride,
                const RunResult& run) {
  json meta = o.model_meta.is_object() ? o.model_meta : json::object();
  if (!o.model_meta.is_null() && !o.model_meta.is_object()) meta["model"] = o.model_meta;
  meta["model_id"] = base.model;
  meta["config_hash"] = base.config_hash;
  meta["backend"] = described;
  meta["sweep"] = {{"task", task_config_to_json(o.task)},
                   {"condition", mitigation_condition(o)},
                   {"ensemble", o.ensemble},
                   {"ensemble_shifts", ensemble_shifts(o, model_stride)},
                   {"recent_copy", o.recent_copy},
                   {"examples", o.examples},
                   {"modulus", o.modulus},
                   {"padding", base.padding},
                   {"seed", o.seed},
                   {"stride", stride.first > 0 ? json(stride.first) : json(nullptr)},
                   {"stride_source", stride.second},
                   {"batch", o.batch},
                   {"results", "results.jsonl"}};
  meta["records"] = {{"outcomes", static_cast<int64_t>(t.outcomes.size())},
                     {"scored_this_run", run.scored},
                     {"resumed", run.resumed},
                     {"errors", t.errors},
                     {"censored", t.censored},
                     {"ignored_beyond_examples", run.ignored},
                     {"scoring_seconds", run.seconds}};
  if (!t.first_error.empty()) meta["records"]["first_error"] = t.first_error;
  meta["mean_target_logprob_by_phase"] = t.mean_logprob_by_phase;
  meta["shortcut_ceiling"] = shortcut_ceiling(o.task, o.seed, o.examples);  // also in the summary
  return meta;
}

}  // namespace

void check_phase_grid(int examples, int modulus, const std::string& examples_key,
                      const std::string& modulus_key) {
  if (examples < 1 || examples > kMaxExamples)
    throw Error(fmt::format("{} is {} (allowed: 1..{})", examples_key, examples, kMaxExamples));
  if (modulus < 1 || modulus > kMaxModulus)
    throw Error(fmt::format("{} is {} (allowed: 1..{}; a multiple of the stride, e.g. 8 for S = 4)",
                            modulus_key, modulus, kMaxModulus));
  const int64_t items = static_cast<int64_t>(examples) * modulus;
  if (items > kMaxItems)
    throw Error(fmt::format("{} x {} is {} items (allowed: at most {}; split the sweep)",
                            examples_key, modulus_key, items, kMaxItems));
}

// ---------------------------------------------------------------------------------------------
// The sweep as an evaluation mode: items in condition, then example order, so that a batch
// materializes each logical example once.

SweepMode::SweepMode(const SweepOptions& o, EvalRecord identity,
                     std::vector<std::string> conditions, Scorer scorer, Extra extra)
    : o_(o),
      identity_(std::move(identity)),
      conditions_(std::move(conditions)),
      scorer_(std::move(scorer)),
      extra_(std::move(extra)) {
  if (conditions_.empty()) throw Error("internal: a sweep mode without conditions");
  if (scorer_ && o_.ensemble > 1)
    throw Error("internal: phase ensembling scores through the backend, not a mode's scorer");
}

std::vector<EvalItem> SweepMode::items() const {
  std::vector<EvalItem> out;
  out.reserve(conditions_.size() * static_cast<size_t>(o_.examples) *
              static_cast<size_t>(o_.modulus));
  for (const auto& c : conditions_)
    for (int64_t e = 0; e < o_.examples; ++e)
      for (int r = 0; r < o_.modulus; ++r) out.push_back({c, e, r});
  return out;
}

std::vector<EvalRecord> SweepMode::evaluate(Backend& backend, const std::vector<EvalItem>& batch) {
  const std::vector<int> shifts =
      o_.ensemble > 1 ? ensemble_shifts(o_, backend.model_stride()) : std::vector<int>{0};
  std::vector<EvalRecord> out;
  for (size_t lo = 0, hi = 0; lo < batch.size(); lo = hi) {
    const std::string& condition = batch[lo].condition;
    while (hi < batch.size() && batch[hi].condition == condition) ++hi;
    std::vector<TaskExample> examples;
    std::vector<ScoreRequest> requests;  // shifts.size() per example
    for (size_t i = lo; i < hi; ++i) {
      const EvalItem& item = batch[i];
      if (!lg_ || static_cast<int64_t>(lg_->id) != item.example_id)
        lg_ = make_logical_example(o_.task, o_.seed, static_cast<uint64_t>(item.example_id));
      ItemRequests ir = item_requests(*lg_, o_, item.phase, shifts);
      examples.push_back(std::move(ir.example));
      requests.insert(requests.end(), ir.requests.begin(), ir.requests.end());
    }
    const std::vector<ScoreResult> results =
        scorer_            ? scorer_(backend, condition, requests)
        : shifts.size() > 1 ? score_ensemble(backend, requests, shifts.size())
                            : backend.score(requests);
    if (results.size() != examples.size())
      throw Error(fmt::format("backend {} returned {} results for {} items", identity_.model,
                              results.size(), examples.size()));
    for (size_t i = 0; i < results.size(); ++i)
      out.push_back(record(condition, examples[i], results[i]));
  }
  return out;
}

EvalRecord SweepMode::record(const std::string& condition, const TaskExample& ex,
                             const ScoreResult& res) const {
  EvalRecord r = identity_;
  const TaskQuery& t = ex.target();
  r.condition = condition;
  r.example_id = static_cast<int64_t>(ex.logical_id);
  r.phase = ex.phase;
  r.key_pos = t.key_pos;
  r.value_pos = t.value_pos;
  r.query_pos = t.query_pos;
  r.target = t.answer;
  if (extra_) {
    json e = extra_(condition);
    if (e.is_object()) r.extra = std::move(e);
  }
  if (o_.record_prompt_hash) {
    r.extra["prompt_tokens"] = ex.tokens.size();
    r.extra["prompt_ids_fnv1a64"] = prompt_ids_hash(ex.tokens);
  }
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

EvalRecord prepare_sweep(Backend& backend, const SweepOptions& o, json* described_out) {
  validate_options(o);
  const json described = backend.describe();
  check_fits(backend, described, o);  // validates the mitigations too
  if (described_out) *described_out = described;
  return record_template(backend, described, o);
}

int sweep_stride(Backend& backend, const SweepOptions& o) {
  return choose_stride(o, backend, nullptr).first;
}

SweepResult run_sweep(Backend& backend, const SweepOptions& o) {
  json described;
  const EvalRecord identity = prepare_sweep(backend, o, &described);
  const auto stride = choose_stride(o, backend, o.progress);

  const std::string condition = mitigation_condition(o);
  SweepMode mode(o, identity, {condition});
  RunOptions ro;
  ro.out_dir = o.out_dir;
  ro.label = o.progress_label;
  ro.progress = o.progress;
  ro.progress_note = o.progress_note;
  SweepResult result;
  result.run = run_items(backend, mode, ro);

  const Tally t = tally(result.run, condition, o.modulus);
  require_every_phase(t, result.run.path);
  result.summary = summarize(t.outcomes, o.modulus, stride.first, o.stats);
  result.summary.planned_outcomes = result.run.items;
  result.summary.shortcut = shortcut_ceiling(o.task, o.seed, o.examples);
  attach_sensitivity(result.summary, o.min_gap_pp,
                     static_cast<int>(std::max(1u, std::thread::hardware_concurrency())),
                     o.stats.seed);
  result.scored = result.run.scored;
  result.resumed = result.run.resumed;
  result.errors = t.errors;
  result.censored = t.censored;
  result.meta = build_meta(o, described, backend.model_stride(), identity, t, stride, result.run);
  result.label = fmt::format("{} {} {} M={}{}", identity.model, identity.task, identity.padding,
                             o.modulus, condition.empty() ? "" : " " + condition);
  return result;
}

std::string sweep_records_line(const SweepResult& r) {
  return fmt::format(
      "records: {} scored now, {} resumed, {} errors, {} censored; shortcut ceiling {:.3f}\n",
      r.scored, r.resumed, r.errors, r.censored, r.meta["shortcut_ceiling"].get<double>());
}

int auto_batch(int64_t context_tokens) {
  const int64_t fit = kAutoBatchTokens / std::max<int64_t>(1, context_tokens);
  return static_cast<int>(std::clamp<int64_t>(fit, 1, 64));
}

}  // namespace phasekv
