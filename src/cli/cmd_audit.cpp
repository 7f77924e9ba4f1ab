// `phasekv audit`: measure a served model's phase sensitivity over an OpenAI-compatible API
// (docs/AUDIT.md). The stride is usually unknown, so the sweep covers phases 0..M-1 and the
// report gives the detected period with its permutation p-value and the per-phase table for it.
//
// Two renderings of the key-value task:
//   ids   phasekv-served synthetic models (their /v1/models card publishes the training task):
//         the sweep's own examples in token-id space, through run_sweep, so the records equal an
//         in-process `phasekv sweep` of the same examples;
//   text  real tokenizers: records rendered as text, tokenized piecewise by the server, spliced
//         as ids and verified against the server's tokenizer (http_text_task.h).
#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <set>

#include "backend/http_client.h"
#include "backend/http_text_task.h"
#include "cli/commands.h"
#include "eval/stats.h"
#include "eval/sweep.h"
#include "report/report.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

struct AuditArgs {
  std::string endpoint, model, dialect = "auto", api_key_env, mode = "logprob", task = "kv";
  std::string render = "auto", task_config, padding = "prefix", out;
  int modulus = 24, examples = 50, stride = 0, concurrency = 8, retries = 5, top_n = 20;
  int64_t max_total_retries = 2000, max_context = 0;
  double timeout_s = 60, retry_base_s = 0.25;
  uint64_t seed = 0;
  int records = 8, context_tokens = 512, bootstrap = 2000, permutations = 1000;
  bool keep_prefix_cache = false;
};

PaddingMode parse_padding(const std::string& s) {
  if (s == "prefix") return PaddingMode::kPrefix;
  if (s == "in-sequence" || s == "in_sequence") return PaddingMode::kInSequence;
  throw Error("--padding: '" + s + "' is not a padding mode (allowed: prefix, in-sequence)");
}

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "?";
  const auto t = static_cast<int64_t>(s + 0.5);
  return t >= 3600 ? fmt::format("{}h{:02}m", t / 3600, t / 60 % 60)
                   : fmt::format("{}m{:02}s", t / 60, t % 60);
}

// done/total, requests/s, errors, retries, ETA: one line at most every 2 s, and a last one.
class ProgressLine {
 public:
  ProgressLine(const HttpBackend& http, int64_t total) : http_(http), total_(total) {}
  void add(int64_t done, int64_t errors) {
    done_ += done;
    errors_ += errors;
    const auto now = std::chrono::steady_clock::now();
    if (done_ < total_ && now - last_ < std::chrono::seconds(2)) return;
    last_ = now;
    const double secs = std::chrono::duration<double>(now - start_).count();
    const double rate = secs > 0 ? static_cast<double>(done_) / secs : 0.0;
    const TransportStats s = http_.stats();
    std::cerr << fmt::format(
                     "audit: {}/{} ({:.0f} %)  {:.1f} req/s  errors {}  retries {}  ETA {}\n",
                     done_, total_, total_ ? 100.0 * static_cast<double>(done_) / total_ : 100.0,
                     rate, errors_, s.retries,
                     rate > 0 ? format_duration(static_cast<double>(total_ - done_) / rate)
                              : std::string("?"))
              << std::flush;
  }

 private:
  const HttpBackend& http_;
  int64_t total_, done_ = 0, errors_ = 0;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  std::chrono::steady_clock::time_point last_{};
};

// The HttpBackend as run_sweep sees it, reporting progress after every batch.
class ProgressBackend : public Backend {
 public:
  ProgressBackend(HttpBackend& inner, ProgressLine& line) : inner_(inner), line_(line) {}
  std::string model_id() const override { return inner_.model_id(); }
  std::vector<int32_t> tokenize(const std::string& t) override { return inner_.tokenize(t); }
  std::string detokenize(const std::vector<int32_t>& ids) override {
    return inner_.detokenize(ids);
  }
  std::vector<ScoreResult> score(const std::vector<ScoreRequest>& requests) override {
    auto out = inner_.score(requests);
    int64_t errors = 0;
    for (const auto& r : out) errors += r.error.empty() ? 0 : 1;
    line_.add(static_cast<int64_t>(out.size()), errors);
    return out;
  }
  std::vector<int32_t> generate(const std::vector<int32_t>& c, int n) override {
    return inner_.generate(c, n);
  }
  int64_t max_context() const override { return inner_.max_context(); }
  json describe() const override { return inner_.describe(); }

 private:
  HttpBackend& inner_;
  ProgressLine& line_;
};

// (example, phase) pairs that already have a successful record in OUT/results.jsonl.
std::set<std::pair<int64_t, int>> finished_pairs(const std::string& path, int examples,
                                                 int modulus) {
  std::set<std::pair<int64_t, int>> done;
  if (!fs::exists(path)) return done;
  for (const auto& r : read_results(path).records)
    if (r.error.empty() && r.example_id < examples && r.phase < modulus && r.modulus == modulus)
      done.insert({r.example_id, r.phase});
  return done;
}

// The latest record per pair (a success is never replaced), as run_sweep keeps them.
std::vector<SweepRecord> latest_records(const std::string& path, int examples) {
  std::map<std::pair<int64_t, int>, SweepRecord> latest;
  for (auto& r : read_results(path).records) {
    if (r.example_id >= examples) continue;
    auto it = latest.find({r.example_id, r.phase});
    if (it == latest.end())
      latest.emplace(std::make_pair(r.example_id, r.phase), r);
    else if (!it->second.error.empty())
      it->second = r;
  }
  std::vector<SweepRecord> out;
  for (auto& [key, r] : latest) out.push_back(std::move(r));
  return out;
}

std::vector<PhaseOutcome> outcomes_of(const std::vector<SweepRecord>& records) {
  std::vector<PhaseOutcome> out;
  for (const auto& r : records)
    if (r.error.empty()) out.push_back({r.example_id, r.phase, r.correct});
  return out;
}

// The detected period, its p-value and the per-phase table folded to that period (plus the
// interior/boundary split computed with the period as the stride).
json period_report(const std::vector<PhaseOutcome>& outcomes, const PhaseSummary& s,
                   const SummaryOptions& stats) {
  json j = {{"modulus", s.modulus},
            {"detected_period", s.period.detected > 0 ? json(s.period.detected) : json(nullptr)},
            {"p_value", s.period.p_value},
            {"permutations", s.period.permutations},
            {"significant", s.period.detected > 0 && s.period.p_value < 0.05},
            {"gap_pp", s.gap_pp},
            {"worst_phase", s.worst_phase},
            {"best_phase", s.best_phase}};
  const int P = s.period.detected;
  if (P < 2) return j;
  std::vector<PhaseOutcome> folded = outcomes;
  for (auto& o : folded) o.phase %= P;
  json rows = json::array();
  for (const auto& r : phase_table(folded, P))
    rows.push_back(
        {{"r", r.r}, {"n", r.n}, {"acc", r.acc}, {"ci_lo", r.ci_lo}, {"ci_hi", r.ci_hi}});
  j["by_residue"] = rows;
  j["summary_with_stride_" + std::to_string(P)] =
      summarize(outcomes, s.modulus, P, stats).to_json();
  return j;
}

std::string period_text(const json& p) {
  if (p["detected_period"].is_null()) return "no candidate period (the modulus has no divisor)\n";
  std::string t = fmt::format("detected period {} (permutation p = {}){}\n",
                              p["detected_period"].get<int>(), format_p(p["p_value"].get<double>()),
                              p["significant"].get<bool>() ? "" : "  -- not significant");
  t += fmt::format("per phase r mod {}:\n", p["detected_period"].get<int>());
  for (const auto& r : p["by_residue"])
    t += fmt::format("  r={:<3} n={:<6} acc {:.3f}  [{:.3f}, {:.3f}]\n", r["r"].get<int>(),
                     r["n"].get<int64_t>(), r["acc"].get<double>(), r["ci_lo"].get<double>(),
                     r["ci_hi"].get<double>());
  return t;
}

json transport_json(const TransportStats& s) {
  return {{"requests", s.requests},
          {"attempts", s.attempts},
          {"retries", s.retries},
          {"failed", s.failed},
          {"http_429", s.http_429},
          {"http_5xx", s.http_5xx},
          {"connection_errors", s.connection_errors},
          {"bad_json", s.bad_json}};
}

HttpBackendOptions backend_options(const AuditArgs& a) {
  HttpBackendOptions o;
  o.endpoint = a.endpoint;
  o.model = a.model;
  o.dialect = a.dialect;
  o.concurrency = a.concurrency;
  o.timeout_s = a.timeout_s;
  o.retries = a.retries;
  o.max_total_retries = a.max_total_retries;
  o.retry_base_delay_s = a.retry_base_s;
  o.api_key_env = a.api_key_env;
  o.mode = score_mode_from_string(a.mode);
  o.top_n = a.top_n;
  o.defeat_prefix_cache = !a.keep_prefix_cache;
  o.max_context = a.max_context;
  return o;
}

void validate(const AuditArgs& a) {
  if (a.examples < 1) throw Error("--examples must be >= 1");
  if (a.modulus < 2) throw Error("--modulus must be >= 2 (phases 0..M-1)");
  if (a.stride < 0 || (a.stride > 0 && a.modulus % a.stride != 0))
    throw Error(fmt::format("--stride {} must divide --modulus {} (or be 0 = unknown)", a.stride,
                            a.modulus));
  if (a.task != "kv" && a.task != "passkey")
    throw Error("--task: '" + a.task + "' is not a task (allowed: kv, passkey)");
  if (a.render != "auto" && a.render != "ids" && a.render != "text")
    throw Error("--render: '" + a.render + "' (allowed: auto, ids, text)");
  if (a.out.empty()) throw Error("--out: no output directory");
}

// The task of a phasekv-served model: --task-config FILE, else the server's model card.
std::optional<TaskConfig> served_task(const AuditArgs& a, const HttpBackend& b) {
  if (!a.task_config.empty())
    return task_config_from_json(json::parse(read_file(a.task_config)), a.task_config);
  const json& card = b.model_card();
  if (card.contains("phasekv") && card["phasekv"].is_object() && card["phasekv"].contains("task") &&
      card["phasekv"]["task"].is_object())
    return task_config_from_json(card["phasekv"]["task"], "/v1/models phasekv.task");
  return std::nullopt;
}

void write_audit_json(const std::string& out, json audit) {
  write_file_atomic((fs::path(out) / "audit.json").string(), audit.dump(2) + "\n");
}

// ---------------------------------------------------------------------------------------------
// ids: the synthetic task through run_sweep.

void audit_ids(const AuditArgs& a, HttpBackend& http, TaskConfig task, json audit) {
  if (a.task == "kv" && task.kind != TaskKind::kKv)
    throw Error("--task kv: the served model was trained on passkey (allowed: --task passkey)");
  if (a.task == "passkey" && task.kind != TaskKind::kPasskey) {
    task.kind = TaskKind::kPasskey;
    task.n_records = 1;
    task.n_queries = 1;
  }
  SweepOptions o;
  o.task = task;
  o.examples = a.examples;
  o.modulus = a.modulus;
  o.padding = parse_padding(a.padding);
  o.seed = a.seed;
  o.stride = a.stride;
  o.out_dir = a.out;
  o.batch = std::max(32, 4 * a.concurrency);
  o.stats.bootstrap_reps = a.bootstrap;
  o.stats.permutations = a.permutations;
  o.model_meta = {{"endpoint", http.describe()["endpoint"]}, {"audit", true}};
  o.out = &std::cout;
  const std::string path = (fs::path(a.out) / "results.jsonl").string();
  const auto done = finished_pairs(path, a.examples, a.modulus);
  const int64_t total = static_cast<int64_t>(a.examples) * a.modulus;
  if (!done.empty())
    std::cerr << fmt::format("audit: resuming, {} of {} evaluations already in {}\n", done.size(),
                             total, path);
  ProgressLine line(http, total - static_cast<int64_t>(done.size()));
  ProgressBackend progress(http, line);
  const SweepResult result = run_sweep(progress, o);
  const auto outcomes = outcomes_of(latest_records(path, a.examples));
  audit["render"] = "ids";
  audit["task"] = task_config_to_json(task);
  audit["records"] = {{"scored_this_run", result.scored},
                      {"resumed", result.resumed},
                      {"errors", result.errors},
                      {"censored", result.censored}};
  audit["period"] = period_report(outcomes, result.summary, o.stats);
  audit["transport"] = transport_json(http.stats());
  write_audit_json(a.out, audit);
  std::cout << period_text(audit["period"]);
}

// ---------------------------------------------------------------------------------------------
// text: real tokenizers.

struct TextRecord {
  SweepRecord base;
  TextCheck check;
};

std::string text_line(const TextRecord& r) {
  json j = sweep_record_to_json(r.base);
  j["retokenizes_identically"] = r.check.identical;
  j["measured_key_pos"] = r.check.measured_key_pos;
  j["position_ok"] = r.check.position_ok();
  return j.dump();
}

// An existing results.jsonl must hold this audit (same model, task, seed, modulus, padding).
void check_same_audit(const std::string& path, const SweepRecord& want) {
  if (!fs::exists(path)) return;
  for (const auto& r : read_results(path).records)
    if (r.model != want.model || r.task != want.task || r.seed != want.seed ||
        r.modulus != want.modulus || r.padding != want.padding)
      throw Error(path + " holds a different audit (model '" + r.model + "', task " + r.task +
                  ", seed " + std::to_string(r.seed) + ", modulus " + std::to_string(r.modulus) +
                  ", padding " + r.padding + "); use another --out");
}

TextRecord score_text_item(const SweepRecord& base, const TextItem& it, const TextCheck& check,
                           const ScoreResult* scored, const Generation* generated) {
  TextRecord r{base, check};
  SweepRecord& s = r.base;
  s.example_id = it.example_id;
  s.phase = it.phase;
  s.key_pos = it.key_pos;
  s.value_pos = it.value_pos;
  s.query_pos = it.query_pos;
  s.target = it.target;
  if (scored) {
    s.error = scored->error;
    s.prediction = scored->argmax;
    s.correct = s.error.empty() && scored->argmax == it.target;
    s.censored = scored->censored;
    if (!scored->censored && std::isfinite(scored->target_logprob))
      s.target_logprob = scored->target_logprob;
  } else {
    s.error = generated->error;
    s.prediction = generated->tokens.empty() ? -1 : generated->tokens.front();
    s.correct = s.error.empty() && generated->tokens == it.answer;  // exact match of the value
  }
  return r;
}

void audit_text(const AuditArgs& a, HttpBackend& http, json audit) {
  if (a.task != "kv") throw Error("--task passkey needs a phasekv-served model (render ids)");
  TextTaskOptions to;
  to.records = a.records;
  to.context_tokens = a.context_tokens;
  to.modulus = a.modulus;
  to.padding = parse_padding(a.padding);
  to.seed = a.seed;
  TextKvTask task(
      {[&](const std::vector<std::string>& t, bool special) {
         return http.tokenize_many(t, special);
       },
       [&](const std::vector<std::vector<int32_t>>& ids) { return http.detokenize_many(ids); }},
      to);
  SweepRecord base;
  base.model = http.model_id();
  base.task = "text-kv";
  base.seed = a.seed;
  base.modulus = a.modulus;
  base.padding = to_string(to.padding);
  const std::string path = (fs::path(a.out) / "results.jsonl").string();
  check_same_audit(path, base);
  const auto done = finished_pairs(path, a.examples, a.modulus);
  std::vector<std::pair<int64_t, int>> pending;
  for (int64_t e = 0; e < a.examples; ++e)
    for (int r = 0; r < a.modulus; ++r)
      if (!done.count({e, r})) pending.push_back({e, r});
  if (!done.empty())
    std::cerr << fmt::format("audit: resuming, {} evaluations already in {}\n", done.size(), path);
  fs::create_directories(a.out);
  ProgressLine line(http, static_cast<int64_t>(pending.size()));
  const bool generate = a.mode == "generate";
  int64_t mismatched = 0;
  std::ofstream out(path, std::ios::binary | std::ios::app);
  if (!out) throw Error("cannot open " + path + " for appending");
  // Whole examples per batch (their pieces are tokenized once), at least 4 requests per
  // connection so that one slow request does not idle the others for long.
  const size_t per_example = static_cast<size_t>(a.modulus);
  const size_t batch =
      per_example *
      std::max<size_t>(1, (4 * static_cast<size_t>(a.concurrency) + per_example - 1) / per_example);
  for (size_t start = 0; start < pending.size(); start += batch) {
    const std::vector<std::pair<int64_t, int>> pairs(
        pending.begin() + static_cast<long>(start),
        pending.begin() + static_cast<long>(std::min(pending.size(), start + batch)));
    const auto items = task.build(pairs);
    const auto checks = task.verify(items);
    std::vector<ScoreResult> scored;
    std::vector<Generation> generated;
    if (generate) {
      std::vector<std::vector<int32_t>> contexts;
      size_t longest = 1;
      for (const auto& it : items) {
        contexts.push_back(it.tokens);
        longest = std::max(longest, it.answer.size());
      }
      generated = http.generate_many(contexts, static_cast<int>(longest));
      for (size_t i = 0; i < generated.size(); ++i)
        if (generated[i].tokens.size() > items[i].answer.size())
          generated[i].tokens.resize(items[i].answer.size());
    } else {
      std::vector<ScoreRequest> requests;
      for (const auto& it : items) requests.push_back({it.tokens, it.target});
      scored = http.score(requests);
    }
    std::string lines;
    int64_t errors = 0;
    for (size_t i = 0; i < items.size(); ++i) {
      const TextRecord r =
          score_text_item(base, items[i], checks[i], generate ? nullptr : &scored[i],
                          generate ? &generated[i] : nullptr);
      mismatched += r.check.position_ok() ? 0 : 1;
      errors += r.base.error.empty() ? 0 : 1;
      lines += text_line(r) + "\n";
    }
    out << lines << std::flush;
    if (!out) throw Error("cannot append to " + path + " (disk full?)");
    line.add(static_cast<int64_t>(items.size()), errors);
  }
  out.close();

  const auto records = latest_records(path, a.examples);
  const auto outcomes = outcomes_of(records);
  std::vector<int64_t> per_phase(static_cast<size_t>(a.modulus), 0);
  int64_t errors = 0, censored = 0;
  for (const auto& r : records) {
    if (!r.error.empty()) {
      ++errors;
      continue;
    }
    ++per_phase[static_cast<size_t>(r.phase)];
    censored += r.censored ? 1 : 0;
  }
  for (int p = 0; p < a.modulus; ++p)
    if (per_phase[static_cast<size_t>(p)] == 0)
      throw Error(
          fmt::format("phase {} has no successful record ({} errors); {} keeps what was "
                      "scored: rerun the same command to retry the failed ones",
                      p, errors, path));
  SummaryOptions stats;
  stats.bootstrap_reps = a.bootstrap;
  stats.permutations = a.permutations;
  const PhaseSummary summary = summarize(outcomes, a.modulus, a.stride, stats);
  const std::string label = fmt::format("{} text-kv {} M={}", base.model, base.padding, a.modulus);
  audit["render"] = "text";
  audit["task"] = task.describe();
  audit["records"] = {{"outcomes", static_cast<int64_t>(outcomes.size())},
                      {"errors", errors},
                      {"censored", censored},
                      {"position_mismatches_this_run", mismatched}};
  audit["period"] = period_report(outcomes, summary, stats);
  audit["transport"] = transport_json(http.stats());
  write_sweep_outputs(a.out, label, summary, audit);
  write_audit_json(a.out, audit);
  std::cout << terminal_table(summary, label);
  if (mismatched > 0)
    std::cout << fmt::format(
        "warning: {} records have a key position that differs from the plan when their text is "
        "re-tokenized by the server (position_ok false in results.jsonl); the ids sent are "
        "exact, but the same text would put the key elsewhere\n",
        mismatched);
  std::cout << period_text(audit["period"]);
}

void run_audit(const AuditArgs& a) {
  validate(a);
  const auto started = std::chrono::steady_clock::now();
  auto http = HttpBackend::open(backend_options(a));
  const json described = http->describe();
  std::cerr << fmt::format(
      "audit: {} model '{}' dialect {} ({}), prefix cache {}\n",
      described["endpoint"].get<std::string>(), a.model, described["dialect"].get<std::string>(),
      described["dialect_source"].get<std::string>(), described["prefix_cache"].get<std::string>());
  json audit = {
      {"backend", described}, {"examples", a.examples},
      {"modulus", a.modulus}, {"stride_given", a.stride > 0 ? json(a.stride) : json(nullptr)},
      {"seed", a.seed},       {"padding", a.padding}};
  const auto task = served_task(a, *http);
  const bool ids = a.render == "ids" || (a.render == "auto" && task);
  if (ids && !task)
    throw Error("--render ids: the server publishes no phasekv task; give --task-config FILE");
  if (ids)
    audit_ids(a, *http, *task, audit);
  else
    audit_text(a, *http, audit);
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const TransportStats s = http->stats();
  std::cout << fmt::format(
      "requests {} ({} retries, {} failed for good), {:.1f} s; wrote {}/audit.json\n", s.requests,
      s.retries, s.failed, secs, a.out);
}

}  // namespace

void register_audit(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "audit", "measure a served model's phase sensitivity over an OpenAI-compatible API");
  auto a = std::make_shared<AuditArgs>();
  cmd->add_option("--endpoint", a->endpoint, "server URL, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--model", a->model, "served model name (GET /v1/models)")->required();
  cmd->add_option("--out", a->out, "output directory (an existing results.jsonl is resumed)")
      ->required();
  cmd->add_option("--dialect", a->dialect, "auto|vllm|sglang|llamacpp (default auto)");
  cmd->add_option("--modulus", a->modulus, "M: phases r = key position mod M (default 24)");
  cmd->add_option("--examples", a->examples, "logical examples, each at every phase (default 50)");
  cmd->add_option("--stride", a->stride, "known stride S for the statistics (default: unknown)");
  cmd->add_option("--concurrency", a->concurrency, "requests in flight (default 8)");
  cmd->add_option("--timeout-s", a->timeout_s, "per-request timeout in seconds (default 60)");
  cmd->add_option("--retries", a->retries, "retries per request (default 5)");
  cmd->add_option("--retry-base-s", a->retry_base_s,
                  "backoff base: retry k waits up to base * 2^k seconds, jittered (default 0.25)");
  cmd->add_option("--max-total-retries", a->max_total_retries,
                  "retries over the whole run before failing fast (default 2000)");
  cmd->add_option("--api-key-env", a->api_key_env,
                  "environment variable holding the API key (the key is never logged)");
  cmd->add_option("--mode", a->mode, "logprob|generate (default logprob)");
  cmd->add_option("--task", a->task, "kv|passkey (default kv; passkey needs a phasekv server)");
  cmd->add_option("--render", a->render,
                  "auto|ids|text: ids for phasekv synthetic models, text for real tokenizers");
  cmd->add_option("--task-config", a->task_config, "task.json for --render ids");
  cmd->add_option("--padding", a->padding, "prefix|in-sequence (default prefix)");
  cmd->add_option("--seed", a->seed, "names the logical examples");
  cmd->add_option("--top-n", a->top_n, "logprobs / n_probs per position (default 20)");
  cmd->add_option("--records", a->records, "text: key-value records per prompt (default 8)");
  cmd->add_option("--context-tokens", a->context_tokens,
                  "text: body length in tokens before padding (default 512)");
  cmd->add_option("--max-context", a->max_context, "override the server's context size");
  cmd->add_option("--bootstrap", a->bootstrap, "cluster bootstrap replicates (default 2000)");
  cmd->add_option("--permutations", a->permutations, "permutations of the period test");
  cmd->add_flag("--keep-prefix-cache", a->keep_prefix_cache,
                "do not salt/disable the server's prefix cache (not recommended)");
  cmd->callback([a] { run_audit(*a); });
}

}  // namespace phasekv::cli
