#include "audit/render_text.h"

#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "audit/accounting.h"
#include "audit/cost.h"
#include "audit/period_report.h"
#include "audit/samples.h"
#include "audit/tables.h"
#include "eval/plan.h"
#include "eval/runner.h"
#include "eval/text_audit.h"
#include "report/report.h"
#include "task/doc_grid.h"
#include "task/filler_corpus.h"
#include "util/error.h"

namespace phasekv {

using json = nlohmann::json;

namespace {

// Chat generation budget when the model may reason first (--max-tokens overrides it).
constexpr int kDefaultReasoningBudget = 1024;

// The long-document grid: one task per (length, depth) cell, and one runner cell per (grid cell,
// needle). The runner's cells point into `tasks`.
struct TextGrid {
  std::vector<DocCell> cells;
  std::vector<std::unique_ptr<TextKvTask>> tasks;
  std::vector<TextAuditCell> mode_cells;
  // The records' conditions of each grid cell: one per needle.
  std::vector<std::vector<std::string>> cell_conditions;
};

// The records' flags that the report warns about, counted over the latest records.
struct RecordFlags {
  int64_t mismatched = 0;    // the key lands elsewhere when the text is re-tokenized
  int64_t invalid_utf8 = 0;  // the answer was not valid UTF-8
  int64_t missing = 0;       // the reasoning used the whole budget: no answer came
  int64_t repeated = 0;      // the document wrapped around the filler corpus
};

// Each cell on its own, and all cells pooled.
struct CellTallies {
  Tally pooled;
  std::vector<Tally> per_cell;  // the grid's cell order
  json cell_rows = json::array();
};

// A text audit's summary with what its verdict needs: the outcomes planned, and the shortcut of
// the text task (a guess among the document's --records values, 1/records, reached without
// reading any key).
PhaseSummary text_summary(const std::vector<PhaseOutcome>& outcomes, const AuditOptions& a,
                          const SummaryOptions& stats, int64_t planned) {
  PhaseSummary s = summarize(outcomes, a.modulus, a.stride, stats);
  s.planned_outcomes = planned;
  s.shortcut = 1.0 / std::max(1, a.records);
  attach_sensitivity(s, a.min_gap_pp, 2, stats.seed);
  return s;
}

// The settings every cell's prompts share, the chat template's frame (learned from a probe
// message) and the natural filler (checked against its manifest, tokenized once) included.
TextTaskOptions text_task_options(const AuditOptions& a, HttpBackend& http, json& audit) {
  TextTaskOptions to;
  to.records = a.records;
  to.modulus = a.modulus;
  to.padding = audit_padding(a);
  to.seed = a.seed;
  if (a.api == "chat") {  // the template's tokens around a message, learned from probe messages
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
  to.needles = a.needles;
  return to;
}

TextGrid text_grid(const AuditOptions& a, HttpBackend& http, std::vector<DocCell> cells,
                   const TextTaskOptions& to) {
  const TextTokenizerFns tokenizer{
      [&](const std::vector<std::string>& t, bool special) {
        return http.tokenize_many(t, special);
      },
      [&](const std::vector<std::vector<int32_t>>& ids) { return http.detokenize_many(ids); }};
  TextGrid g;
  g.cells = std::move(cells);
  for (const auto& c : g.cells) {
    TextTaskOptions co = to;
    co.context_tokens = c.context_tokens;
    co.depth = c.depth_pct < 0 ? -1 : c.depth_pct / 100;
    g.tasks.push_back(std::make_unique<TextKvTask>(tokenizer, co));
    g.cell_conditions.emplace_back();
    for (int n = 0; n < a.needles; ++n) {
      const std::string condition = needle_condition(c.condition, n, a.needles);
      g.mode_cells.push_back({condition, g.tasks.back().get(), n});
      g.cell_conditions.back().push_back(condition);
    }
  }
  return g;
}

EvalRecord text_identity(const AuditOptions& a, const HttpBackend& http,
                         const TextTaskOptions& to) {
  EvalRecord identity;
  identity.model = http.model_id();
  identity.task = "text-kv";
  identity.seed = a.seed;
  identity.modulus = a.modulus;
  identity.padding = to_string(to.padding);
  return identity;
}

TextAuditOptions text_mode_options(const AuditOptions& a) {
  TextAuditOptions mo;
  mo.examples = a.examples;
  mo.modulus = a.modulus;
  mo.generate = a.mode == "generate";
  mo.concurrency = a.http.concurrency;
  mo.chat = a.api == "chat";
  mo.reasoning = a.reasoning;
  // A chat model may reason before it answers (some do by default): without reasoning off, the
  // budget leaves room for it.
  mo.max_tokens = a.max_tokens > 0                                 ? a.max_tokens
                  : mo.chat && mo.generate && a.reasoning != "off" ? kDefaultReasoningBudget
                                                                   : 0;
  return mo;
}

// The prompts are built (tokenize requests, no scoring) to learn their lengths.
AuditPlan text_plan(const AuditOptions& a, const HttpBackend& http, TextAuditMode& mode,
                    const TextGrid& g, const TextAuditOptions& mo) {
  const bool chat = mo.chat;
  const TextAuditPlan tp = mode.plan(mode.items());
  std::vector<std::string> conditions;
  for (const auto& c : g.mode_cells) conditions.push_back(c.condition);
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
  return plan;
}

// Each cell on its own, and all cells pooled (each cell's examples are other documents, so
// they count as other clusters) for the period, the report files and the gate.
CellTallies tally_cells(const AuditOptions& a, const TextGrid& g, const RunResult& run,
                        const SummaryOptions& stats) {
  CellTallies c;
  const auto& cells = g.cells;
  const auto& cell_conditions = g.cell_conditions;
  for (size_t i = 0; i < cells.size(); ++i) {
    const Tally& t = c.per_cell.emplace_back(tally(run, cell_conditions[i], a.modulus));
    require_every_phase(t, run.path);
    if (cells.size() > 1)
      c.cell_rows.push_back(
          cell_json(cells[i], cell_conditions[i].front(),
                    text_summary(t.outcomes, a, stats,
                                 static_cast<int64_t>(a.examples) * a.modulus *
                                     static_cast<int64_t>(cell_conditions[i].size())),
                    t, run));
    for (PhaseOutcome o : t.outcomes) {
      o.example_id += static_cast<int64_t>(i) * a.examples;
      c.pooled.outcomes.push_back(o);
    }
    c.pooled.errors += t.errors;
    c.pooled.censored += t.censored;
  }
  return c;
}

RecordFlags count_flags(const RunResult& run) {
  RecordFlags f;
  for (const auto& [key, r] : run.latest) {
    f.mismatched += r.extra.value("position_ok", true) ? 0 : 1;
    f.repeated += r.extra.value("filler_repeats", false) ? 1 : 0;
    f.invalid_utf8 += r.extra.value("output_invalid_utf8", false) ? 1 : 0;
    f.missing += r.extra.value("answer_missing", false) ? 1 : 0;
  }
  return f;
}

// audit.json's task, tables and records (without the period and the accounting).
void fill_text_audit_json(const AuditOptions& a, const TextGrid& g, const CellTallies& c,
                          const RunResult& run, const RecordFlags& f, const SummaryOptions& stats,
                          json& audit) {
  const auto& cells = g.cells;
  const Tally& t = c.pooled;
  audit["render"] = "text";
  audit["task"] = g.tasks.front()->describe();
  if (a.needles > 1)
    audit["needles"] = needle_rows(g.cell_conditions, run, a.examples, a.modulus, a.stride, stats);
  if (cells.size() > 1) {
    audit["task"]["context_len"] = parse_token_list(a.context_tokens, kContextFlag);
    audit["task"]["depths_pct"] = parse_depths(a.depths, "--depths");
    audit["cells"] = c.cell_rows;
    audit["lengths"] = length_rows(cells, c.per_cell, a.examples, a.modulus, a.stride, stats);
  } else if (cells.front().depth_pct >= 0) {
    audit["task"]["depth_pct"] = cells.front().depth_pct;
  }
  audit["records"] = {{"outcomes", static_cast<int64_t>(t.outcomes.size())},
                      {"scored_this_run", run.scored},
                      {"resumed", run.resumed},
                      {"errors", t.errors},
                      {"censored", t.censored},
                      {"position_mismatches", f.mismatched},
                      {"output_invalid_utf8", f.invalid_utf8},
                      {"answers_missing", f.missing},
                      {"filler_repeats", f.repeated}};
}

// The printed report after the files are written: the phase table and verdict, the grid's and
// needles' tables, the warnings, and the period.
void print_text_report(const AuditOptions& a, const TextGrid& g, const PhaseSummary& summary,
                       const std::string& label, const RecordFlags& f, int new_tokens,
                       const json& audit) {
  std::cout << terminal_table(summary, label) << phase_verdict(summary).text() << "\n";
  if (g.cells.size() > 1) std::cout << grid_text(audit["cells"]) << length_text(audit["lengths"]);
  if (a.needles > 1) std::cout << needle_text(audit["needles"]);
  if (f.mismatched > 0)
    std::cout << fmt::format(
        "warning: {} records have a key position that differs from the plan when their text is "
        "re-tokenized by the server (position_ok false in results.jsonl); the ids sent are "
        "exact, but the same text would put the key elsewhere\n",
        f.mismatched);
  if (f.repeated > 0)
    std::cout << fmt::format(
        "warning: {} records have documents longer than the --filler corpus ({} sentences): "
        "their filler wrapped around and repeats (filler_repeats in results.jsonl); use a larger "
        "corpus for such lengths\n",
        f.repeated, audit.value("filler", json::object()).value("sentences", 0));
  if (f.missing > 0)
    std::cout << fmt::format(
        "warning: {} answers never came: the reasoning used the whole budget of {} tokens "
        "(answer_missing in results.jsonl; they count as wrong); raise --max-tokens\n",
        f.missing, new_tokens);
  std::cout << period_text(audit["period"]);
}

// After the run: the statistics, audit.json, the sample prompts, the report files and the
// printed report.
PhaseSummary report_text(const AuditOptions& a, HttpBackend& http, const TextGrid& g,
                         const EvalRecord& identity, const TextAuditOptions& mo,
                         const AuditPlan& plan, const RunResult& run, json& audit) {
  SummaryOptions stats;
  stats.bootstrap_reps = a.bootstrap;
  stats.permutations = a.permutations;
  const CellTallies c = tally_cells(a, g, run, stats);
  const PhaseSummary summary = text_summary(c.pooled.outcomes, a, stats, run.items);
  const std::string label =
      fmt::format("{} text-kv {} M={}", identity.model, identity.padding, a.modulus);
  const RecordFlags f = count_flags(run);
  fill_text_audit_json(a, g, c, run, f, stats, audit);
  if (mo.chat && mo.generate) audit["generation_budget"] = plan.new_tokens;
  audit["period"] = period_report(c.pooled.outcomes, summary, stats);
  write_samples(a, http, run, g.mode_cells.front().condition,
                [&](const std::vector<std::pair<int64_t, int>>& pairs) {
                  std::vector<std::vector<int32_t>> out;
                  for (auto& item : g.tasks.front()->build(pairs))
                    out.push_back(std::move(item.tokens));
                  return out;
                });
  add_run_accounting(audit, http, run, a.price_per_mtok);
  write_sweep_outputs(a.out, label, summary, audit);
  write_audit_json(a.out, audit);
  print_text_report(a, g, summary, label, f, plan.new_tokens, audit);
  return summary;
}

}  // namespace

std::optional<PhaseSummary> audit_text(const AuditOptions& a, HttpBackend& http, json& audit) {
  if (a.task != "kv") throw Error("--task passkey needs a phasekv-served model (render ids)");
  std::vector<DocCell> cells = doc_grid(parse_token_list(a.context_tokens, kContextFlag),
                                        parse_depths(a.depths, "--depths"));
  const TextTaskOptions to = text_task_options(a, http, audit);
  const TextGrid g = text_grid(a, http, std::move(cells), to);
  const EvalRecord identity = text_identity(a, http, to);
  const TextAuditOptions mo = text_mode_options(a);
  TextAuditMode mode(g.mode_cells, identity, mo);
  AuditPlan plan = text_plan(a, http, mode, g, mo);
  check_budget(http, plan, "--context-len, --n-records or --modulus");
  print_audit_plan(a, plan, http, audit);
  if (a.dry_run) return std::nullopt;
  RunOptions ro;
  ro.out_dir = a.out;
  ro.label = "audit";
  ro.progress = &std::cerr;
  ro.progress_note = retries_note(http);
  const RunResult run = run_items(http, mode, ro);
  return report_text(a, http, g, identity, mo, plan, run, audit);
}

}  // namespace phasekv
