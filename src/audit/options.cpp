#include "audit/options.h"

#include <fmt/format.h>

#include "backend/http_chat.h"
#include "backend/http_cost.h"
#include "eval/sweep.h"
#include "task/doc_grid.h"
#include "util/error.h"

namespace phasekv {

PaddingMode audit_padding(const AuditOptions& a) {
  return padding_mode_from_string(a.padding, "--padding");
}

HttpBackendOptions audit_backend_options(const AuditOptions& a) {
  HttpBackendOptions o = a.http;
  o.endpoint = a.endpoint;
  o.model = a.model;
  o.mode = score_mode_from_string(a.mode);
  o.api = api_from_string(a.api);
  o.adaptive_concurrency = !a.fixed_concurrency;
  o.chat_template_file = a.chat_template;
  o.reasoning = a.reasoning;
  return o;
}

void validate_audit_options(const AuditOptions& a) {
  if (a.modulus < 2) throw Error("--modulus must be >= 2 (phases 0..M-1)");
  if (!(a.min_gap_pp >= 0 && a.min_gap_pp <= 100))
    throw Error(fmt::format("--min-gap {} pp must lie in (0, 100] (0: off)", a.min_gap_pp));
  if (a.plan && a.modulus < 4)
    throw Error(
        fmt::format("--plan needs --modulus >= 4 (is {}): a period needs two "
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
  if (a.http.max_context < 0)
    throw Error(fmt::format("--max-context is {} (allowed: >= 1, or 0 = the server's)",
                            a.http.max_context));
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
    throw Error(
        fmt::format("--needles is {} (allowed: 1..--n-records = {})", a.needles, a.records));
  validate_sla(a.sla);
}

}  // namespace phasekv
