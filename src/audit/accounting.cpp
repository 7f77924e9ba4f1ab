#include "audit/accounting.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>

#include "backend/http_cost.h"
#include "util/fs.h"

namespace phasekv {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

json transport_json(const TransportStats& s) {
  return {{"requests", s.requests},
          {"attempts", s.attempts},
          {"retries", s.retries},
          {"failed", s.failed},
          {"http_429", s.http_429},
          {"http_503", s.http_503},
          {"http_5xx", s.http_5xx},
          {"busy_retries", s.busy_retries},
          {"connection_errors", s.connection_errors},
          {"bad_json", s.bad_json},
          {"retry_after_waits", s.retry_after_waits},
          {"retry_after_wait_s", s.retry_after_wait_s},
          {"concurrency_limit_now", s.concurrency_limit},
          {"concurrency_limit_min", s.min_concurrency_limit},
          {"concurrency_decreases", s.concurrency_decreases},
          {"request_cache_hits", s.cache_hits},
          {"request_cache_stores", s.cache_stores}};
}

json usage_json(const UsageTotals& u, const std::string& prices) {
  json j = {{"prompt_tokens", u.prompt_tokens},
            {"completion_tokens", u.completion_tokens},
            {"cached_tokens", u.cached_tokens},
            {"answers_with_usage", u.answers_with_usage},
            {"answers_without_usage", u.answers_without_usage},
            {"answers_from_request_cache", u.answers_from_cache},
            {"scope",
             "this run's scoring and generation answers, as the server counted them "
             "(tokenize/detokenize calls and resumed records not included)"}};
  if (!prices.empty()) {
    const TokenPrices p = parse_token_prices(prices, "--price-per-mtok");
    j["prices"] = prices_json(p);
    j["cost"] = token_cost(p, u.prompt_tokens, u.cached_tokens, u.completion_tokens);
  }
  return j;
}

json timing_json(const RunResult& run) {
  return {{"scoring_seconds", run.seconds},
          {"items_scored", run.scored},
          {"items_per_s", run.seconds > 0 ? static_cast<double>(run.scored) / run.seconds : 0.0}};
}

}  // namespace

std::function<std::string()> retries_note(const HttpBackend& http) {
  return [&http] { return "retries " + std::to_string(http.stats().retries); };
}

void add_run_accounting(json& audit, const HttpBackend& http, const RunResult& run,
                        const std::string& price_per_mtok) {
  audit["transport"] = transport_json(http.stats());
  audit["usage"] = usage_json(http.usage(), price_per_mtok);
  audit["timing"] = timing_json(run);
}

void write_audit_json(const std::string& out, json audit) {
  write_file_atomic((fs::path(out) / "audit.json").string(), audit.dump(2) + "\n");
}

void print_run_totals(const AuditOptions& a, const HttpBackend& http, const json& audit,
                      double seconds) {
  const TransportStats s = http.stats();
  const UsageTotals u = http.usage();
  std::cout << fmt::format(
      "requests {} ({} retries, {} failed for good), {:.1f} s; wrote {}/audit.json\n", s.requests,
      s.retries, s.failed, seconds, a.out);
  std::cout << fmt::format(
      "usage (the server's count): {} prompt tokens ({} cached), {} completion tokens over {} "
      "answers{}{}\n",
      u.prompt_tokens, u.cached_tokens, u.completion_tokens, u.answers_with_usage,
      u.answers_without_usage > 0
          ? fmt::format("; {} answers carried no usage", u.answers_without_usage)
          : std::string(),
      u.answers_from_cache > 0
          ? fmt::format("; {} answers from --request-cache (not sent)", u.answers_from_cache)
          : std::string());
  if (!a.price_per_mtok.empty())
    std::cout << fmt::format(
        "cost of that usage: {:.4f} (--price-per-mtok {}; audit.json usage.cost)\n",
        audit["usage"]["cost"].get<double>(), a.price_per_mtok);
  if (s.concurrency_decreases > 0)
    std::cout << fmt::format(
        "rate limits: {} HTTP 429, {} HTTP 503 ({} retried as back-pressure), concurrency lowered "
        "{} times (to {} at least, {} now)\n",
        s.http_429, s.http_503, s.busy_retries, s.concurrency_decreases, s.min_concurrency_limit,
        s.concurrency_limit);
}

}  // namespace phasekv
