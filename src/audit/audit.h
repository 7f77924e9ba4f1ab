// `phasekv audit`: measure a served model's phase sensitivity over an OpenAI-compatible API
// (docs/AUDIT.md). The stride is usually unknown, so the sweep covers phases 0..M-1 and the
// report gives the detected period with its permutation p-value and the per-phase table for it
// (period_report.h).
//
// Two renderings of the key-value task:
//   ids   phasekv-served synthetic models (their /v1/models card publishes the training task):
//         the sweep's own examples in token-id space (render_ids.h);
//   text  real tokenizers: records rendered as text, tokenized by the server and verified
//         against it (render_text.h), over a grid of lengths, depths and needles (tables.h).
// Each plans its requests and cost first (cost.h), refuses a prompt that cannot fit, and stops
// there for --dry-run; after the run it writes audit.json with what the run cost (accounting.h).
#pragma once
#include <cstdint>
#include <optional>

#include "audit/options.h"
#include "eval/stats.h"

namespace phasekv {

struct AuditResult {
  PhaseSummary summary;  // every cell pooled: what an SLA gate judges
  int64_t errors = 0;    // items whose latest record is an error (left out of the statistics)
};

// Checks `a`, opens the server, runs (or resumes) the audit into a.out and prints its report and
// closing totals. nullopt after --dry-run. Throws phasekv::Error on a bad setting, a server that
// cannot be used or a plan that does not fit its context; eval/runner.h RunStopped when the
// server stops answering.
std::optional<AuditResult> run_audit(const AuditOptions& a);

}  // namespace phasekv
