#include "audit/render_ids.h"

#include <algorithm>
#include <iostream>

#include "audit/accounting.h"
#include "audit/cost.h"
#include "audit/period_report.h"
#include "audit/samples.h"
#include "eval/sweep.h"
#include "report/report.h"
#include "util/error.h"

namespace phasekv {

using json = nlohmann::json;

namespace {

// The served task as published, or passkey posed to a kv model (its settings, one needle).
// Refuses the text rendering's document flags: this task has its own lengths and one target.
TaskConfig ids_task(const AuditOptions& a, TaskConfig task) {
  if (!a.filler.empty() || !a.depths.empty() || a.context_tokens != "512" || a.needles != 1)
    throw Error(
        "--filler, --depths, --context-len and --needles shape text documents (--render "
        "text); a phasekv model's ids audit takes its lengths and its one target from the "
        "served task");
  if (a.task != to_string(task.kind)) {
    if (a.task != "passkey" || task.kind != TaskKind::kKv)
      throw Error("--task " + a.task + ": the served model was trained on " + to_string(task.kind) +
                  " (allowed: --task " + to_string(task.kind) +
                  (task.kind == TaskKind::kKv ? ", passkey)" : ")"));
    task.kind = TaskKind::kPasskey;
    task.n_records = 1;
    task.n_queries = 1;
  }
  return task;
}

SweepOptions ids_sweep_options(const AuditOptions& a, const HttpBackend& http,
                               const TaskConfig& task) {
  SweepOptions o;
  o.task = task;
  o.examples = a.examples;
  o.modulus = a.modulus;
  o.padding = audit_padding(a);
  o.seed = a.seed;
  o.stride = a.stride;
  o.out_dir = a.out;
  o.batch = std::max(32, 4 * a.http.concurrency);
  o.stats.bootstrap_reps = a.bootstrap;
  o.stats.permutations = a.permutations;
  o.min_gap_pp = a.min_gap_pp;
  o.model_meta = {{"endpoint", http.describe()["endpoint"]}, {"audit", true}};
  o.progress = &std::cerr;
  o.progress_label = "audit";
  o.progress_note = retries_note(http);
  o.record_prompt_hash = a.api == "chat";
  return o;
}

// Every example has the same length: example 0 at phase 0 is the longest prompt.
AuditPlan ids_plan(const AuditOptions& a, const HttpBackend& http, const SweepOptions& o) {
  AuditPlan plan;
  const bool chat = a.api == "chat";
  plan.items = static_cast<int64_t>(a.examples) * a.modulus;
  plan.pending = pending_items(a.out, a.examples, a.modulus);
  plan.longest_prompt = static_cast<int64_t>(
      materialize(make_logical_example(o.task, a.seed, 0), a.modulus, 0, o.padding, false)
          .tokens.size());
  const bool echo = !chat && a.mode == "logprob" && http.dialect() == Dialect::kVllm;
  plan.prompt_tokens = plan.pending * (plan.longest_prompt + (echo ? 1 : 0));
  plan.generated_tokens = plan.pending;
  plan.requests_per_item = chat ? 3 : 1;
  plan.requests_note = chat ? "3 per item: detokenize, render, chat completion" : "1 per item";
  return plan;
}

// After the sweep: audit.json, the sample prompts, the sweep's files and the printed report.
void report_ids(const AuditOptions& a, HttpBackend& http, const SweepOptions& o,
                const SweepResult& result, json& audit) {
  audit["render"] = "ids";
  audit["task"] = task_config_to_json(o.task);
  audit["records"] = {{"scored_this_run", result.scored},
                      {"resumed", result.resumed},
                      {"errors", result.errors},
                      {"censored", result.censored}};
  audit["period"] =
      period_report(tally(result.run, "", o.modulus).outcomes, result.summary, o.stats);
  write_samples(a, http, result.run, "", [&](const std::vector<std::pair<int64_t, int>>& pairs) {
    std::vector<std::vector<int32_t>> out;
    for (const auto& [e, r] : pairs)
      out.push_back(materialize(make_logical_example(o.task, a.seed, static_cast<uint64_t>(e)),
                                a.modulus, r, o.padding, false)
                        .tokens);
    return out;
  });
  add_run_accounting(audit, http, result.run, a.price_per_mtok);
  write_sweep_outputs(a.out, result.label, result.summary, result.meta);
  write_audit_json(a.out, audit);
  std::cout << terminal_table(result.summary, result.label) << phase_verdict(result.summary).text()
            << "\n"
            << sweep_records_line(result);
  std::cout << period_text(audit["period"]);
}

}  // namespace

std::optional<PhaseSummary> audit_ids(const AuditOptions& a, HttpBackend& http, TaskConfig task,
                                      json& audit) {
  const SweepOptions o = ids_sweep_options(a, http, ids_task(a, std::move(task)));
  AuditPlan plan = ids_plan(a, http, o);
  check_budget(http, plan, "--modulus or the task's context_len");
  print_audit_plan(a, plan, http, audit);
  if (a.dry_run) return std::nullopt;
  const SweepResult result = run_sweep(http, o);
  report_ids(a, http, o, result, audit);
  return result.summary;
}

}  // namespace phasekv
