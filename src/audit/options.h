// What `phasekv audit` is asked to do (docs/AUDIT.md): the settings its flags fill
// (cli/cmd_audit.cpp), checked before anything is sent, and the HTTP backend they open. The
// library takes a filled AuditOptions and knows no CLI; its messages still name the flags, since
// they are what the user typed.
#pragma once
#include <cstdint>
#include <string>

#include "backend/http_client.h"
#include "eval/sla_gate.h"
#include "task/tasks.h"

namespace phasekv {

// The flag of the text's lengths, as its messages name it: it has two names, and the user typed
// one of them.
inline constexpr const char* kContextFlag = "--context-len";

struct AuditOptions {
  std::string endpoint, model;  // the server's URL; the served model's name (GET /v1/models)
  // The HTTP flags every server command shares (cli/http_options.h: dialect, concurrency, timeout,
  // retries and their backoff, give-up time, API key variable, top_n, max_context, prefix cache),
  // and audit's own that are fields of the backend (--max-total-retries, --max-retry-after-s,
  // --request-cache). The struct's defaults are audit's. Endpoint, model, mode, api, the chat
  // settings and --fixed-concurrency are filled from the fields below (audit_backend_options).
  HttpBackendOptions http;
  bool fixed_concurrency = false;  // --fixed-concurrency: keep --concurrency on 429s
  std::string mode = "logprob", task = "kv";
  std::string api = "completions";
  std::string render = "auto", task_config, padding = "prefix", out;
  int modulus = 24, examples = 50, stride = 0;
  uint64_t seed = 0;
  int records = 8, bootstrap = 2000, permutations = 1000, needles = 1;
  std::string context_tokens = "512", depths, filler;
  bool dry_run = false;
  std::string price_per_mtok, chat_template, reasoning;
  int max_tokens = 0;
  int max_stride = 0;  // --max-stride: the largest stride the blind audit must resolve
  int log_samples = 0;
  double min_gap_pp = 0;  // --min-gap: the verdict says whether this n could find such a gap
  bool plan = false;      // --plan: the examples needed (eval/plan.h), after the dry run's cost
  SlaGate sla;
};

// Throws phasekv::Error naming the flag and what is allowed for the first setting out of range;
// called before the server is contacted.
void validate_audit_options(const AuditOptions& a);

// The backend's options: the shared HTTP group with the audit's endpoint, model, scoring mode,
// API and chat settings.
HttpBackendOptions audit_backend_options(const AuditOptions& a);

PaddingMode audit_padding(const AuditOptions& a);

}  // namespace phasekv
