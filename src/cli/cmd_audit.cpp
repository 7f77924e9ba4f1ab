// `phasekv audit`: the flags of a served model's audit (src/audit/audit.h, docs/AUDIT.md), and
// its exit status: the SLA gate, then the items that ended as errors.
#include <fmt/format.h>

#include <algorithm>
#include <iostream>
#include <memory>
#include <optional>

#include "audit/audit.h"
#include "cli/commands.h"
#include "cli/http_options.h"
#include "cli/path_options.h"

namespace phasekv::cli {
namespace {

void run(const AuditOptions& a) {
  const std::optional<AuditResult> done = run_audit(a);
  if (!done) return;  // --dry-run
  enforce_sla(a.sla, done->summary);
  // Error records are left out of the statistics: a finished audit with some of them is not a
  // clean result, and a script must be able to tell (a rerun retries exactly those items).
  if (done->errors > 0) {
    std::cout << fmt::format(
        "audit: {} items ended as errors and are not in the statistics (see 'error' in {}/"
        "results.jsonl); rerun the same command to retry them (exit {})\n",
        done->errors, a.out, kAuditErrorsExit);
    throw AuditHadErrors{};
  }
}

}  // namespace

void register_audit(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "audit", "measure a served model's phase sensitivity over an OpenAI-compatible API");
  auto a = std::make_shared<AuditOptions>();
  cmd->add_option("--endpoint", a->endpoint, "server URL, e.g. http://127.0.0.1:8000")->required();
  cmd->add_option("--model", a->model, "served model name (GET /v1/models)")->required();
  cmd->add_option("--out", a->out, "output directory (an existing results.jsonl is resumed)")
      ->required()
      ->check(output_dir());
  auto* modulus = cmd->add_option("--modulus", a->modulus, "M: phases r = key position mod M");
  cmd->add_option("--max-stride", a->max_stride,
                  "the largest stride to resolve blind: periods 2..M/2 are tested from the key "
                  "positions, so this sets --modulus to 2 x K when --modulus is not given "
                  "(default M = 24 resolves strides 2..12)");
  cmd->add_option("--examples", a->examples, "logical examples, each at every phase");
  cmd->add_option("--stride", a->stride, "known stride S for the statistics (0 = unknown)");
  // The flags every command talking to a server shares (cli/http_options.h); audit's own follow.
  add_http_backend_options(cmd, a->http);
  cmd->add_option("--max-total-retries", a->http.max_total_retries,
                  "retries over the whole run before failing fast (429/503 retries while other "
                  "requests are answered do not count)");
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
  cmd->add_flag("--dry-run", a->dry_run,
                "print the plan (requests, tokens, time) after the discovery requests and stop");
  cmd->add_flag("--plan", a->plan,
                "--dry-run, then the examples per phase needed to detect a --min-gap dip (default "
                "10 pp) and to certify a flat model, by simulation, priced in this audit's "
                "tokens (as `phasekv plan`)");
  add_min_gap_option(cmd, a->min_gap_pp);
  cmd->add_option("--max-retry-after-s", a->http.max_retry_after_s,
                  "longest Retry-After (429/503) waited out; longer fails the request");
  cmd->add_option("--request-cache", a->http.request_cache,
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
  add_sla_options(cmd, a->sla);
  cmd->footer(
      "Exit status: 0 done (gate passed, or none asked for); 2 an error; 3 an internal tensor "
      "error; 4 the SLA gate failed; 5 the audit finished but some items ended as errors (no "
      "verdict; a rerun retries them); 6 stopped early, the server answered nothing for "
      "--give-up-after-s (results kept; a rerun resumes); 100 and up a usage error.");
  cmd->callback([a, modulus] {
    if (a->max_stride > 0 && modulus->count() == 0) a->modulus = std::max(a->modulus, 2 * a->max_stride);
    a->dry_run = a->dry_run || a->plan;
    run(*a);
  });
}

}  // namespace phasekv::cli
