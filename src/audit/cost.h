// What an audit will send, known before its first scoring request: the items still to score,
// their requests and tokens, the longest prompt against the server's context, and the estimated
// cost and time. A prompt that cannot fit is refused here, before anything is paid for; --dry-run
// and --plan stop after printing this.
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "audit/options.h"
#include "backend/http_client.h"
#include "backend/http_cost.h"

namespace phasekv {

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

// Items of the grid that have no successful record in OUT/results.jsonl (read only).
int64_t pending_items(const std::string& out, int examples, int modulus,
                      const std::vector<std::string>& conditions = {""});

// Refuses, before any scoring request, an audit whose longest prompt does not fit the server's
// context by the dialect's rule; never truncates. `knobs` names the flags that shorten prompts.
void check_budget(const HttpBackend& http, const AuditPlan& p, const std::string& knobs);

// Prices the plan (--price-per-mtok), records it as audit.json "plan" and prints it: to stderr
// before a run, to stdout for --dry-run (with --plan, the examples a --min-gap dip needs).
void print_audit_plan(const AuditOptions& a, AuditPlan& p, const HttpBackend& http,
                      nlohmann::json& audit);

}  // namespace phasekv
