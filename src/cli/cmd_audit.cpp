// `phasekv audit`: measure a served model's phase sensitivity over an OpenAI-compatible API
// (docs/AUDIT.md). The stride is usually unknown, so the sweep covers phases 0..M-1 and the
// report gives the detected period with its permutation p-value and the per-phase table for it.
//
// Two renderings of the key-value task:
//   ids   phasekv-served synthetic models (their /v1/models card publishes the training task):
//         the sweep's own examples in token-id space, through run_sweep, so the records equal an
//         in-process `phasekv sweep` of the same examples; with --api chat each context goes
//         through the chat endpoint as a message the server's template renders into exactly
//         those ids (backend/http_chat.h), the same run otherwise;
//   text  real tokenizers: records rendered as text, tokenized piecewise by the server, spliced
//         as ids and verified against the server's tokenizer (http_text_task.h); with --api
//         chat the prompt is the chat template's rendering of one user message, phases counted
//         in the templated tokens, and generated answers are read after any reasoning.
#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <tuple>

#include "backend/http_client.h"
#include "backend/http_cost.h"
#include "backend/http_text_task.h"
#include "cli/commands.h"
#include "cli/path_options.h"
#include "eval/plan.h"
#include "eval/runner.h"
#include "eval/stats.h"
#include "eval/sweep.h"
#include "eval/text_audit.h"
#include "report/report.h"
#include "task/doc_grid.h"
#include "task/filler_corpus.h"
#include "util/duration.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv::cli {
namespace {

using json = nlohmann::json;
namespace fs = std::filesystem;

// The flag of the text's lengths, as its messages name it: it has two names, and the user typed
// one of them.
constexpr const char* kContextFlag = "--context-len/--context-tokens";

// Chat generation budget when the model may reason first (--max-tokens overrides it).
constexpr int kDefaultReasoningBudget = 1024;

struct AuditArgs {
  std::string endpoint, model, dialect = "auto", api_key_env, mode = "logprob", task = "kv";
  std::string api = "completions";
  std::string render = "auto", task_config, padding = "prefix", out;
  int modulus = 24, examples = 50, stride = 0, concurrency = 8, retries = 5, top_n = 20;
  int64_t max_total_retries = 2000, max_context = 0;
  double timeout_s = 60, retry_base_s = 0.25, max_retry_after_s = 120, give_up_after_s = 60;
  uint64_t seed = 0;
  int records = 8, bootstrap = 2000, permutations = 1000, needles = 1;
  std::string context_tokens = "512", depths, filler;
  bool keep_prefix_cache = false, dry_run = false, fixed_concurrency = false;
  std::string request_cache, price_per_mtok, chat_template, reasoning;
  int max_tokens = 0;
  int max_stride = 0;  // --max-stride: the largest stride the blind audit must resolve
  int log_samples = 0;
  double min_gap_pp = 0;  // --min-gap: the verdict says whether this n could find such a gap
  bool plan = false;      // --plan: the examples needed (eval/plan.h), after the dry run's cost
  SlaGate sla;
};

PaddingMode parse_padding(const std::string& s) {
  return padding_mode_from_string(s, "--padding");
}

// Retries so far, for the runner's progress lines.
std::function<std::string()> retries_note(const HttpBackend& http) {
  return [&http] { return "retries " + std::to_string(http.stats().retries); };
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
  const std::vector<int> tried = candidate_periods(s.modulus, s.period.positions_known);
  j["periods_tested"] = tried;
  j["positions"] = s.period.positions_known ? "key_pos" : "phase";
  j["support"] = s.period.detected_support();
  const int P = s.period.detected;
  if (P < 2) return j;
  // Residues of the key position: with positions known P need not divide M.
  std::vector<PhaseOutcome> folded = outcomes;
  for (auto& o : folded)
    o.phase = static_cast<int>((s.period.positions_known ? o.key_pos : o.phase) % P);
  json rows = json::array();
  for (const auto& r : phase_table(folded, P))
    rows.push_back(
        {{"phase", r.r}, {"n", r.n}, {"acc", r.acc}, {"ci_lo", r.ci_lo}, {"ci_hi", r.ci_hi}});
  j["by_residue"] = rows;
  if (s.modulus % P == 0)  // the interior/boundary split needs r mod M to fix p mod P
    j["summary_with_stride_" + std::to_string(P)] =
        summarize(outcomes, s.modulus, P, stats).to_json();
  return j;
}

std::string period_text(const json& p) {
  const auto tried = p["periods_tested"].get<std::vector<int>>();
  const int M = p["modulus"].get<int>();
  const std::string range =
      tried.empty() ? std::string("none")
      : p["positions"] == "key_pos"
          ? fmt::format("every period {}..{} (key positions); a stride above {} needs --modulus "
                        ">= 2 x stride",
                        tried.front(), tried.back(), tried.back())
          : fmt::format("the divisors of {} in [2, {}] only (no key positions)", M, M / 2);
  if (p["detected_period"].is_null())
    return fmt::format("no candidate period: M = {} leaves none to test\n", M);
  std::string t = fmt::format(
      "detected period {} (sign-flip p = {}; detected in {:.0f} % of example resamples){}\n"
      "periods tested: {}\n",
      p["detected_period"].get<int>(), format_p(p["p_value"].get<double>()),
      100.0 * p["support"].get<double>(),
      p["significant"].get<bool>() ? "" : "  -- not significant", range);
  t += fmt::format("per phase r mod {}:\n", p["detected_period"].get<int>());
  for (const auto& r : p["by_residue"])
    t += fmt::format("  r={:<3} n={:<6} acc {:.3f}  [{:.3f}, {:.3f}]\n", r["phase"].get<int>(),
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
          {"http_503", s.http_503},
          {"http_5xx", s.http_5xx},
          {"busy_retries", s.busy_retries},
          {"connection_errors", s.connection_errors},
          {"bad_json", s.bad_json},
          {"retry_after_waits", s.retry_after_waits},
          {"retry_after_wait_s", s.retry_after_wait_s},
          {"concurrency_limit_now", s.concurrency_limit},
          {"concurrency_limit_min", s.min_concurrency_limit},
          {"concurrency_decreases", s.concurrency_decreases},
          {"request_cache_hits", s.cache_hits},
          {"request_cache_stores", s.cache_stores}};
}

json usage_json(const UsageTotals& u, const std::string& prices) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"cached_tokens", u.cached_tokens},
            {"answers_with_usage", u.answers_with_usage},
            {"answers_without_usage", u.answers_without_usage},
            {"answers_from_request_cache", u.answers_from_cache},
            {"scope",
             "this run's scoring and generation answers, as the server counted them "
             "(tokenize/detokenize calls and resumed records not included)"}};
  if (!prices.empty()) {
    const TokenPrices p = parse_token_prices(prices, "--price-per-mtok");
    j["prices"] = prices_json(p);
    j["cost"] = token_cost(p, u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  }
  return j;
}

// What an audit will send, known before the first scoring request.
struct AuditPlan {
  int64_t items = 0, pending = 0;
  int64_t prompt_tokens = 0;     // over the pending items, as the scoring requests carry them
  int64_t generated_tokens = 0;  // requested
  int64_t longest_prompt = 0, longest_example = 0;
  int64_t filler_repeats = 0;     // items whose document repeats its filler (text audits)
  int new_tokens = 1;             // generated per request
  int64_t requests_per_item = 1;  // scoring and checking requests
  std::string requests_note;
  std::optional<TokenPrices> prices;  // --price-per-mtok
};

// The plan in audit.json, with its cost when prices were given.
json plan_json(const AuditPlan& p) {
  json j = {{"items", p.items},
            {"pending", p.pending},
            {"requests", p.pending * p.requests_per_item},
            {"prompt_tokens", p.prompt_tokens},
            {"generated_tokens", p.generated_tokens},
            {"longest_prompt", p.longest_prompt},
            {"filler_repeats", p.filler_repeats}};
  if (p.prices) j["estimated_cost"] = token_cost(*p.prices, p.prompt_tokens, 0, p.generated_tokens);
  return j;
}

// Items of the grid that have no successful record in OUT/results.jsonl (read only).
int64_t pending_items(const std::string& out, int examples, int modulus,
                      const std::vector<std::string>& conditions = {""}) {
  const fs::path path = fs::path(out) / "results.jsonl";
  const int64_t all =
      static_cast<int64_t>(examples) * modulus * static_cast<int64_t>(conditions.size());
  if (!fs::exists(path)) return all;
  const std::set<std::string> wanted(conditions.begin(), conditions.end());
  std::set<std::tuple<std::string, int64_t, int>> done;
  for (const auto& r : read_results(path.string()).records)
    if (r.ok() && wanted.count(r.condition) && r.example_id >= 0 && r.example_id < examples &&
        r.phase >= 0 && r.phase < modulus)
      done.insert({r.condition, r.example_id, r.phase});
  return all - static_cast<int64_t>(done.size());
}

// Refuses, before any scoring request, an audit whose longest prompt does not fit the server's
// context by the dialect's rule; never truncates.
void check_budget(const HttpBackend& http, const AuditPlan& p, const std::string& knobs) {
  const auto limit = http.context_limit();
  const json d = http.describe();
  if (!limit) {
    std::cerr << fmt::format(
        "audit: the server reports no context size; prompts of up to {} tokens are sent "
        "unchecked (give --max-context N to check them before sending)\n",
        p.longest_prompt);
    return;
  }
  const int64_t room = http.max_prompt(p.new_tokens);
  if (p.longest_prompt <= room) return;
  throw Error(fmt::format(
      "the audit does not fit the server's context, so nothing was scored: its longest prompt "
      "(example {}) has {} tokens and {} generated token{} follow, but the context size is {} "
      "tokens ({}), and by the {} rule ({}) a prompt may have at most {} tokens; lower {}, or "
      "give --max-context if the server's limit is larger than it reports",
      p.longest_example, p.longest_prompt, p.new_tokens, p.new_tokens == 1 ? "" : "s",
      limit->tokens, limit->source, d["dialect"].get<std::string>(),
      d["context_limit"]["rule"].get<std::string>(), room, knobs));
}

std::string plan_text(const AuditPlan& p, const HttpBackend& http, const std::string& out) {
  std::string t = fmt::format(
      "plan: {} of {} items to score ({} already in {}/results.jsonl)\n"
      "  requests: {} ({}) + {} made so far to discover the server and build the prompts\n"
      "  prompt tokens: {} (longest prompt {} tokens, example {}), generated tokens: {}\n",
      p.pending, p.items, p.items - p.pending, out, p.pending * p.requests_per_item,
      p.requests_note, http.stats().requests, p.prompt_tokens, p.longest_prompt, p.longest_example,
      p.generated_tokens);
  if (p.filler_repeats > 0)
    t += fmt::format(
        "  filler: {} of {} items' documents are longer than the filler corpus, so their filler "
        "repeats (a larger --filler manifest: data/filler/vim-manual.json)\n",
        p.filler_repeats, p.items);
  if (p.prices)
    t += fmt::format(
        "  cost: about {:.4f} at {} in / {} out per million tokens (the plan's prompt and "
        "generated tokens; the server's prefix cache can only lower it)\n",
        token_cost(*p.prices, p.prompt_tokens, 0, p.generated_tokens), p.prices->input_per_mtok,
        p.prices->output_per_mtok);
  const auto limit = http.context_limit();
  t += limit ? fmt::format("  context: {} tokens ({}), at most {} per prompt\n", limit->tokens,
                           limit->source, http.max_prompt(p.new_tokens))
             : std::string("  context: unknown (the server reports none; --max-context)\n");
  // The rate of the last run into this directory, when it recorded one.
  double rate = 0;
  const fs::path prior = fs::path(out) / "audit.json";
  if (fs::exists(prior)) {
    const json j = read_json_file(prior.string());
    if (j.contains("timing") && j["timing"].value("items_per_s", 0.0) > 0)
      rate = j["timing"]["items_per_s"].get<double>();
  }
  t += rate > 0 ? fmt::format("  time: about {} at the last run's {:.1f} items/s ({}/audit.json)\n",
                              format_duration(static_cast<double>(p.pending) / rate), rate, out)
                : std::string(
                      "  time: unknown until the first requests (the progress line's "
                      "ETA is measured from them)\n");
  return t;
}

void print_plan(const AuditArgs& a, AuditPlan& p, const HttpBackend& http, json& audit) {
  if (!a.price_per_mtok.empty())
    p.prices = parse_token_prices(a.price_per_mtok, "--price-per-mtok");
  audit["plan"] = plan_json(p);
  if (!a.dry_run) {
    std::cerr << plan_text(p, http, a.out);
    return;
  }
  std::cout << plan_text(p, http, a.out);
  if (a.plan) {  // the examples a --min-gap dip needs, priced at this audit's tokens per item
    const int64_t per_item = p.pending > 0 ? p.prompt_tokens / p.pending : p.longest_prompt;
    const PlanRequest r =
        plan_request_for(a.modulus, a.stride, a.min_gap_pp > 0 ? a.min_gap_pp : 10.0);
    std::cout << plan_text(plan_examples(r), per_item);
  }
  std::cout << "dry run: nothing was scored and nothing was written\n";
}

// --log-samples N: up to N items spread evenly over the (example, phase) grid, each with the
// full text of its prompt as the server detokenizes it, written to OUT/samples.jsonl (replaced
// on every run). `prompts` builds the prompts' token ids of the chosen items.
void write_samples(const AuditArgs& a, HttpBackend& http, const RunResult& run,
                   const std::string& condition,
                   const std::function<std::vector<std::vector<int32_t>>(
                       const std::vector<std::pair<int64_t, int>>&)>& prompts) {
  if (a.log_samples <= 0) return;
  const int64_t total = static_cast<int64_t>(a.examples) * a.modulus;
  const int64_t step = std::max<int64_t>(1, total / a.log_samples);
  std::vector<std::pair<int64_t, int>> pairs;
  for (int64_t i = 0; i < total && static_cast<int>(pairs.size()) < a.log_samples; i += step)
    pairs.push_back({i / a.modulus, static_cast<int>(i % a.modulus)});
  const auto ids = prompts(pairs);
  const auto texts = http.detokenize_many(ids);
  std::string lines;
  for (size_t i = 0; i < pairs.size(); ++i) {
    json line = {{"example_id", pairs[i].first},
                 {"phase", pairs[i].second},
                 {"prompt_tokens", ids[i].size()},
                 {"prompt_ids", ids[i]},
                 {"prompt_text", texts[i]}};
    const auto r = run.latest.find(ItemKey{condition, pairs[i].first, pairs[i].second});
    if (r != run.latest.end()) {
      line["key_pos"] = r->second.key_pos;
      line["target"] = r->second.target;
      line["prediction"] = r->second.prediction;
      line["correct"] = r->second.correct;
      if (!r->second.ok()) line["error"] = r->second.error;
    }
    lines += line.dump() + "\n";
  }
  write_file_atomic((fs::path(a.out) / "samples.jsonl").string(), lines);
  std::cerr << fmt::format("audit: wrote {} sample prompts to {}/samples.jsonl\n", pairs.size(),
                           a.out);
}

json timing_json(const RunResult& run) {
  return {{"scoring_seconds", run.seconds},
          {"items_scored", run.scored},
          {"items_per_s", run.seconds > 0 ? static_cast<double>(run.scored) / run.seconds : 0.0}};
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
  o.api = api_from_string(a.api);
  o.top_n = a.top_n;
  o.defeat_prefix_cache = !a.keep_prefix_cache;
  o.max_context = a.max_context;
  o.max_retry_after_s = a.max_retry_after_s;
  o.give_up_after_s = a.give_up_after_s;
  o.adaptive_concurrency = !a.fixed_concurrency;
  o.request_cache = a.request_cache;
  o.chat_template_file = a.chat_template;
  o.reasoning = a.reasoning;
  return o;
}

void validate(const AuditArgs& a) {
  if (a.modulus < 2) throw Error("--modulus must be >= 2 (phases 0..M-1)");
  if (!(a.min_gap_pp >= 0 && a.min_gap_pp <= 100))
    throw Error(fmt::format("--min-gap {} pp must lie in (0, 100] (0: off)", a.min_gap_pp));
  if (a.plan && a.modulus < 4)
    throw Error(fmt::format("--plan needs --modulus >= 4 (is {}): a period needs two "
                            "repetitions of at least 2 phases",
                            a.modulus));
  if (a.max_stride < 0 || (a.max_stride > 0 && 2 * static_cast<int64_t>(a.max_stride) > a.modulus))
    throw Error(fmt::format(
        "--max-stride {} needs --modulus >= {} (a period is resolved from two repetitions within "
        "one example's M phases); leave --modulus out to have it set",
        a.max_stride, 2 * static_cast<int64_t>(a.max_stride)));
  check_phase_grid(a.examples, a.modulus, "--examples", "--modulus");  // before any allocation
  if (a.stride < 0 || (a.stride > 0 && a.modulus % a.stride != 0))
    throw Error(fmt::format("--stride {} must divide --modulus {} (or be 0 = unknown)", a.stride,
                            a.modulus));
  if (a.task != "kv" && a.task != "passkey" && a.task != "lookup")
    throw Error("--task: '" + a.task + "' is not a task (allowed: kv, passkey, lookup)");
  if (a.render != "auto" && a.render != "ids" && a.render != "text")
    throw Error("--render: '" + a.render + "' (allowed: auto, ids, text)");
  if (a.out.empty()) throw Error("--out: no output directory");
  if (a.max_context < 0)
    throw Error(
        fmt::format("--max-context is {} (allowed: >= 1, or 0 = the server's)", a.max_context));
  api_from_string(a.api);
  check_reasoning(a.reasoning);
  if (a.api != "chat" && (!a.chat_template.empty() || !a.reasoning.empty()))
    throw Error("--chat-template and --reasoning apply to chat requests only (--api chat)");
  if (a.mode == "logprob" && !a.reasoning.empty() && a.reasoning != "off")
    throw Error("--reasoning " + a.reasoning +
                " with --mode logprob: the first generated token, the one scored, would be the "
                "reasoning's; use --mode generate (the answer is read after the reasoning)");
  if (a.max_tokens < 0) throw Error("--max-tokens must be >= 0 (0 = the default budget)");
  if (!a.price_per_mtok.empty()) parse_token_prices(a.price_per_mtok, "--price-per-mtok");
  parse_token_list(a.context_tokens, kContextFlag);
  parse_depths(a.depths, "--depths");
  if (a.needles < 1 || a.needles > a.records)
    throw Error(fmt::format("--needles is {} (allowed: 1..--records = {})", a.needles, a.records));
  validate_sla(a.sla);
}

// The task of a phasekv-served model: --task-config FILE, else the server's model card.
std::optional<TaskConfig> served_task(const AuditArgs& a, const HttpBackend& b) {
  if (!a.task_config.empty())
    return task_config_from_json(read_json_file(a.task_config), a.task_config);
  const json& card = b.model_card();
  if (card.contains("phasekv") && card["phasekv"].is_object() && card["phasekv"].contains("task") &&
      card["phasekv"]["task"].is_object())
    return task_config_from_json(card["phasekv"]["task"], "/v1/models phasekv.task");
  return std::nullopt;
}

// Records carry no API, so a chat audit resumed into a completions audit's directory (or the
// reverse) would mix two measurements in one summary; audit.json says which one a directory holds.
void check_same_api(const AuditArgs& a) {
  const fs::path file = fs::path(a.out) / "audit.json";
  if (!fs::exists(file)) return;
  const json prior = read_json_file(file.string());
  const std::string api = prior.contains("backend") && prior["backend"].contains("api")
                              ? prior["backend"]["api"].get<std::string>()
                              : "completions";
  if (api != a.api)
    throw Error("--out " + a.out + " holds a " + api + " audit (audit.json); a --api " + a.api +
                " audit needs its own --out");
}

void write_audit_json(const std::string& out, json audit) {
  write_file_atomic((fs::path(out) / "audit.json").string(), audit.dump(2) + "\n");
}

// ---------------------------------------------------------------------------------------------
// ids: the synthetic task through run_sweep.

std::optional<PhaseSummary> audit_ids(const AuditArgs& a, HttpBackend& http, TaskConfig task,
                                      json& audit) {
  if (!a.filler.empty() || !a.depths.empty() || a.context_tokens != "512" || a.needles != 1)
    throw Error(
        "--filler, --depths, --context-tokens and --needles shape text documents (--render "
        "text); a phasekv model's ids audit takes its lengths and its one target from the "
        "served task");
  // The served task as published, or passkey posed to a kv model (its settings, one needle).
  if (a.task != to_string(task.kind)) {
    if (a.task != "passkey" || task.kind != TaskKind::kKv)
      throw Error("--task " + a.task + ": the served model was trained on " + to_string(task.kind) +
                  " (allowed: --task " + to_string(task.kind) +
                  (task.kind == TaskKind::kKv ? ", passkey)" : ")"));
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
  o.min_gap_pp = a.min_gap_pp;
  o.model_meta = {{"endpoint", http.describe()["endpoint"]}, {"audit", true}};
  o.progress = &std::cerr;
  o.progress_label = "audit";
  o.progress_note = retries_note(http);
  // Every example has the same length: example 0 at phase 0 is the longest prompt.
  AuditPlan plan;
  const bool chat = a.api == "chat";
  o.record_prompt_hash = chat;
  plan.items = static_cast<int64_t>(a.examples) * a.modulus;
  plan.pending = pending_items(a.out, a.examples, a.modulus);
  plan.longest_prompt = static_cast<int64_t>(
      materialize(make_logical_example(task, a.seed, 0), a.modulus, 0, o.padding, false)
          .tokens.size());
  const bool echo = !chat && a.mode == "logprob" && http.dialect() == Dialect::kVllm;
  plan.prompt_tokens = plan.pending * (plan.longest_prompt + (echo ? 1 : 0));
  plan.generated_tokens = plan.pending;
  plan.requests_per_item = chat ? 3 : 1;
  plan.requests_note = chat ? "3 per item: detokenize, render, chat completion" : "1 per item";
  check_budget(http, plan, "--modulus or the task's context_len");
  print_plan(a, plan, http, audit);
  if (a.dry_run) return std::nullopt;
  const SweepResult result = run_sweep(http, o);
  audit["render"] = "ids";
  audit["task"] = task_config_to_json(task);
  audit["records"] = {{"scored_this_run", result.scored},
                      {"resumed", result.resumed},
                      {"errors", result.errors},
                      {"censored", result.censored}};
  audit["period"] =
      period_report(tally(result.run, "", o.modulus).outcomes, result.summary, o.stats);
  write_samples(a, http, result.run, "", [&](const std::vector<std::pair<int64_t, int>>& pairs) {
    std::vector<std::vector<int32_t>> out;
    for (const auto& [e, r] : pairs)
      out.push_back(materialize(make_logical_example(task, a.seed, static_cast<uint64_t>(e)),
                                a.modulus, r, o.padding, false)
                        .tokens);
    return out;
  });
  audit["transport"] = transport_json(http.stats());
  audit["usage"] = usage_json(http.usage(), a.price_per_mtok);
  audit["timing"] = timing_json(result.run);
  write_sweep_outputs(a.out, result.label, result.summary, result.meta);
  write_audit_json(a.out, audit);
  std::cout << terminal_table(result.summary, result.label) << phase_verdict(result.summary).text()
            << "\n"
            << sweep_records_line(result);
  std::cout << period_text(audit["period"]);
  return result.summary;
}

// ---------------------------------------------------------------------------------------------
// text: real tokenizers.

// The phase summary of a set of outcomes as audit.json's "cells" and "needles" rows give it.
json summary_row(const PhaseSummary& s, int64_t outcomes, int64_t errors) {
  return {{"outcomes", outcomes},
          {"errors", errors},
          {"mean_acc", s.mean_acc},
          {"worst_phase", s.worst_phase},
          {"worst_acc", s.worst_acc},
          {"best_phase", s.best_phase},
          {"gap_pp", s.gap_pp},
          {"detected_period", s.period.detected > 0 ? json(s.period.detected) : json(nullptr)},
          {"period_p_value", s.period.p_value}};
}

// One cell of the long-document grid after the run: its phase summary, for audit.json and the
// depth x length table. The measured depth is read from `depth_condition`'s records: the cell's
// own, or with several needles needle 0's (the one placed at the depth).
json cell_json(const DocCell& c, const std::string& depth_condition, const PhaseSummary& s,
               const Tally& t, const RunResult& run) {
  double depth = 0;
  int64_t n = 0;
  for (const auto& [key, r] : run.latest)
    if (r.condition == depth_condition && r.extra.contains("depth_measured")) {
      depth += r.extra["depth_measured"].get<double>();
      ++n;
    }
  json row = {
      {"condition", c.condition},
      {"context_tokens", c.context_tokens},
      {"depth_pct", c.depth_pct < 0 ? json(nullptr) : json(c.depth_pct)},
      {"depth_measured_pct", n > 0 ? json(100.0 * depth / static_cast<double>(n)) : json(nullptr)}};
  row.update(summary_row(s, static_cast<int64_t>(t.outcomes.size()), t.errors));
  return row;
}

// The depth x length table: per cell the worst phase, its accuracy and the gap.
std::string grid_text(const json& cells) {
  std::string t = "depth x length (worst phase: accuracy, gap pp):\n";
  for (const auto& c : cells)
    t +=
        fmt::format("  {:>7} tokens  depth {:>6}  worst r={:<3} {:.3f}  gap {:5.1f}  mean {:.3f}\n",
                    c["context_tokens"].get<int>(),
                    c["depth_pct"].is_null() ? std::string("random")
                                             : fmt::format("{}%", c["depth_pct"].get<double>()),
                    c["worst_phase"].get<int>(), c["worst_acc"].get<double>(),
                    c["gap_pp"].get<double>(), c["mean_acc"].get<double>());
  return t;
}

// Per context length, the outcomes of all its depths pooled (each cell's examples are other
// documents: other clusters): the per-phase accuracy row of each length, for audit.json
// "lengths" and the printed per-phase table. `tallies` is cells' order.
json length_rows(const std::vector<DocCell>& cells, const std::vector<Tally>& tallies,
                 int examples, int modulus, int stride, const SummaryOptions& stats) {
  std::map<int64_t, Tally> by_length;
  for (size_t i = 0; i < cells.size(); ++i)
    for (PhaseOutcome o : tallies[i].outcomes) {
      o.example_id += static_cast<int64_t>(i) * examples;
      by_length[cells[i].context_tokens].outcomes.push_back(o);
    }
  json rows = json::array();
  for (const auto& [length, t] : by_length) {
    const PhaseSummary s = summarize(t.outcomes, modulus, stride, stats);
    json acc = json::array(), n = json::array();
    for (const auto& p : s.phases) {
      acc.push_back(p.acc);
      n.push_back(p.n);
    }
    rows.push_back({{"context_tokens", length},
                    {"phase_acc", acc},
                    {"phase_n", n},
                    {"mean_acc", s.mean_acc},
                    {"worst_phase", s.worst_phase},
                    {"worst_acc", s.worst_acc},
                    {"gap_pp", s.gap_pp}});
  }
  return rows;
}

// The per-phase table per length: one row of accuracies over r = 0 .. M-1 per context length.
std::string length_text(const json& rows) {
  if (rows.empty()) return "";
  std::string t = "per-phase accuracy by context length (all depths pooled):\n   tokens ";
  for (size_t r = 0; r < rows.front()["phase_acc"].size(); ++r) t += fmt::format(" r={:<3}", r);
  t += "\n";
  for (const auto& row : rows) {
    t += fmt::format("  {:>7} ", row["context_tokens"].get<int64_t>());
    for (const auto& acc : row["phase_acc"]) t += fmt::format(" {:5.3f}", acc.get<double>());
    t += "\n";
  }
  return t;
}

// The records' condition of needle n of a grid cell: the cell's own with one needle, else the
// cell's plus "n<needle>" ("n1", "L1024_d50_n1").
std::string needle_condition(const std::string& cell, int needle, int needles) {
  if (needles == 1) return cell;
  return (cell.empty() ? "" : cell + "_") + "n" + std::to_string(needle);
}

// Per needle, every grid cell pooled (a cell's examples are other documents: other clusters):
// audit.json "needles". `cell_conditions[i][n]` is cell i's condition of needle n.
json needle_rows(const std::vector<std::vector<std::string>>& cell_conditions,
                 const RunResult& run, int examples, int modulus, int stride,
                 const SummaryOptions& stats) {
  json rows = json::array();
  const size_t needles = cell_conditions.front().size();
  for (size_t n = 0; n < needles; ++n) {
    std::vector<PhaseOutcome> outcomes;
    int64_t errors = 0;
    for (size_t i = 0; i < cell_conditions.size(); ++i) {
      const Tally t = tally(run, cell_conditions[i][n], modulus);
      errors += t.errors;
      for (PhaseOutcome o : t.outcomes) {
        o.example_id += static_cast<int64_t>(i) * examples;
        outcomes.push_back(o);
      }
    }
    json row = {{"needle", n}};
    row.update(summary_row(summarize(outcomes, modulus, stride, stats),
                           static_cast<int64_t>(outcomes.size()), errors));
    rows.push_back(row);
  }
  return rows;
}

std::string needle_text(const json& rows) {
  std::string t = "per needle (each scored by its own question; all cells pooled):\n";
  for (const auto& r : rows)
    t += fmt::format("  needle {:<2}  mean {:.3f}  worst r={:<3} {:.3f}  gap {:5.1f}  period {}\n",
                     r["needle"].get<int>(), r["mean_acc"].get<double>(),
                     r["worst_phase"].get<int>(), r["worst_acc"].get<double>(),
                     r["gap_pp"].get<double>(),
                     r["detected_period"].is_null()
                         ? std::string("none")
                         : std::to_string(r["detected_period"].get<int>()));
  return t;
}

// A text audit's summary with what its verdict needs: the outcomes planned, and the shortcut of
// the text task (a guess among the document's --records values, 1/records, reached without
// reading any key).
PhaseSummary text_summary(const std::vector<PhaseOutcome>& outcomes, const AuditArgs& a,
                          const SummaryOptions& stats, int64_t planned) {
  PhaseSummary s = summarize(outcomes, a.modulus, a.stride, stats);
  s.planned_outcomes = planned;
  s.shortcut = 1.0 / std::max(1, a.records);
  attach_sensitivity(s, a.min_gap_pp, 2, stats.seed);
  return s;
}

std::optional<PhaseSummary> audit_text(const AuditArgs& a, HttpBackend& http, json& audit) {
  if (a.task != "kv") throw Error("--task passkey needs a phasekv-served model (render ids)");
  const std::vector<DocCell> cells = doc_grid(
      parse_token_list(a.context_tokens, kContextFlag), parse_depths(a.depths, "--depths"));
  TextTaskOptions to;
  to.records = a.records;
  to.modulus = a.modulus;
  to.padding = parse_padding(a.padding);
  to.seed = a.seed;
  const bool chat = a.api == "chat";
  if (chat) {  // the template's tokens around a message, learned from probe messages
    const ChatFrame& frame = http.frame_chat("Hello world");
    to.chat = true;
    to.chat_prefix = frame.prefix;
    to.chat_suffix = frame.suffix;
    audit["backend"] = http.describe();  // with the frame
  }
  if (!a.filler.empty()) {  // natural text, checked against its manifest, tokenized once
    const FillerCorpus corpus = load_filler_corpus(a.filler);
    to.filler = corpus.sentences;
    to.filler_ids = http.tokenize_many(corpus.sentences, false);
    audit["filler"] = corpus.describe();
  }
  const TextTokenizerFns tokenizer{
      [&](const std::vector<std::string>& t, bool special) {
        return http.tokenize_many(t, special);
      },
      [&](const std::vector<std::vector<int32_t>>& ids) { return http.detokenize_many(ids); }};
  to.needles = a.needles;
  std::vector<std::unique_ptr<TextKvTask>> tasks;
  std::vector<TextAuditCell> mode_cells;
  // The records' conditions of each grid cell: one per needle.
  std::vector<std::vector<std::string>> cell_conditions;
  for (const auto& c : cells) {
    TextTaskOptions co = to;
    co.context_tokens = c.context_tokens;
    co.depth = c.depth_pct < 0 ? -1 : c.depth_pct / 100;
    tasks.push_back(std::make_unique<TextKvTask>(tokenizer, co));
    cell_conditions.emplace_back();
    for (int n = 0; n < a.needles; ++n) {
      const std::string condition = needle_condition(c.condition, n, a.needles);
      mode_cells.push_back({condition, tasks.back().get(), n});
      cell_conditions.back().push_back(condition);
    }
  }
  EvalRecord identity;
  identity.model = http.model_id();
  identity.task = "text-kv";
  identity.seed = a.seed;
  identity.modulus = a.modulus;
  identity.padding = to_string(to.padding);
  TextAuditOptions mo;
  mo.examples = a.examples;
  mo.modulus = a.modulus;
  mo.generate = a.mode == "generate";
  mo.concurrency = a.concurrency;
  mo.chat = chat;
  mo.reasoning = a.reasoning;
  // A chat model may reason before it answers (some do by default): without reasoning off, the
  // budget leaves room for it.
  mo.max_tokens = a.max_tokens > 0                              ? a.max_tokens
                  : chat && mo.generate && a.reasoning != "off" ? kDefaultReasoningBudget
                                                                : 0;
  TextAuditMode mode(mode_cells, identity, mo);
  const TextAuditPlan tp = mode.plan(mode.items());
  std::vector<std::string> conditions;
  for (const auto& c : mode_cells) conditions.push_back(c.condition);
  AuditPlan plan;
  plan.items = tp.items;
  plan.pending = pending_items(a.out, a.examples, a.modulus, conditions);
  plan.longest_prompt = tp.longest_prompt;
  plan.longest_example = tp.longest_example;
  plan.filler_repeats = tp.filler_repeats;
  plan.new_tokens = !mo.generate        ? 1
                    : mo.max_tokens > 0 ? mo.max_tokens
                                        : std::max(1, tp.longest_answer);
  const bool echo = !mo.generate && http.dialect() == Dialect::kVllm;
  // Prompt lengths differ between examples: the pending items' share of the whole grid's tokens.
  plan.prompt_tokens =
      static_cast<int64_t>(static_cast<double>(tp.prompt_tokens + (echo ? tp.items : 0)) *
                           plan.pending / std::max<int64_t>(1, tp.items));
  plan.generated_tokens = plan.pending * plan.new_tokens;
  plan.requests_per_item = chat ? 7 : 5;
  plan.requests_note =
      chat ? "per item: 1 chat completion + 2 to render and check the message (detokenize, "
             "render; llama.cpp and --chat-template: + tokenize) + 4 re-tokenization checks"
           : "per item: 1 scoring + 4 re-tokenization checks (detokenize, tokenize)";
  check_budget(http, plan, "--context-tokens, --n-records or --modulus");
  print_plan(a, plan, http, audit);
  if (a.dry_run) return std::nullopt;
  RunOptions ro;
  ro.out_dir = a.out;
  ro.label = "audit";
  ro.progress = &std::cerr;
  ro.progress_note = retries_note(http);
  const RunResult run = run_items(http, mode, ro);

  SummaryOptions stats;
  stats.bootstrap_reps = a.bootstrap;
  stats.permutations = a.permutations;
  // Each cell on its own, and all cells pooled (each cell's examples are other documents, so
  // they count as other clusters) for the period, the report files and the gate.
  Tally pooled;
  json cell_rows = json::array();
  std::vector<Tally> tallies;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Tally& t = tallies.emplace_back(tally(run, cell_conditions[i], a.modulus));
    require_every_phase(t, run.path);
    if (cells.size() > 1)
      cell_rows.push_back(cell_json(
          cells[i], cell_conditions[i].front(),
          text_summary(t.outcomes, a, stats,
                       static_cast<int64_t>(a.examples) * a.modulus *
                           static_cast<int64_t>(cell_conditions[i].size())),
          t, run));
    for (PhaseOutcome o : t.outcomes) {
      o.example_id += static_cast<int64_t>(i) * a.examples;
      pooled.outcomes.push_back(o);
    }
    pooled.errors += t.errors;
    pooled.censored += t.censored;
  }
  const Tally& t = pooled;
  const PhaseSummary summary = text_summary(t.outcomes, a, stats, run.items);
  const std::string label =
      fmt::format("{} text-kv {} M={}", identity.model, identity.padding, a.modulus);
  int64_t mismatched = 0, invalid_utf8 = 0, missing = 0, repeated = 0;
  for (const auto& [key, r] : run.latest) {
    mismatched += r.extra.value("position_ok", true) ? 0 : 1;
    repeated += r.extra.value("filler_repeats", false) ? 1 : 0;
    invalid_utf8 += r.extra.value("output_invalid_utf8", false) ? 1 : 0;
    missing += r.extra.value("answer_missing", false) ? 1 : 0;
  }
  audit["render"] = "text";
  audit["task"] = tasks.front()->describe();
  if (a.needles > 1)
    audit["needles"] = needle_rows(cell_conditions, run, a.examples, a.modulus, a.stride, stats);
  if (cells.size() > 1) {
    audit["task"]["context_tokens"] = parse_token_list(a.context_tokens, kContextFlag);
    audit["task"]["depths_pct"] = parse_depths(a.depths, "--depths");
    audit["cells"] = cell_rows;
    audit["lengths"] = length_rows(cells, tallies, a.examples, a.modulus, a.stride, stats);
  } else if (cells.front().depth_pct >= 0) {
    audit["task"]["depth_pct"] = cells.front().depth_pct;
  }
  audit["records"] = {{"outcomes", static_cast<int64_t>(t.outcomes.size())},
                      {"scored_this_run", run.scored},
                      {"resumed", run.resumed},
                      {"errors", t.errors},
                      {"censored", t.censored},
                      {"position_mismatches", mismatched},
                      {"output_invalid_utf8", invalid_utf8},
                      {"answers_missing", missing},
                      {"filler_repeats", repeated}};
  if (chat && mo.generate) audit["generation_budget"] = plan.new_tokens;
  audit["period"] = period_report(t.outcomes, summary, stats);
  write_samples(a, http, run, mode_cells.front().condition,
                [&](const std::vector<std::pair<int64_t, int>>& pairs) {
                  std::vector<std::vector<int32_t>> out;
                  for (auto& item : tasks.front()->build(pairs))
                    out.push_back(std::move(item.tokens));
                  return out;
                });
  audit["transport"] = transport_json(http.stats());
  audit["usage"] = usage_json(http.usage(), a.price_per_mtok);
  audit["timing"] = timing_json(run);
  write_sweep_outputs(a.out, label, summary, audit);
  write_audit_json(a.out, audit);
  std::cout << terminal_table(summary, label) << phase_verdict(summary).text() << "\n";
  if (cells.size() > 1) std::cout << grid_text(cell_rows) << length_text(audit["lengths"]);
  if (a.needles > 1) std::cout << needle_text(audit["needles"]);
  if (mismatched > 0)
    std::cout << fmt::format(
        "warning: {} records have a key position that differs from the plan when their text is "
        "re-tokenized by the server (position_ok false in results.jsonl); the ids sent are "
        "exact, but the same text would put the key elsewhere\n",
        mismatched);
  if (repeated > 0)
    std::cout << fmt::format(
        "warning: {} records have documents longer than the --filler corpus ({} sentences): "
        "their filler wrapped around and repeats (filler_repeats in results.jsonl); use a larger "
        "corpus for such lengths\n",
        repeated, audit.value("filler", json::object()).value("sentences", 0));
  if (missing > 0)
    std::cout << fmt::format(
        "warning: {} answers never came: the reasoning used the whole budget of {} tokens "
        "(answer_missing in results.jsonl; they count as wrong); raise --max-tokens\n",
        missing, plan.new_tokens);
  std::cout << period_text(audit["period"]);
  return summary;
}

void run_audit(const AuditArgs& a) {
  validate(a);
  check_same_api(a);
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
  const std::optional<PhaseSummary> done =
      ids ? audit_ids(a, *http, *task, audit) : audit_text(a, *http, audit);
  if (!done) return;  // --dry-run
  const PhaseSummary& summary = *done;
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const TransportStats s = http->stats();
  const UsageTotals u = http->usage();
  std::cout << fmt::format(
      "requests {} ({} retries, {} failed for good), {:.1f} s; wrote {}/audit.json\n", s.requests,
      s.retries, s.failed, secs, a.out);
  std::cout << fmt::format(
      "usage (the server's count): {} prompt tokens ({} cached), {} completion tokens over {} "
      "answers{}{}\n",
      u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.answers_with_usage,
      u.answers_without_usage > 0
          ? fmt::format("; {} answers carried no usage", u.answers_without_usage)
          : std::string(),
      u.answers_from_cache > 0
          ? fmt::format("; {} answers from --request-cache (not sent)", u.answers_from_cache)
          : std::string());
  if (!a.price_per_mtok.empty())
    std::cout << fmt::format(
        "cost of that usage: {:.4f} (--price-per-mtok {}; audit.json usage.cost)\n",
        audit["usage"]["cost"].get<double>(), a.price_per_mtok);
  if (s.concurrency_decreases > 0)
    std::cout << fmt::format(
        "rate limits: {} HTTP 429, {} HTTP 503 ({} retried as back-pressure), concurrency lowered "
        "{} times (to {} at least, {} now)\n",
        s.http_429, s.http_503, s.busy_retries, s.concurrency_decreases, s.min_concurrency_limit,
        s.concurrency_limit);
  enforce_sla(a.sla, summary);
  // Error records are left out of the statistics: a finished audit with some of them is not a
  // clean result, and a script must be able to tell (a rerun retries exactly those items).
  const int64_t errors = audit["records"].value("errors", int64_t{0});
  if (errors > 0) {
    std::cout << fmt::format(
        "audit: {} items ended as errors and are not in the statistics (see 'error' in {}/"
        "results.jsonl); rerun the same command to retry them (exit {})\n",
        errors, a.out, kAuditErrorsExit);
    throw AuditHadErrors{};
  }
}

}  // namespace

void register_audit(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "audit", "measure a served model's phase sensitivity over an OpenAI-compatible API");
  auto a = std::make_shared<AuditArgs>();
  cmd->add_option("--endpoint", a->endpoint, "server URL, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--model", a->model, "served model name (GET /v1/models)")->required();
  cmd->add_option("--out", a->out, "output directory (an existing results.jsonl is resumed)")
      ->required()
      ->check(output_dir());
  cmd->add_option("--dialect", a->dialect, "auto|vllm|sglang|llamacpp");
  auto* modulus = cmd->add_option("--modulus", a->modulus, "M: phases r = key position mod M");
  cmd->add_option("--max-stride", a->max_stride,
                  "the largest stride to resolve blind: periods 2..M/2 are tested from the key "
                  "positions, so this sets --modulus to 2 x K when --modulus is not given "
                  "(default M = 24 resolves strides 2..12)");
  cmd->add_option("--examples", a->examples, "logical examples, each at every phase");
  cmd->add_option("--stride", a->stride, "known stride S for the statistics (0 = unknown)");
  cmd->add_option("--concurrency", a->concurrency, "requests in flight");
  cmd->add_option("--timeout-s", a->timeout_s, "per-request timeout in seconds");
  cmd->add_option("--retries", a->retries, "retries per request");
  cmd->add_option("--retry-base-s", a->retry_base_s,
                  "backoff base: retry k waits up to base * 2^k seconds, jittered");
  cmd->add_option("--max-total-retries", a->max_total_retries,
                  "retries over the whole run before failing fast (429/503 retries while other "
                  "requests are answered do not count)");
  cmd->add_option("--give-up-after-s", a->give_up_after_s,
                  "stop the audit (exit 6, resumable) when the server answered nothing for this "
                  "long while every attempt failed; 0 = never");
  cmd->add_option("--api-key-env", a->api_key_env,
                  "environment variable holding the API key (the key is never logged)");
  cmd->add_option("--mode", a->mode, "logprob|generate");
  cmd->add_option("--api", a->api,
                  "completions|chat: score through /v1/completions (token ids) or "
                  "/v1/chat/completions (messages through the server's chat template)");
  cmd->add_option("--task", a->task,
                  "kv|passkey|lookup: the served task (passkey also on a kv model)");
  cmd->add_option("--render", a->render,
                  "auto|ids|text: ids for phasekv synthetic models, text for real tokenizers");
  cmd->add_option("--task-config", a->task_config, "task.json for --render ids");
  cmd->add_option("--padding", a->padding, "prefix|in_sequence (in-sequence is accepted too)");
  cmd->add_option("--seed", a->seed, "names the logical examples")->check(non_negative());
  cmd->add_option("--top-n", a->top_n, "logprobs / n_probs per position");
  cmd->add_option("--n-records,--records", a->records, "text: key-value records per prompt");
  cmd->add_option("--context-len,--context-tokens", a->context_tokens,
                  "text: body length in tokens before padding; a list (1024,4096,...) audits "
                  "each length");
  cmd->add_option("--depths", a->depths,
                  "text: depths of the target record in percent of the document, a list "
                  "(0,50,100), linear:N or sigmoid:N; each length x depth is a cell");
  cmd->add_option("--needles", a->needles,
                  "text: targets per document, each asked by its own question and scored on its "
                  "own (multi-needle; needle 0 takes --depths, the others random places)");
  cmd->add_option("--filler", a->filler,
                  "text: MANIFEST of natural filler text, checked by size and SHA-256 "
                  "(data/filler/debian-licenses.json: Debian's license texts, documents up to "
                  "about 25K tokens; data/filler/vim-manual.json: the Vim manuals, 128K tokens "
                  "and more); default: 8 built-in sentences")
      ->transform(bundled_path());
  cmd->add_option("--max-context", a->max_context,
                  "the server's context size in tokens, instead of what it reports");
  cmd->add_flag("--dry-run", a->dry_run,
                "print the plan (requests, tokens, time) after the discovery requests and stop");
  cmd->add_flag("--plan", a->plan,
                "--dry-run, then the examples per phase needed to detect a --min-gap dip (default "
                "10 pp) and to certify a flat model, by simulation, priced in this audit's "
                "tokens (as `phasekv plan`)");
  add_min_gap_option(cmd, a->min_gap_pp);
  cmd->add_option("--max-retry-after-s", a->max_retry_after_s,
                  "longest Retry-After (429/503) waited out; longer fails the request");
  cmd->add_option("--request-cache", a->request_cache,
                  "DIR: keep every answer, keyed by the exact request, and reuse it on reruns");
  cmd->add_option("--log-samples", a->log_samples,
                  "write the full prompt text of N items spread over the grid to "
                  "OUT/samples.jsonl")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--chat-template", a->chat_template,
                  "FILE: the rendered prompt of one user message with {{content}} where the "
                  "message goes, for servers that cannot render chat messages (--api chat)");
  cmd->add_option("--reasoning", a->reasoning,
                  "on|off|low|medium|high: chat_template_kwargs enable_thinking/thinking, or "
                  "reasoning_effort (--api chat; default: the server's)");
  cmd->add_option("--max-tokens", a->max_tokens,
                  "generation budget per chat request in --mode generate, reasoning included "
                  "(default: the answer's tokens with --reasoning off, else 1024)");
  cmd->add_option("--price-per-mtok", a->price_per_mtok,
                  "IN,OUT[,CACHED]: prices per million prompt, generated (and cached prompt) "
                  "tokens, for a cost estimate in the plan and the cost of the usage in "
                  "audit.json");
  cmd->add_flag("--fixed-concurrency", a->fixed_concurrency,
                "keep --concurrency on 429s (default: halve it, then creep back)");
  cmd->add_option("--bootstrap-reps,--bootstrap", a->bootstrap, "cluster bootstrap replicates");
  cmd->add_option("--permutations", a->permutations,
                  "sign flips of the period test (at least; more while p is small)");
  cmd->add_flag("--keep-prefix-cache", a->keep_prefix_cache,
                "do not salt/disable the server's prefix cache (not recommended)");
  add_sla_options(cmd, a->sla);
  cmd->footer(
      "Exit status: 0 done (gate passed, or none asked for); 2 an error; 3 an internal tensor "
      "error; 4 the SLA gate failed; 5 the audit finished but some items ended as errors (no "
      "verdict; a rerun retries them); 6 stopped early, the server answered nothing for "
      "--give-up-after-s (results kept; a rerun resumes); 100 and up a usage error.");
  cmd->callback([a, modulus] {
    if (a->max_stride > 0 && modulus->count() == 0) a->modulus = std::max(a->modulus, 2 * a->max_stride);
    a->dry_run = a->dry_run || a->plan;
    run_audit(*a);
  });
}

}  // namespace phasekv::cli
