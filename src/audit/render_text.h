// The text rendering of an audit (--render text): a model with a real tokenizer. The key-value
// records are rendered as text, tokenized piecewise by the server, spliced as ids and verified
// against the server's tokenizer (backend/http_text_task.h); with --api chat the prompt is the
// chat template's rendering of one user message, phases counted in the templated tokens, and
// generated answers are read after any reasoning. A grid of document lengths and depths
// (--context-tokens LIST, --depths) and several needles (--needles N) each become conditions of
// one run (eval/text_audit.h), pooled for the verdict and tabled one by one (tables.h).
#pragma once
#include <nlohmann/json.hpp>
#include <optional>

#include "audit/options.h"
#include "backend/http_client.h"
#include "eval/stats.h"

namespace phasekv {

// Plans, runs and reports the text audit, filling `audit` (audit.json) and writing the report
// files. nullopt after --dry-run, which sends no scoring request.
std::optional<PhaseSummary> audit_text(const AuditOptions& a, HttpBackend& http,
                                       nlohmann::json& audit);

}  // namespace phasekv
