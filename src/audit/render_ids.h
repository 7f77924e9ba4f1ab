// The ids rendering of an audit (--render ids): a phasekv-served synthetic model, whose
// /v1/models card publishes its training task, is swept over the sweep's own examples in
// token-id space through run_sweep, so its records equal an in-process `phasekv sweep` of the
// same examples. With --api chat each context goes through the chat endpoint as a message the
// server's template renders into exactly those ids (backend/http_chat.h); the run is otherwise
// the same.
#pragma once
#include <nlohmann/json.hpp>
#include <optional>

#include "audit/options.h"
#include "backend/http_client.h"
#include "eval/stats.h"
#include "task/tasks.h"

namespace phasekv {

// Plans, runs and reports the audit of `task` (the served one), filling `audit` (audit.json) and
// writing the sweep's files. nullopt after --dry-run, which sends no scoring request.
std::optional<PhaseSummary> audit_ids(const AuditOptions& a, HttpBackend& http, TaskConfig task,
                                      nlohmann::json& audit);

}  // namespace phasekv
