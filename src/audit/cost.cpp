#include "audit/cost.h"

#include <fmt/format.h>

#include <filesystem>
#include <iostream>
#include <set>
#include <tuple>

#include "eval/plan.h"
#include "eval/results_file.h"
#include "util/duration.h"
#include "util/error.h"
#include "util/fs.h"

namespace phasekv {

using json = nlohmann::json;
namespace fs = std::filesystem;

namespace {

// The plan in audit.json, with its cost when prices were given.
json plan_json(const AuditPlan& p) {
  json j = {{"items", p.items},
            {"pending", p.pending},
            {"requests", p.pending * p.requests_per_item},
            {"prompt_tokens", p.prompt_tokens},
            {"generated_tokens", p.generated_tokens},
            {"longest_prompt", p.longest_prompt},
            {"filler_repeats", p.filler_repeats}};
  if (p.prices) j["estimated_cost"] = token_cost(*p.prices, p.prompt_tokens, 0, p.generated_tokens);
  return j;
}

std::string plan_text(const AuditPlan& p, const HttpBackend& http, const std::string& out) {
  std::string t = fmt::format(
      "plan: {} of {} items to score ({} already in {}/results.jsonl)\n"
      "  requests: {} ({}) + {} made so far to discover the server and build the prompts\n"
      "  prompt tokens: {} (longest prompt {} tokens, example {}), generated tokens: {}\n",
      p.pending, p.items, p.items - p.pending, out, p.pending * p.requests_per_item,
      p.requests_note, http.stats().requests, p.prompt_tokens, p.longest_prompt, p.longest_example,
      p.generated_tokens);
  if (p.filler_repeats > 0)
    t += fmt::format(
        "  filler: {} of {} items' documents are longer than the filler corpus, so their filler "
        "repeats (a larger --filler manifest: data/filler/vim-manual.json)\n",
        p.filler_repeats, p.items);
  if (p.prices)
    t += fmt::format(
        "  cost: about {:.4f} at {} in / {} out per million tokens (the plan's prompt and "
        "generated tokens; the server's prefix cache can only lower it)\n",
        token_cost(*p.prices, p.prompt_tokens, 0, p.generated_tokens), p.prices->input_per_mtok,
        p.prices->output_per_mtok);
  const auto limit = http.context_limit();
  t += limit ? fmt::format("  context: {} tokens ({}), at most {} per prompt\n", limit->tokens,
                           limit->source, http.max_prompt(p.new_tokens))
             : std::string("  context: unknown (the server reports none; --max-context)\n");
  // The rate of the last run into this directory, when it recorded one.
  double rate = 0;
  const fs::path prior = fs::path(out) / "audit.json";
  if (fs::exists(prior)) {
    const json j = read_json_file(prior.string());
    if (j.contains("timing") && j["timing"].value("items_per_s", 0.0) > 0)
      rate = j["timing"]["items_per_s"].get<double>();
  }
  t += rate > 0 ? fmt::format("  time: about {} at the last run's {:.1f} items/s ({}/audit.json)\n",
                              format_duration(static_cast<double>(p.pending) / rate), rate, out)
                : std::string(
                      "  time: unknown until the first requests (the progress line's "
                      "ETA is measured from them)\n");
  return t;
}

}  // namespace

int64_t pending_items(const std::string& out, int examples, int modulus,
                      const std::vector<std::string>& conditions) {
  const fs::path path = fs::path(out) / "results.jsonl";
  const int64_t all =
      static_cast<int64_t>(examples) * modulus * static_cast<int64_t>(conditions.size());
  if (!fs::exists(path)) return all;
  const std::set<std::string> wanted(conditions.begin(), conditions.end());
  std::set<std::tuple<std::string, int64_t, int>> done;
  for (const auto& r : read_results(path.string()).records)
    if (r.ok() && wanted.count(r.condition) && r.example_id >= 0 && r.example_id < examples &&
        r.phase >= 0 && r.phase < modulus)
      done.insert({r.condition, r.example_id, r.phase});
  return all - static_cast<int64_t>(done.size());
}

void check_budget(const HttpBackend& http, const AuditPlan& p, const std::string& knobs) {
  const auto limit = http.context_limit();
  const json d = http.describe();
  if (!limit) {
    std::cerr << fmt::format(
        "audit: the server reports no context size; prompts of up to {} tokens are sent "
        "unchecked (give --max-context N to check them before sending)\n",
        p.longest_prompt);
    return;
  }
  const int64_t room = http.max_prompt(p.new_tokens);
  if (p.longest_prompt <= room) return;
  throw Error(fmt::format(
      "the audit does not fit the server's context, so nothing was scored: its longest prompt "
      "(example {}) has {} tokens and {} generated token{} follow, but the context size is {} "
      "tokens ({}), and by the {} rule ({}) a prompt may have at most {} tokens; lower {}, or "
      "give --max-context if the server's limit is larger than it reports",
      p.longest_example, p.longest_prompt, p.new_tokens, p.new_tokens == 1 ? "" : "s",
      limit->tokens, limit->source, d["dialect"].get<std::string>(),
      d["context_limit"]["rule"].get<std::string>(), room, knobs));
}

void print_audit_plan(const AuditOptions& a, AuditPlan& p, const HttpBackend& http, json& audit) {
  if (!a.price_per_mtok.empty())
    p.prices = parse_token_prices(a.price_per_mtok, "--price-per-mtok");
  audit["plan"] = plan_json(p);
  if (!a.dry_run) {
    std::cerr << plan_text(p, http, a.out);
    return;
  }
  std::cout << plan_text(p, http, a.out);
  if (a.plan) {  // the examples a --min-gap dip needs, priced at this audit's tokens per item
    const int64_t per_item = p.pending > 0 ? p.prompt_tokens / p.pending : p.longest_prompt;
    const PlanRequest r =
        plan_request_for(a.modulus, a.stride, a.min_gap_pp > 0 ? a.min_gap_pp : 10.0);
    std::cout << plan_text(plan_examples(r), per_item);
  }
  std::cout << "dry run: nothing was scored and nothing was written\n";
}

}  // namespace phasekv
