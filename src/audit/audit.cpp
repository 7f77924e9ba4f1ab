#include "audit/audit.h"

#include <fmt/format.h>

#include <chrono>
#include <filesystem>
#include <iostream>
#include <nlohmann/json.hpp>

#include "audit/accounting.h"
#include "audit/render_ids.h"
#include "audit/render_text.h"
#include "backend/http_client.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The task of a phasekv-served model: --task-config FILE, else the server's model card.
std::optional<TaskConfig> served_task(const AuditOptions& a, const HttpBackend& b) {
  if (!a.task_config.empty())
    return task_config_from_json(read_json_file(a.task_config), a.task_config);
  const json& card = b.model_card();
  if (card.contains("phasekv") && card["phasekv"].is_object() && card["phasekv"].contains("task") &&
      card["phasekv"]["task"].is_object())
    return task_config_from_json(card["phasekv"]["task"], "/v1/models phasekv.task");
  return std::nullopt;
}

// Records carry no API, so a chat audit resumed into a completions audit's directory (or the
// reverse) would mix two measurements in one summary; audit.json says which one a directory holds.
void check_same_api(const AuditOptions& a) {
  const fs::path file = fs::path(a.out) / "audit.json";
  if (!fs::exists(file)) return;
  const json prior = read_json_file(file.string());
  const std::string api = prior.contains("backend") && prior["backend"].contains("api")
                              ? prior["backend"]["api"].get<std::string>()
                              : "completions";
  if (api != a.api)
    throw Error("--out " + a.out + " holds a " + api + " audit (audit.json); a --api " + a.api +
                " audit needs its own --out");
}

}  // namespace

std::optional<AuditResult> run_audit(const AuditOptions& a) {
  validate_audit_options(a);
  check_same_api(a);
  const auto started = std::chrono::steady_clock::now();
  auto http = HttpBackend::open(audit_backend_options(a));
  const json described = http->describe();
  std::cerr << fmt::format(
      "audit: {} model '{}' dialect {} ({}), prefix cache {}\n",
      described["endpoint"].get<std::string>(), a.model, described["dialect"].get<std::string>(),
      described["dialect_source"].get<std::string>(), described["prefix_cache"].get<std::string>());
  json audit = {
      {"backend", described}, {"examples", a.examples},
      {"modulus", a.modulus}, {"stride_given", a.stride > 0 ? json(a.stride) : json(nullptr)},
      {"seed", a.seed},       {"padding", a.padding}};
  const auto task = served_task(a, *http);
  const bool ids = a.render == "ids" || (a.render == "auto" && task);
  if (ids && !task)
    throw Error("--render ids: the server publishes no phasekv task; give --task-config FILE");
  const std::optional<PhaseSummary> done =
      ids ? audit_ids(a, *http, *task, audit) : audit_text(a, *http, audit);
  if (!done) return std::nullopt;  // --dry-run
  const double secs =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  print_run_totals(a, *http, audit, secs);
  // Error records are left out of the statistics: a finished audit with some of them is not a
  // clean result, and the caller must be able to tell (a rerun retries exactly those items).
  return AuditResult{*done, audit["records"].value("errors", int64_t{0})};
}

}  // namespace phasekv
