// What an audit's run cost and how its transport fared, written where a user checks a bill: the
// transport's counts, the server's own token usage (and its cost at --price-per-mtok) and the
// scoring time in audit.json, the closing lines on the terminal, and audit.json itself. The
// timing is read back by the next run's plan (cost.h) to estimate its time.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "audit/options.h"
#include "backend/http_client.h"
#include "eval/runner.h"

namespace phasekv {

// Retries so far, for the runner's progress lines.
std::function<std::string()> retries_note(const HttpBackend& http);

// audit.json's "transport", "usage" and "timing" after `run`: called after the last request of
// the run (the sample prompts' included), so the counts are the run's.
void add_run_accounting(nlohmann::json& audit, const HttpBackend& http, const RunResult& run,
                        const std::string& price_per_mtok);

// OUT/audit.json, replaced atomically.
void write_audit_json(const std::string& out, nlohmann::json audit);

// The closing lines: requests and retries, the server's usage, its cost, and the rate limits met.
void print_run_totals(const AuditOptions& a, const HttpBackend& http, const nlohmann::json& audit,
                      double seconds);

}  // namespace phasekv
